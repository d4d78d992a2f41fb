//! Numbers a JSON grammar lets end: at most [`INT_DIGITS`] digits before the point and
//! [`FRACTION_DIGITS`] after it, as llama.cpp's schema grammars bound them (its
//! `integral-part` and `decimal-part` rules, 16 digits each). The grammar engine reads
//! bounds as binary floats, exact up to 2^53, and works a `multipleOf` step's digits in
//! 32-bit integers, where `9 * 10^8` is the largest product that fits: hence 15 and 8.
//! The engine's own number rule has no length, so a model caught in a loop of digits
//! (`1000000…`, `0.3333…`) is never made to close the number and spends every token it
//! has left on it; what ollama or llama-server would have ended as valid JSON came back
//! cut off. A bounded number is written without an exponent.
//!
//! The bounds are written into the schema as ordinary keywords (`minimum`, `maximum`,
//! `multipleOf`), so every value they allow is a value the schema as sent allows. They
//! go only where that holds: a schema's own bounds, `enum` and `const` are kept, and
//! nothing under `not` or `if` is touched (narrowing there would widen the whole). The
//! step goes only on a number no other schema is merged with (not under `allOf`,
//! `anyOf`, `oneOf`, `then`, `else`, `$defs` or `patternProperties`, nor beside `$ref`,
//! a combinator or a property pattern): the engine merges two steps into their least
//! common multiple, which its 32-bit integers do not hold for ours and most others.

use serde_json::{json, Map, Value};

/// Digits allowed before a number's point.
pub const INT_DIGITS: u32 = 15;

/// Digits allowed after a number's point.
pub const FRACTION_DIGITS: u32 = 8;

/// The largest magnitude of [`INT_DIGITS`] digits.
const LIMIT: i64 = 999_999_999_999_999;

/// The step that leaves [`FRACTION_DIGITS`] digits after the point.
const STEP: f64 = 1e-8;

/// Keywords whose value is one subschema, and whether the engine may merge it with
/// another.
const ONE: [(&str, bool); 8] = [
    ("additionalProperties", false),
    ("unevaluatedProperties", false),
    ("items", false),
    ("additionalItems", false),
    ("unevaluatedItems", false),
    ("contains", false),
    ("then", true),
    ("else", true),
];

/// Keywords whose value is an array of subschemas, and whether the engine may merge them.
const MANY: [(&str, bool); 5] = [
    ("prefixItems", false),
    ("items", false),
    ("anyOf", true),
    ("oneOf", true),
    ("allOf", true),
];

/// Keywords whose value maps names to subschemas, and whether the engine may merge them
/// (a definition is merged with whatever sits beside a `$ref` to it).
const NAMED: [(&str, bool); 5] = [
    ("properties", false),
    ("patternProperties", true),
    ("$defs", true),
    ("definitions", true),
    ("dependentSchemas", true),
];

/// Keywords beside which a schema is merged with another.
const MERGED_BESIDE: [&str; 4] = ["$ref", "allOf", "anyOf", "oneOf"];

/// `schema` with every integer and number it describes bounded to [`INT_DIGITS`] digits
/// before the point and [`FRACTION_DIGITS`] after it, where the schema leaves that open.
pub fn bounded_numbers(mut schema: Value) -> Value {
    bound(&mut schema, false);
    schema
}

/// Bounds `v` and its subschemas; `merged`: the engine may merge `v` with another schema.
fn bound(v: &mut Value, merged: bool) {
    let Some(o) = v.as_object_mut() else {
        return;
    };
    let merged = merged || MERGED_BESIDE.iter().any(|k| o.contains_key(*k));
    bound_here(o, !merged);
    for (k, m) in ONE {
        if let Some(s) = o.get_mut(k).filter(|s| s.is_object()) {
            bound(s, merged || m);
        }
    }
    for (k, m) in MANY {
        if let Some(Value::Array(a)) = o.get_mut(k) {
            a.iter_mut().for_each(|s| bound(s, merged || m));
        }
    }
    // A property whose name a pattern also matches is merged with the pattern's schema.
    let patterns = o.contains_key("patternProperties");
    for (k, m) in NAMED {
        let m = m || (k == "properties" && patterns);
        if let Some(Value::Object(map)) = o.get_mut(k) {
            map.values_mut().for_each(|s| bound(s, merged || m));
        }
    }
}

