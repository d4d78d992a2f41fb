//! llama.cpp's reading of a JSON schema, which llama-server's `json_schema` and ollama's
//! `format` follow: their grammar comes from llama.cpp's `json_schema_to_grammar`,
//! which lets an object carry keys beyond its `properties` only when
//! `additionalProperties` is `true` or a schema. JSON Schema (and this server's grammar
//! engine) reads an absent `additionalProperties` as `true`, so a schema written for
//! those servers would let the model add keys; [`close_objects`] writes the `false`
//! they imply.

use std::collections::HashSet;

use serde_json::{Map, Value};

/// `schema` with `"additionalProperties": false` written into every object schema that
/// has `properties` and no `additionalProperties` of its own: at the top, in nested
/// properties, array items, `anyOf`/`oneOf`/`allOf` branches and `$defs`/`definitions`.
///
/// Where subschemas combine into one object (an `allOf` of several branches, or
/// `properties` beside `anyOf`/`oneOf`/`allOf`), closing each part would forbid the
/// others' keys; there the branches stay open and the combining schema is closed to
/// the keys any part names (as llama.cpp merges `allOf` into one object), or left open
/// when a part's keys cannot be listed (a remote `$ref`, a nested combination). A
/// `$defs` entry that such a combination refers to stays open for the same reason.
/// Schemas under `not`, `if`/`then`/`else` are left as they are (closing them could
/// invert their meaning).
pub(crate) fn close_objects(schema: Value) -> Value {
    let mut open_defs = HashSet::new();
    combined_refs(&schema, &mut open_defs);
    let root = schema.clone();
    let mut out = schema;
    close(
        &mut out,
        true,
        &Ctx {
            root: &root,
            open_defs: &open_defs,
        },
    );
    out
}

/// What every step of the walk reads: the schema as given (to resolve `$ref`s) and the
/// `$ref`s that are parts of a combination.
struct Ctx<'a> {
    root: &'a Value,
    open_defs: &'a HashSet<String>,
}

/// Keywords whose value is one subschema.
const ONE: &[&str] = &[
    "additionalProperties",
    "items",
    "additionalItems",
    "contains",
];
/// Keywords whose value is a map of subschemas.
const MAP: &[&str] = &["properties", "patternProperties", "$defs", "definitions"];
/// Keywords whose value is a list of subschemas (`items` in its old tuple form too).
const LIST: &[&str] = &["prefixItems", "items", "anyOf", "oneOf", "allOf"];
/// The keywords that combine subschemas.
const COMBINE: &[&str] = &["anyOf", "oneOf", "allOf"];

/// Whether `o` combines parts into one object: an `allOf` of two or more branches, or
/// `properties` beside a combination.
fn combines(o: &Map<String, Value>) -> bool {
    let branches = |k: &str| o.get(k).and_then(Value::as_array).map_or(0, Vec::len);
    branches("allOf") >= 2
        || (o.contains_key("properties") && COMBINE.iter().any(|k| branches(k) > 0))
}

/// Adds to `out` every `$ref` that is a branch of a combining schema under `v`.
fn combined_refs(v: &Value, out: &mut HashSet<String>) {
    let Some(o) = v.as_object() else {
        return;
    };
    if combines(o) {
        for k in COMBINE {
            for b in o.get(*k).and_then(Value::as_array).into_iter().flatten() {
                if let Some(r) = b.get("$ref").and_then(Value::as_str) {
                    out.insert(r.to_string());
                }
            }
        }
    }
    for_each_sub(v, |s| combined_refs(s, out));
}

/// Calls `f` on each direct subschema of `v` that [`close_objects`] walks into.
fn for_each_sub(v: &Value, mut f: impl FnMut(&Value)) {
    let Some(o) = v.as_object() else {
        return;
    };
    for k in ONE {
        if let Some(s) = o.get(*k).filter(|s| s.is_object()) {
            f(s);
        }
    }
    for k in MAP {
        for s in o
            .get(*k)
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(Map::values)
        {
            f(s);
        }
    }
    for k in LIST {
        for s in o.get(*k).and_then(Value::as_array).into_iter().flatten() {
            f(s);
        }
    }
}

