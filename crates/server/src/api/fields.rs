//! Request bodies read field by field, shared by every codec: a wrong type or a value
//! outside its range is refused with a 400 that names the field and the range. Each
//! codec (`openai`, `llama`, `ollama`) reads its own field names and defaults through
//! these readers, so the shapes they share (`stop`, `top_p`, `min_p`, `repeat_penalty`,
//! `repeat_last_n`, the output grammar) are checked in one place.

use minfer_runtime::constraint::lenient;
use minfer_runtime::sampling::MAX_PENALTY_WINDOW;
use minfer_runtime::Grammar;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::params::{MAX_STOP, MAX_STOP_BYTES, REPEAT_PENALTY_RANGE};

/// A JSON object body.
pub type Object = Map<String, Value>;

/// Parses a request body that must be a JSON object.
pub fn parse_object(body: &[u8]) -> Result<Object, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_request("request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!("invalid JSON body: {e}"))),
    }
}

/// A field of the wrong type or shape: `what` says what it must be.
pub fn wrong(field: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("field `{field}` must be {what}"))
}

/// A value outside the field's stated range.
pub fn out_of_range(field: &str, value: impl std::fmt::Display, range: &str) -> ApiError {
    ApiError::bad_request(format!("field `{field}` is {value}: must be {range}"))
}

/// A field this server does not implement.
pub fn unsupported(field: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("field `{field}` is not supported: {why}"))
}

/// An optional field, `null` counting as absent.
pub fn field<'a>(obj: &'a Object, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

/// An optional finite number (kept finite as an `f32`).
pub fn opt_f32(obj: &Object, name: &str) -> Result<Option<f32>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() && (x as f32).is_finite() => Ok(Some(x as f32)),
            // Beyond f32's range the value would become an infinity in the sampler.
            Some(x) if x.is_finite() => Err(out_of_range(name, x, "a 32-bit float")),
            _ => Err(wrong(name, "a number")),
        },
    }
}

/// An optional number inside `[lo, hi]`; `range` states the interval in the error.
pub fn opt_f32_in(
    obj: &Object,
    name: &str,
    lo: f32,
    hi: f32,
    range: &str,
) -> Result<Option<f32>, ApiError> {
    match opt_f32(obj, name)? {
        Some(v) if !(lo..=hi).contains(&v) => Err(out_of_range(name, v, range)),
        v => Ok(v),
    }
}

/// An optional non-negative integer.
pub fn opt_usize(obj: &Object, name: &str) -> Result<Option<usize>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .map(Some)
            .ok_or_else(|| wrong(name, "a non-negative integer")),
    }
}

/// An optional integer (signed), refusing fractions and values past 64 bits.
pub fn opt_i64(obj: &Object, name: &str) -> Result<Option<i64>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| wrong(name, "an integer")),
    }
}

/// llama-server's `id_slot`: `None` for absent or -1 (any slot), else the slot asked for.
pub fn id_slot(obj: &Object) -> Result<Option<usize>, ApiError> {
    match opt_i64(obj, "id_slot")? {
        None | Some(-1) => Ok(None),
        Some(n) => usize::try_from(n)
            .map(Some)
            .map_err(|_| wrong("id_slot", "-1 or a slot id")),
    }
}

/// An optional boolean.
pub fn opt_bool(obj: &Object, name: &str) -> Result<Option<bool>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| wrong(name, "a boolean")),
    }
}

/// An optional string.
pub fn opt_str<'a>(obj: &'a Object, name: &str) -> Result<Option<&'a str>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or_else(|| wrong(name, "a string")),
    }
}

/// A list of token ids (each below 2^32).
pub fn token_list(v: &Value, name: &str) -> Result<Vec<u32>, ApiError> {
    let arr = v
        .as_array()
        .ok_or_else(|| wrong(name, "an array of token ids"))?;
    arr.iter()
        .map(|t| {
            t.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| wrong(name, "an array of token ids"))
        })
        .collect()
}

/// Refuses any non-null field of a request body missing from `known`, naming it.
pub fn check_fields(obj: &Object, known: &[&str]) -> Result<(), ApiError> {
    only_known(obj, known, "")
}

/// Refuses every non-null field of `obj` missing from `known`, naming it (`prefix`
/// places it, e.g. `messages[2].`).
pub fn only_known(obj: &Object, known: &[&str], prefix: &str) -> Result<(), ApiError> {
    for (k, v) in obj {
        if !v.is_null() && !known.contains(&k.as_str()) {
            return Err(ApiError::bad_request(format!(
                "field `{prefix}{k}` is not supported by this server"
            )));
        }
    }
    Ok(())
}

/// A string or an array of strings (`stop`), each string kept whole; `what` words the
/// shape in the error.
pub fn string_list(v: Option<&Value>, name: &str, what: &str) -> Result<Vec<String>, ApiError> {
    match v.filter(|v| !v.is_null()) {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| wrong(name, what)),
        Some(_) => Err(wrong(name, what)),
    }
}

/// Refuses more than [`MAX_STOP`] stop strings, or one that is empty or longer than
/// [`MAX_STOP_BYTES`], naming the field `stop` (or `stop[i]`).
pub fn check_stop(stop: &[String]) -> Result<(), ApiError> {
    if stop.len() > MAX_STOP {
        return Err(out_of_range(
            "stop",
            format!("{} strings", stop.len()),
            &format!("at most {MAX_STOP} strings"),
        ));
    }
    for (i, s) in stop.iter().enumerate() {
        if s.is_empty() || s.len() > MAX_STOP_BYTES {
            return Err(out_of_range(
                &format!("stop[{i}]"),
                format!("{} bytes long", s.len()),
                &format!("1 to {MAX_STOP_BYTES} bytes long"),
            ));
        }
    }
    Ok(())
}