/// The bounds of one schema object, by its own `type`; `step`: the fraction's bound
/// may go on it too.
fn bound_here(o: &mut Map<String, Value>, step: bool) {
    let types: Vec<&str> = match o.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => return,
    };
    let number = types.contains(&"number");
    if !number && !types.contains(&"integer") {
        return;
    }
    if o.contains_key("enum") || o.contains_key("const") {
        return;
    }
    let low = bound_of(o, "minimum", "exclusiveMinimum");
    let high = bound_of(o, "maximum", "exclusiveMaximum");
    // Only a side the schema leaves open, and never past the other side's own bound.
    if low.is_none() && high.is_none_or(|h| h >= -(LIMIT as f64)) {
        o.insert("minimum".into(), json!(-LIMIT));
    }
    if high.is_none() && low.is_none_or(|l| l <= LIMIT as f64) {
        o.insert("maximum".into(), json!(LIMIT));
    }
    if number && step && !o.contains_key("multipleOf") {
        o.insert("multipleOf".into(), json!(STEP));
    }
}

/// The schema's bound on one side: `inclusive`'s number, or `exclusive`'s where that is
/// a number (draft 4 writes it as a flag beside `inclusive`).
fn bound_of(o: &Map<String, Value>, inclusive: &str, exclusive: &str) -> Option<f64> {
    o.get(inclusive)
        .and_then(Value::as_f64)
        .or_else(|| o.get(exclusive).and_then(Value::as_f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_numbers_are_bounded_and_the_schema_s_own_bounds_kept() {
        let s = bounded_numbers(json!({
            "type": "object",
            "properties": {
                "n": {"type": "integer"},
                "age": {"type": "integer", "minimum": 0},
                "x": {"type": ["number", "null"]},
                "p": {"type": "number", "multipleOf": 0.5, "exclusiveMaximum": 1},
                "e": {"type": "integer", "enum": [1, 100000000000000000000u128 as f64]},
                "big": {"type": "integer", "minimum": 1e20},
                "s": {"type": "string"},
            },
            "additionalProperties": {"type": "integer"},
            "$defs": {"d": {"type": "number"}},
            "not": {"type": "integer"},
        }));
        let p = &s["properties"];
        assert_eq!(p["n"]["minimum"], json!(-LIMIT));
        assert_eq!(p["n"]["maximum"], json!(LIMIT));
        assert!(p["n"].get("multipleOf").is_none());
        assert_eq!(p["age"]["minimum"], 0);
        assert_eq!(p["age"]["maximum"], json!(LIMIT));
        assert_eq!(p["x"]["multipleOf"], json!(STEP));
        assert_eq!(STEP, 10f64.powi(-(FRACTION_DIGITS as i32)));
        assert_eq!(LIMIT, 10i64.pow(INT_DIGITS) - 1);
        assert_eq!(p["p"]["multipleOf"], 0.5);
        assert!(p["p"].get("maximum").is_none());
        assert_eq!(p["p"]["minimum"], json!(-LIMIT));
        assert!(p["e"].get("minimum").is_none());
        // A minimum past the limit gets no maximum below it.
        assert!(p["big"].get("maximum").is_none());
        assert!(p["s"].get("minimum").is_none());
        assert_eq!(s["additionalProperties"]["maximum"], json!(LIMIT));
        assert_eq!(s["$defs"]["d"]["maximum"], json!(LIMIT));
        // No step where the engine merges schemas: its integers would overflow.
        assert!(s["$defs"]["d"].get("multipleOf").is_none());
        let merged = bounded_numbers(json!({"allOf": [{"type": "number"}, {"multipleOf": 7}],
            "properties": {"r": {"$ref": "#/$defs/d", "type": "number"}}}));
        assert!(merged["allOf"][0].get("multipleOf").is_none());
        assert_eq!(merged["allOf"][0]["maximum"], json!(LIMIT));
        assert!(merged["properties"]["r"].get("multipleOf").is_none());
        // Siblings of `anyOf` are merged into its branches.
        let any = bounded_numbers(json!({"anyOf": [{"type": "number"}],
            "properties": {"x": {"type": "number"}}}));
        assert_eq!(any["anyOf"][0]["maximum"], json!(LIMIT));
        assert!(any["anyOf"][0].get("multipleOf").is_none());
        assert!(any["properties"]["x"].get("multipleOf").is_none());
        // Narrowing under `not` would widen the schema.
        assert!(s["not"].get("maximum").is_none());
        // Booleans and other values pass through.
        assert_eq!(bounded_numbers(json!(true)), json!(true));
    }
}