/// Whether `o`'s `type` allows an object (absent, `"object"`, or a list holding it).
fn may_be_object(o: &Map<String, Value>) -> bool {
    match o.get("type") {
        None => true,
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        Some(_) => false,
    }
}

/// The local schema a `$ref` names (`#/$defs/X`, `#/definitions/X`, any JSON pointer
/// into the document), if it is one.
fn resolve<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    root.pointer(r.strip_prefix('#')?)
}

/// The property names of one part of a combination, `None` when they cannot be listed.
fn part_keys<'a>(part: &'a Value, ctx: &Ctx<'a>, depth: usize) -> Option<Vec<&'a String>> {
    let o = part.as_object()?;
    if let Some(r) = o.get("$ref").and_then(Value::as_str) {
        // A chain of `$ref`s is followed a few steps; a cycle is not listable.
        return if depth < 8 {
            part_keys(resolve(ctx.root, r)?, ctx, depth + 1)
        } else {
            None
        };
    }
    if COMBINE.iter().any(|k| o.contains_key(*k)) {
        return None;
    }
    Some(
        o.get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flat_map(Map::keys)
            .collect(),
    )
}

/// Closes `v` (when `close_top`) and walks into its subschemas.
fn close(v: &mut Value, close_top: bool, ctx: &Ctx) {
    let Some(o) = v.as_object() else {
        return;
    };
    let combined = combines(o);
    let closable = !o.contains_key("additionalProperties") && may_be_object(o);
    if close_top && closable && combined {
        close_combined(v, ctx);
    } else if close_top && closable && o.get("properties").is_some_and(Value::is_object) {
        if let Some(o) = v.as_object_mut() {
            o.insert("additionalProperties".into(), Value::Bool(false));
        }
    }
    let Some(o) = v.as_object_mut() else {
        return;
    };
    for k in ONE {
        if let Some(s) = o.get_mut(*k).filter(|s| s.is_object()) {
            close(s, true, ctx);
        }
    }
    for k in MAP {
        let defs = *k == "$defs" || *k == "definitions";
        for (name, s) in o
            .get_mut(*k)
            .and_then(Value::as_object_mut)
            .into_iter()
            .flatten()
        {
            // A definition that is part of a combination stays open at its top.
            let open = defs
                && ctx
                    .open_defs
                    .iter()
                    .any(|r| r.rsplit('/').next() == Some(name.as_str()));
            close(s, !open, ctx);
        }
    }
    for k in LIST {
        let branch_open = combined && COMBINE.contains(k);
        for s in o
            .get_mut(*k)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            close(s, !branch_open, ctx);
        }
    }
}