/// `top_p` (named `name` in the error): in (0, 1].
pub fn top_p(name: &str, p: f32) -> Result<f32, ApiError> {
    if p <= 0.0 || p > 1.0 {
        return Err(out_of_range(name, p, "in (0, 1]"));
    }
    Ok(p)
}

/// `min_p` (named `name` in the error): in [0, 1].
pub fn min_p(name: &str, p: f32) -> Result<f32, ApiError> {
    if !(0.0..=1.0).contains(&p) {
        return Err(out_of_range(name, p, "in [0, 1]"));
    }
    Ok(p)
}

/// `repeat_penalty` (named `name` in the error): in [`REPEAT_PENALTY_RANGE`], since it
/// divides logits.
pub fn repeat_penalty(name: &str, r: f32) -> Result<f32, ApiError> {
    let (lo, hi) = REPEAT_PENALTY_RANGE;
    if !(lo..=hi).contains(&r) {
        return Err(out_of_range(name, r, "in [0.01, 10]"));
    }
    Ok(r)
}

/// `repeat_last_n` (named `name` in the error): a window of 0 to the sampler's longest,
/// or -1 for `whole` ("the whole context").
pub fn repeat_last_n(name: &str, n: i64, whole: usize) -> Result<usize, ApiError> {
    match n {
        -1 => Ok(whole),
        n if (0..=MAX_PENALTY_WINDOW as i64).contains(&n) => Ok(n as usize),
        n => Err(out_of_range(name, n, "-1 or in [0, 65536]")),
    }
}

/// The grammar of a request's JSON schema: `strict`, a keyword the engine cannot enforce
/// refuses the request by name; otherwise the schema is [`lenient`] and what it leaves out
/// is reported (the `x-minfer-schema-unenforced` header).
pub fn schema_grammar(schema: Value, strict: bool) -> Grammar {
    Grammar::JsonSchema(if strict { schema } else { lenient(schema) })
}

/// The output grammar a request asks for: OpenAI's `response_format` (`text`,
/// `json_object`, `json_schema` with its `schema` and `strict`), or llama-server's
/// `json_schema` (a schema) and `grammar` (GBNF); at most one of them.
pub fn output_grammar(obj: &Object) -> Result<Option<(Grammar, &'static str)>, ApiError> {
    let mut found: Vec<(Grammar, &'static str)> = Vec::new();
    if let Some(rf) = field(obj, "response_format") {
        let o = rf
            .as_object()
            .ok_or_else(|| wrong("response_format", "an object with a string `type`"))?;
        only_known(o, &["type", "json_schema", "schema"], "response_format.")?;
        let ty = o
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| wrong("response_format", "an object with a string `type`"))?;
        match ty {
            "text" => {}
            // llama-server's extension: a `schema` beside `json_object`, read as its
            // `json_schema` field is (objects closed unless the schema opens them).
            "json_object" => match o.get("schema") {
                None => found.push((Grammar::JsonObject, "response_format")),
                Some(s) if s.is_object() => {
                    let closed = crate::api::closed_schema::close_objects(s.clone());
                    found.push((schema_grammar(closed, false), "response_format"));
                }
                Some(_) => return Err(wrong("response_format.schema", "a JSON schema object")),
            },
            "json_schema" if o.contains_key("schema") => {
                return Err(ApiError::bad_request(
                    "field `response_format.schema` goes with type json_object; a json_schema \
                     format gives its schema in `response_format.json_schema.schema`",
                )
                .with_param("response_format.schema"))
            }
            "json_schema" => {
                let js = o.get("json_schema").and_then(Value::as_object).ok_or_else(|| {
                    wrong(
                        "response_format.json_schema",
                        "an object with `name` and `schema`",
                    )
                })?;
                only_known(
                    js,
                    &["name", "description", "schema", "strict"],
                    "response_format.json_schema.",
                )?;
                opt_str(js, "name").map_err(|_| wrong("response_format.json_schema.name", "a string"))?;
                // The output is constrained to the schema either way; `strict` decides
                // whether a keyword the engine cannot enforce refuses the request or is
                // left out (and reported), as OpenAI's split has it.
                let strict = opt_bool(js, "strict")
                    .map_err(|_| wrong("response_format.json_schema.strict", "a boolean"))?
                    .unwrap_or(false);
                let schema = field(js, "schema").cloned().unwrap_or_else(|| {
                    // OpenAI's default: any JSON object.
                    serde_json::json!({"type": "object"})
                });
                found.push((schema_grammar(schema, strict), "response_format"));
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "field `response_format.type` is `{other}`: expected text, json_object or json_schema"
                ))
                .with_param("response_format"))
            }
        }
    }
    if let Some(s) = field(obj, "json_schema") {
        if !s.is_object() {
            return Err(wrong("json_schema", "a JSON schema object"));
        }
        // llama-server's field, read as llama-server reads it: objects closed unless the
        // schema opens them.
        let closed = crate::api::closed_schema::close_objects(s.clone());
        found.push((schema_grammar(closed, false), "json_schema"));
    }
    if let Some(g) = opt_str(obj, "grammar")?.filter(|g| !g.trim().is_empty()) {
        found.push((Grammar::Gbnf(g.to_string()), "grammar"));
    }
    if found.len() > 1 {
        return Err(ApiError::bad_request(format!(
            "fields `{}` and `{}` both constrain the output: give one",
            found[0].1, found[1].1
        )));
    }
    Ok(found.pop())
}
