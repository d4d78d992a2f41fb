//! Calls in Qwen3-Coder's and Qwen3.5's XML-like format, as their chat templates write
//! them (and the models answer):
//!
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! <parameter=days>
//! 3
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! A value is the text between the newline after `<parameter=NAME>` and the one before
//! the `</parameter>` that starts a line, not quoted. It becomes the JSON type the tool's schema declares for
//! the parameter: a string parameter keeps the text as it is; otherwise the text is read
//! as JSON (the templates write objects and lists with `tojson`) and booleans and none
//! also in the spelling Python's `str()` gives them (`True`, `None`), which is how the
//! templates render them; text that is none of the declared types stays a string.

use serde_json::{json, Value};

use super::{Call, Function};

/// The text that ends every argument value.
const VALUE_END: &str = "\n</parameter>\n";

/// A call's body (the text between the tags) as a call; `None` when it is not one.
pub(super) fn parse_call(body: &str, functions: &[Function]) -> Option<Call> {
    let rest = body.trim_start().strip_prefix("<function=")?;
    let (name, rest) = rest.split_once('>')?;
    let name = name.trim();
    if name.is_empty() || name.contains(['<', '\n']) {
        return None;
    }
    let end = rest.rfind("</function>")?;
    if !rest[end + "</function>".len()..].trim().is_empty() {
        return None;
    }
    let params = functions
        .iter()
        .find(|f| f.name == name)
        .map(|f| &f.parameters);
    let props = params.and_then(|p| p.get("properties"));
    let mut args = serde_json::Map::new();
    let mut inner = &rest[..end];
    loop {
        inner = inner.trim_start();
        if inner.is_empty() {
            break;
        }
        let r = inner.strip_prefix("<parameter=")?;
        let (pname, r) = r.split_once('>')?;
        // The value ends at a `</parameter>` that starts a line (so one inside a line
        // of the value is text), or at the first one when none does.
        let (end, tag) = match r.find("\n</parameter>") {
            Some(i) => (i, i + 1),
            None => r.find("</parameter>").map(|i| (i, i))?,
        };
        let raw = &r[..end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let pname = pname.trim();
        let schema = props.and_then(|p| p.get(pname));
        let value = typed_value(raw, schema.zip(params).map(|(s, root)| resolved(root, s)));
        args.insert(pname.to_string(), value);
        inner = &r[tag + "</parameter>".len()..];
    }
    Some(Call {
        name: name.to_string(),
        arguments: Value::Object(args).to_string(),
    })
}

/// A parameter's schema with a local `$ref` at its top followed into the tool's
/// parameters `root` (a few hops at most), so that its type and enum are known.
fn resolved<'a>(root: &'a Value, mut schema: &'a Value) -> &'a Value {
    for _ in 0..8 {
        let target = schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix('#'))
            .and_then(|p| root.pointer(p));
        match target {
            Some(t) => schema = t,
            None => break,
        }
    }
    schema
}

/// The JSON types a parameter's schema declares (`type`, a list of them, or those of its
/// `anyOf` / `oneOf` branches); empty when it declares none.
fn declared_types(schema: &Value) -> Vec<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => ["anyOf", "oneOf"]
            .iter()
            .filter_map(|k| schema.get(*k).and_then(Value::as_array))
            .flatten()
            .flat_map(declared_types)
            .collect(),
    }
}

/// Whether `v` is of one of `types`.
fn fits(v: &Value, types: &[&str]) -> bool {
    types.iter().any(|t| match *t {
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => false,
    })
}

/// One argument's text as the JSON value its schema asks for (see the module's comment).
fn typed_value(raw: &str, schema: Option<&Value>) -> Value {
    let types = schema.map(declared_types).unwrap_or_default();
    if !types.is_empty() && types.iter().all(|t| *t == "string") {
        return Value::String(raw.to_string());
    }
    let declares = |t: &str| types.is_empty() || types.contains(&t);
    let t = raw.trim();
    if declares("boolean") {
        match t {
            "true" | "True" => return Value::Bool(true),
            "false" | "False" => return Value::Bool(false),
            _ => {}
        }
    }
    if declares("null") && matches!(t, "null" | "None") {
        return Value::Null;
    }
    match serde_json::from_str::<Value>(t) {
        // A quoted string stays the text as written: only a string parameter is unquoted.
        Ok(v)
            if !v.is_string() && (!declares("string") || types.is_empty() || fits(&v, &types)) =>
        {
            v
        }
        _ => Value::String(raw.to_string()),
    }
}