/// Closes a combining schema to the keys its own `properties` and every part name, by
/// listing each such key with the empty schema (which the parts' own schemas then
/// narrow); leaves it open when a part's keys cannot be listed.
fn close_combined(v: &mut Value, ctx: &Ctx) {
    let Some(o) = v.as_object() else {
        return;
    };
    let mut keys: Vec<String> = Vec::new();
    for k in COMBINE {
        for part in o.get(*k).and_then(Value::as_array).into_iter().flatten() {
            let Some(names) = part_keys(part, ctx, 0) else {
                return;
            };
            keys.extend(names.into_iter().cloned());
        }
    }
    let Some(o) = v.as_object_mut() else {
        return;
    };
    let props = o
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(props) = props.as_object_mut() else {
        return;
    };
    for k in keys {
        props.entry(k).or_insert_with(|| Value::Object(Map::new()));
    }
    o.insert("additionalProperties".into(), Value::Bool(false));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_with_properties_are_closed_wherever_they_nest() {
        let got = close_objects(json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "address": {"type": "object", "properties": {"city": {"type": "string"}}},
                "tags": {"type": "array", "items": {"properties": {"k": {}}}},
                "pair": {"prefixItems": [{"type": "object", "properties": {"a": {}}}]},
                "either": {"anyOf": [
                    {"type": "object", "properties": {"x": {}}},
                    {"type": "string"}
                ]},
                "maybe": {"type": ["object", "null"], "properties": {"y": {}}},
                "item": {"$ref": "#/$defs/Item"}
            },
            "$defs": {"Item": {"type": "object", "properties": {"id": {"type": "integer"}}}},
            "definitions": {"Old": {"properties": {"v": {}}}}
        }));
        for at in [
            "",
            "/properties/address",
            "/properties/tags/items",
            "/properties/pair/prefixItems/0",
            "/properties/either/anyOf/0",
            "/properties/maybe",
            "/$defs/Item",
            "/definitions/Old",
        ] {
            let s = got.pointer(at).unwrap_or_else(|| panic!("{at}: {got}"));
            assert_eq!(s["additionalProperties"], false, "{at}: {got}");
        }
        // Not objects, or no properties: nothing to close.
        for at in [
            "/properties/name",
            "/properties/either/anyOf/1",
            "/properties/item",
        ] {
            let s = got.pointer(at).unwrap();
            assert!(s.get("additionalProperties").is_none(), "{at}: {got}");
        }
    }

    #[test]
    fn what_the_schema_says_is_kept() {
        // An explicit `additionalProperties` (true, false or a schema) is left as it is;
        // an object without `properties` stays any object, as llama.cpp reads it.
        for s in [
            json!({"type": "object", "properties": {"a": {}}, "additionalProperties": true}),
            json!({"properties": {"a": {}}, "additionalProperties": {"type": "string"}}),
            json!({"type": "object"}),
            json!({"type": "string"}),
        ] {
            assert_eq!(close_objects(s.clone()), s);
        }
        // Under `not` a closed object would mean the opposite: it is left alone.
        let got = close_objects(json!({"properties": {"a": {}}, "not": {"properties": {"b": {}}}}));
        assert_eq!(got["additionalProperties"], false, "{got}");
        assert!(got["not"].get("additionalProperties").is_none(), "{got}");
        assert_eq!(close_objects(json!(true)), json!(true));
    }

    #[test]
    fn combinations_close_to_the_keys_of_every_part() {
        let got = close_objects(json!({
            "allOf": [
                {"$ref": "#/$defs/Base"},
                {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}
            ],
            "$defs": {"Base": {"type": "object", "properties": {"a": {"type": "string"}}}}
        }));
        assert_eq!(got["additionalProperties"], false, "{got}");
        assert_eq!(got["properties"], json!({"a": {}, "b": {}}), "{got}");
        // The parts stay open, or each would forbid the other's key.
        assert!(
            got["allOf"][1].get("additionalProperties").is_none(),
            "{got}"
        );
        assert!(
            got["$defs"]["Base"].get("additionalProperties").is_none(),
            "{got}"
        );

        // `properties` beside `anyOf`: the keys of both.
        let got = close_objects(json!({
            "properties": {"kind": {"type": "string"}},
            "anyOf": [{"properties": {"x": {}}}, {"properties": {"y": {}}}]
        }));
        assert_eq!(got["additionalProperties"], false, "{got}");
        assert_eq!(
            got["properties"],
            json!({"kind": {"type": "string"}, "x": {}, "y": {}})
        );
        assert!(
            got["anyOf"][0].get("additionalProperties").is_none(),
            "{got}"
        );

        // A part whose keys cannot be listed leaves the combination open; the inside
        // of each part is still closed.
        let got = close_objects(json!({"allOf": [
            {"$ref": "https://example.com/s.json"},
            {"properties": {"n": {"properties": {"z": {}}}}}
        ]}));
        assert!(got.get("additionalProperties").is_none(), "{got}");
        assert_eq!(
            got["allOf"][1]["properties"]["n"]["additionalProperties"], false,
            "{got}"
        );

        // One `allOf` branch is the whole object: it closes as any object does.
        let got = close_objects(json!({"allOf": [{"properties": {"a": {}}}]}));
        assert_eq!(got["allOf"][0]["additionalProperties"], false, "{got}");
    }
}
