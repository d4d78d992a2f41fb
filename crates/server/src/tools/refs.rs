//! A tool's parameters schema embedded in a bigger one (a call's JSON nests it under
//! `arguments`; an XML call types each parameter by its own part of it), with its local
//! references made to resolve there.

use serde_json::Value;

/// Where a tool's own parameters schema is kept in a grammar's schema that embeds part
/// of it, so that the parameters' local references (`#/$defs/A`, `#/definitions/A`,
/// `#` itself) still resolve: a call's JSON nests the parameters under `arguments`, and
/// an XML call types each parameter by its own sub-schema, where `#` would otherwise
/// name the wrong document.
pub(super) const REF_ROOT: &str = "__tool_parameters";

/// Whether a schema holds a local `$ref` anywhere.
fn has_local_ref(v: &Value) -> bool {
    match v {
        Value::Object(o) => o.iter().any(|(k, x)| {
            (k == "$ref" && x.as_str().is_some_and(|r| r.starts_with('#'))) || has_local_ref(x)
        }),
        Value::Array(a) => a.iter().any(has_local_ref),
        _ => false,
    }
}

/// `v`, a part of a tool's parameters schema, with every local `$ref` pointing into the
/// copy of the parameters kept at `#/$defs/`[`REF_ROOT`] (unchanged without one).
pub(super) fn rebased(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| {
                    let x = match x.as_str() {
                        Some(r) if k == "$ref" && r.starts_with('#') => {
                            Value::String(format!("#/$defs/{REF_ROOT}{}", &r[1..]))
                        }
                        _ => rebased(x),
                    };
                    (k.clone(), x)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(rebased).collect()),
        other => other.clone(),
    }
}

/// The copy of a tool's parameters that [`rebased`] references point into, for the
/// embedding schema's `$defs`; `None` when the parameters reference nothing locally.
pub(super) fn rebased_root(parameters: &Value) -> Option<Value> {
    has_local_ref(parameters).then(|| rebased(parameters))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn local_references_point_into_the_kept_parameters() {
        let params = json!({"type": "object", "properties": {
            "a": {"$ref": "#/$defs/A"}, "t": {"$ref": "#"},
            "u": {"$ref": "other.json#/x"}},
            "$defs": {"A": {"enum": ["x"]}}});
        let r = rebased(&params);
        assert_eq!(
            r["properties"]["a"]["$ref"],
            "#/$defs/__tool_parameters/$defs/A"
        );
        assert_eq!(r["properties"]["t"]["$ref"], "#/$defs/__tool_parameters");
        // Not a local reference: left alone (the grammar engine says what it makes of it).
        assert_eq!(r["properties"]["u"]["$ref"], "other.json#/x");
        assert_eq!(rebased_root(&params), Some(r));
        let plain = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        assert_eq!(rebased_root(&plain), None);
        assert_eq!(rebased(&plain), plain);
    }
}