/// A Lark string literal of `text`.
fn lit(text: &str) -> String {
    Value::String(text.to_string()).to_string()
}

/// The grammar of XML calls of `funcs`: each function's opening line, its required
/// parameters in their declared order, then any of its optional ones (a string one as
/// free text up to the value's end, one of string enum values as those values, any other
/// typed one as JSON of its schema), its closing line. `lazy`: it starts after the
/// model's own `<tool_call>`. Parameters the schema does not declare are not generated.
/// `top` names the rule the calls are (`start`, unless a bigger grammar holds them).
pub(super) fn grammar(funcs: &[&Function], lazy: bool, parallel: bool, top: &str) -> String {
    let head = if lazy {
        lit("\n")
    } else {
        lit("<tool_call>\n")
    };
    let tail = lit("</tool_call>");
    let more = if parallel {
        format!(" ({} call {tail})*", lit("\n<tool_call>\n"))
    } else {
        String::new()
    };
    let mut g = format!("{top}: {head} call {tail}{more}\n");
    let alts: Vec<String> = (0..funcs.len()).map(|i| format!("f{i}")).collect();
    g.push_str(&format!("call: {}\n", alts.join(" | ")));
    let end = lit(VALUE_END);
    let close = lit("</function>\n");
    let mut free_text = false;
    for (i, f) in funcs.iter().enumerate() {
        let open = lit(&format!("<function={}>\n", f.name));
        let props = f
            .parameters
            .get("properties")
            .and_then(Value::as_object)
            .filter(|p| !p.is_empty());
        let Some(props) = props else {
            g.push_str(&format!("f{i}: {open} {close}\n"));
            continue;
        };
        // The required parameters in their declared order, then any optional ones.
        let required: Vec<&str> = f
            .parameters
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let is_required = |p: &str| required.contains(&p);
        let mut seq: Vec<String> = props
            .keys()
            .enumerate()
            .filter(|(_, p)| is_required(p))
            .map(|(j, _)| format!("f{i}_p{j}"))
            .collect();
        let optional: Vec<String> = props
            .keys()
            .enumerate()
            .filter(|(_, p)| !is_required(p))
            .map(|(j, _)| format!("f{i}_p{j}"))
            .collect();
        if !optional.is_empty() {
            g.push_str(&format!("f{i}_opt: {}\n", optional.join(" | ")));
            seq.push(format!("f{i}_opt*"));
        }
        g.push_str(&format!("f{i}: {open} {} {close}\n", seq.join(" ")));
        // The parameters' copy that rebased references point into, once per function.
        let root = super::rebased_root(&f.parameters);
        for (j, (pname, schema)) in props.iter().enumerate() {
            let schema = resolved(&f.parameters, schema);
            let open = lit(&format!("<parameter={pname}>\n"));
            let types = declared_types(schema);
            let words: Option<Vec<&str>> = schema
                .get("enum")
                .and_then(Value::as_array)
                .and_then(|e| e.iter().map(Value::as_str).collect());
            let value = match (words, schema.is_object()) {
                (Some(words), _) if !words.is_empty() => {
                    let alts: Vec<String> = words.iter().map(|w| lit(w)).collect();
                    format!("({}) {end}", alts.join(" | "))
                }
                (_, true) if !types.is_empty() && !types.contains(&"string") => {
                    let mut s = super::rebased(schema);
                    if let (Some(root), Some(o)) = (&root, s.as_object_mut()) {
                        // A `$defs` that is no object is the schema's own error, left
                        // for the grammar engine to name.
                        let defs = o.entry("$defs").or_insert_with(|| json!({}));
                        if let Some(defs) = defs.as_object_mut() {
                            defs.insert(super::REF_ROOT.to_string(), root.clone());
                        }
                    }
                    s["x-guidance"] = json!({"whitespace_pattern": r"\x20", "lenient": !f.strict});
                    let s = minfer_runtime::constraint::bounded_numbers(s);
                    g.push_str(&format!("f{i}_v{j}: %json {s}\n"));
                    format!("f{i}_v{j} {end}")
                }
                _ => {
                    free_text = true;
                    "xml_text".to_string()
                }
            };
            g.push_str(&format!("f{i}_p{j}: {open} {value}\n"));
        }
    }
    if free_text {
        // Any text, ending at the first value end (which it includes).
        g.push_str(&format!("xml_text[suffix={end}]: /(?s:.*)/\n"));
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{parse, CallFormat, Piece, ToolChoice};

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "where": {"type": "object"},
                "tags": {"type": "array"},
                "note": {"type": ["string", "null"]},
                "code": {"type": "string"},
                "ratio": {"type": "number"},
                "mode": {"enum": ["on", "off"]}}}}}])
    }

    /// The output as Qwen3.5's template renders a call (booleans and none in Python's
    /// spelling), a second call, and text before them.
    const OUT: &str = "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=where>\n{\"lat\": 40.7, \"lon\": -74}\n</parameter>\n<parameter=tags>\n[\"a\", 1]\n</parameter>\n<parameter=note>\nNone\n</parameter>\n<parameter=code>\n42\n</parameter>\n<parameter=ratio>\n2.5\n</parameter>\n<parameter=mode>\non\n</parameter>\n<parameter=extra>\nfalse\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nline one\n  line two </parameter> not the end\n</parameter>\n</function>\n</tool_call>";

    fn spec() -> crate::tools::ToolSpec {
        let mut s = parse(Some(&tools()), None, None).unwrap().unwrap();
        s.format = CallFormat::Xml;
        s
    }

    #[test]
    fn xml_calls_are_parsed_with_the_schema_s_types_whole_and_streamed() {
        let (text, calls) = spec().splitter().split(OUT);
        assert_eq!(text, "Checking.\n\n");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(
            args,
            json!({"city": "New York", "days": 3, "metric": true,
                   "where": {"lat": 40.7, "lon": -74}, "tags": ["a", 1], "note": null,
                   "code": "42", "ratio": 2.5, "mode": "on", "extra": false})
        );
        // Arguments keep the order the model wrote them in.
        assert!(calls[0]
            .arguments
            .starts_with("{\"city\":\"New York\",\"days\":3,"));
        // A value runs to the `</parameter>` that starts a line, its one leading and
        // trailing newline dropped.
        assert_eq!(
            calls[1].arguments,
            json!({"city": "line one\n  line two </parameter> not the end"}).to_string()
        );
        for step in 1..9 {
            let mut s = spec().splitter();
            let chars: Vec<char> = OUT.chars().collect();
            let mut got = Vec::new();
            for c in chars.chunks(step) {
                got.extend(s.push(&c.iter().collect::<String>()));
            }
            got.extend(s.finish());
            let streamed: Vec<_> = got
                .iter()
                .filter_map(|p| match p {
                    Piece::Call(c) => Some(c.clone()),
                    Piece::Text(_) => None,
                })
                .collect();
            assert_eq!(streamed, calls, "pieces of {step}");
        }
    }

    #[test]
    fn values_take_the_declared_type_or_stay_text() {
        let s = |t: Value| Some(t);
        for (raw, schema, want) in [
            ("007", s(json!({"type": "string"})), json!("007")),
            ("7", s(json!({"type": "integer"})), json!(7)),
            ("seven", s(json!({"type": "integer"})), json!("seven")),
            (
                "false",
                s(json!({"type": ["boolean", "string"]})),
                json!(false),
            ),
            (
                "[1]",
                s(json!({"type": ["string", "integer"]})),
                json!("[1]"),
            ),
            (
                "12",
                s(json!({"anyOf": [{"type": "integer"}, {"type": "string"}]})),
                json!(12),
            ),
            ("\"q\"", None, json!("\"q\"")),
            ("{\"a\": 1}", None, json!({"a": 1})),
            (" x ", None, json!(" x ")),
        ] {
            assert_eq!(
                typed_value(raw, schema.as_ref()),
                want,
                "{raw:?} {schema:?}"
            );
        }
    }

    /// Qwen3-Coder models sometimes open a call with `<function=NAME>` alone (and close
    /// it with `</tool_call>`): for a tool of the request that is a call, whole or
    /// streamed in any pieces; another name stays text.
    #[test]
    fn a_call_opened_without_its_tag_is_a_call() {
        let body = "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>";
        let want = Call {
            name: "get_weather".into(),
            arguments: "{\"city\":\"Oslo\",\"days\":2}".into(),
        };
        for (out, text, calls) in [
            (
                format!("Let me look.\n{body}\n</tool_call>"),
                "Let me look.\n",
                vec![want.clone()],
            ),
            // The answer ends with the function block, no `</tool_call>`.
            (format!("{body}\n"), "", vec![want.clone()]),
            // Two calls, the second tagged.
            (
                format!("{body}\n</tool_call>\n<tool_call>\n{body}\n</tool_call>"),
                "",
                vec![want.clone(), want.clone()],
            ),
            (
                "<function=rm_rf>\n</function>\n</tool_call>".to_string(),
                "<function=rm_rf>\n</function>\n</tool_call>",
                vec![],
            ),
            ("a < b <functio".to_string(), "a < b <functio", vec![]),
        ] {
            for step in [1, 2, 5, 1000] {
                let (t, c) = crate::tools::stream::stream(spec().splitter(), &out, step);
                assert_eq!((t.as_str(), c), (text, calls.clone()), "{out:?} by {step}");
            }
        }
    }

    #[test]
    fn malformed_calls_stay_text() {
        for body in [
            "\n<function=>\n</function>\n",
            "\n{\"name\": \"get_weather\"}\n",
            "\n<function=f>\n<parameter=x>\n1\n</function>\n",
            "\n<function=f>\n</function>\ntrailing\n",
        ] {
            assert_eq!(parse_call(body, &[]), None, "{body:?}");
        }
        // A call cut off inside is dropped: markup, not an answer.
        let cut = "Checking.<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
        assert_eq!(
            spec().splitter().split(cut),
            ("Checking.".to_string(), vec![])
        );
        // No parameters at all is a call with empty arguments.
        let c = parse_call("\n<function=now>\n</function>\n", &[]).unwrap();
        assert_eq!((c.name.as_str(), c.arguments.as_str()), ("now", "{}"));
    }

    #[test]
    fn the_template_decides_the_format_and_the_grammar_follows_it() {
        assert_eq!(
            CallFormat::of_template("<tool_call>\n<function=x>\n<parameter=y>"),
            CallFormat::Xml
        );
        assert_eq!(
            CallFormat::of_template("<tool_call>\n{\"name\": "),
            CallFormat::Json
        );
        let mut s = spec();
        let (g, trigger) = s.grammar().unwrap();
        let minfer_runtime::Grammar::Lark(g) = g else {
            panic!("a Lark grammar")
        };
        assert_eq!(trigger, Some(crate::tools::OPEN));
        assert!(g.starts_with("start: \"\\n\" call \"</tool_call>\" (\"\\n<tool_call>\\n\" call \"</tool_call>\")*\n"), "{g}");
        assert!(
            g.contains("f0_p0: \"<parameter=city>\\n\" xml_text\n"),
            "{g}"
        );
        // No parameter is required here: any of them, in any order.
        assert!(
            g.contains("f0: \"<function=get_weather>\\n\" f0_opt* \"</function>\\n\"\n"),
            "{g}"
        );
        assert!(
            g.contains(
                "f0_p8: \"<parameter=mode>\\n\" (\"on\" | \"off\") \"\\n</parameter>\\n\"\n"
            ),
            "{g}"
        );
        assert!(g.contains("f0_v1: %json {\"type\":\"integer\""), "{g}");
        s.choice = ToolChoice::Required;
        s.parallel = false;
        let (g, trigger) = s.grammar().unwrap();
        let minfer_runtime::Grammar::Lark(g) = g else {
            panic!("a Lark grammar")
        };
        assert_eq!(trigger, None);
        assert!(
            g.starts_with("start: \"<tool_call>\\n\" call \"</tool_call>\"\n"),
            "{g}"
        );
        // Required parameters come first, in their declared order.
        let t = json!([{"type": "function", "function": {"name": "t", "parameters": {
            "type": "object", "properties": {"a": {}, "b": {}, "c": {}},
            "required": ["c", "a"]}}}]);
        let mut s = parse(Some(&t), None, None).unwrap().unwrap();
        s.format = CallFormat::Xml;
        let minfer_runtime::Grammar::Lark(g) = s.grammar().unwrap().0 else {
            panic!("a Lark grammar")
        };
        assert!(
            g.contains("f0: \"<function=t>\\n\" f0_p0 f0_p2 f0_opt* \"</function>\\n\"\n"),
            "{g}"
        );
        assert!(g.contains("f0_opt: f0_p1\n"), "{g}");
    }
}
