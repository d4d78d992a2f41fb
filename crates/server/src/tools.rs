//! OpenAI tool calls in the `<tool_call>` format of Qwen-style chat templates: the request's
//! `tools` and `tool_choice` read into a [`ToolSpec`], the grammar that constrains a call,
//! and the parser that splits generated text into content and calls, whole ([`split`])
//! or as it streams ([`StreamSplitter`]). Between the tags a call is written in the
//! format the model's template teaches ([`CallFormat`]): one line of JSON,
//! `{"name": <a tool>, "arguments": <its parameters schema>}` (Qwen2.5, Qwen3, Hermes), or
//! Qwen3-Coder's and Qwen3.5's XML-like blocks (`xml`).

use minfer_runtime::constraint::{bounded_numbers, bounded_whitespace};
use minfer_runtime::Grammar;
use serde_json::{json, Value};

use crate::error::ApiError;

mod bare;
mod refs;
mod xml;

use refs::{rebased, rebased_root, REF_ROOT};

/// The tag that opens a call in the generated text.
pub const OPEN: &str = "<tool_call>";
/// The tag that closes it.
pub const CLOSE: &str = "</tool_call>";

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides: text, or a call once it opens one (the call is then constrained).
    Auto,
    /// No call: the tools are not shown to the model.
    None,
    /// At least one call, of any tool.
    Required,
    /// One call of this function.
    Named(String),
}

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    /// Its name.
    pub name: String,
    /// The JSON schema of its arguments (`{"type": "object"}` when the tool gives none).
    pub parameters: Value,
    /// `strict`: a keyword of `parameters` the grammar cannot enforce refuses the request;
    /// otherwise (OpenAI's default for chat tools) it is left out and reported.
    pub strict: bool,
}

/// How a model writes a call between `<tool_call>` and `</tool_call>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallFormat {
    /// `{"name": ..., "arguments": {...}}` on one line.
    #[default]
    Json,
    /// `<function=NAME>`, then per argument `<parameter=NAME>`, the value on its own
    /// lines, `</parameter>`, then `</function>` (Qwen3-Coder, Qwen3.5).
    Xml,
}

impl CallFormat {
    /// The format a chat template teaches: XML when it writes `<tool_call>`,
    /// `<function=` and `<parameter=` (the test llama.cpp applies too), JSON otherwise.
    pub fn of_template(source: &str) -> CallFormat {
        if ["<tool_call>", "<function=", "<parameter="]
            .iter()
            .all(|t| source.contains(t))
        {
            CallFormat::Xml
        } else {
            CallFormat::Json
        }
    }
}

/// A request's tools.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The `tools` array as given, for the chat template.
    pub defs: Value,
    /// The functions, in order.
    pub functions: Vec<Function>,
    /// `tool_choice`.
    pub choice: ToolChoice,
    /// `parallel_tool_calls`: several calls in one answer (default true, as OpenAI's).
    pub parallel: bool,
    /// How the served model writes calls (set from its chat template once the request
    /// is rendered; JSON until then).
    pub format: CallFormat,
}

fn wrong(field: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("field `{field}` must be {what}")).with_param(field.to_string())
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`; `None` when there are no tools
/// (where `tool_choice` may only be `none` or `auto`).
pub fn parse(
    tools: Option<&Value>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolSpec>, ApiError> {
    let arr = match tools {
        None => &[][..],
        Some(Value::Array(a)) => a.as_slice(),
        Some(_) => return Err(wrong("tools", "an array of tools")),
    };
    let mut functions = Vec::with_capacity(arr.len());
    for (i, t) in arr.iter().enumerate() {
        let at = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(wrong(&format!("{at}.type"), "\"function\""));
        }
        let f = t
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| wrong(&format!("{at}.function"), "an object"))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| {
                !n.is_empty()
                    && n.len() <= 64
                    && n.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            })
            .ok_or_else(|| {
                wrong(
                    &format!("{at}.function.name"),
                    "1 to 64 letters, digits, `_` or `-`",
                )
            })?;
        if functions.iter().any(|g: &Function| g.name == name) {
            return Err(ApiError::bad_request(format!(
                "field `{at}.function.name`: `{name}` names two tools"
            )));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(wrong(&format!("{at}.function.parameters"), "an object")),
        };
        let strict = match f.get("strict") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(wrong(&format!("{at}.function.strict"), "a boolean")),
        };
        functions.push(Function {
            name: name.to_string(),
            parameters,
            strict,
        });
    }
    let choice = match choice {
        None => ToolChoice::Auto,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(v @ Value::Object(_)) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    wrong(
                        "tool_choice",
                        "`auto`, `none`, `required` or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            ToolChoice::Named(name.to_string())
        }
        Some(_) => return Err(wrong(
            "tool_choice",
            "`auto`, `none`, `required` or {\"type\": \"function\", \"function\": {\"name\": ...}}",
        )),
    };
    if functions.is_empty() {
        return match choice {
            ToolChoice::Auto | ToolChoice::None => Ok(None),
            _ => Err(ApiError::bad_request(
                "field `tool_choice` asks for a tool call, but `tools` is empty",
            )
            .with_param("tool_choice")),
        };
    }
    if let ToolChoice::Named(n) = &choice {
        if !functions.iter().any(|f| &f.name == n) {
            return Err(ApiError::bad_request(format!(
                "field `tool_choice` names function `{n}`, which is not in `tools`"
            ))
            .with_param("tool_choice"));
        }
    }
    Ok(Some(ToolSpec {
        defs: Value::Array(arr.to_vec()),
        functions,
        choice,
        parallel: parallel.unwrap_or(true),
        format: CallFormat::Json,
    }))
}

impl ToolSpec {
    /// Whether the tools are shown to the model and calls are parsed from its output.
    pub fn enabled(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The grammar that constrains calls, and the text that starts it when the model may
    /// answer in text instead (`auto`). `None` when no call may be made.
    pub fn grammar(&self) -> Option<(Grammar, Option<&'static str>)> {
        let lazy = self.choice == ToolChoice::Auto;
        let g = self.calls_grammar(lazy, "start")?;
        Some((Grammar::Lark(g), lazy.then_some(OPEN)))
    }

    /// The Lark rules of the calls this request may make, the calls themselves under
    /// rule `top`; `lazy`: they start after the model's own `<tool_call>`. `None` when
    /// no call may be made.
    fn calls_grammar(&self, lazy: bool, top: &str) -> Option<String> {
        let funcs: Vec<&Function> = match &self.choice {
            ToolChoice::None => return None,
            ToolChoice::Named(n) => self.functions.iter().filter(|f| &f.name == n).collect(),
            ToolChoice::Auto | ToolChoice::Required => self.functions.iter().collect(),
        };
        let parallel = self.parallel && !matches!(self.choice, ToolChoice::Named(_));
        Some(match self.format {
            CallFormat::Json => json_grammar(&funcs, lazy, parallel, top),
            CallFormat::Xml => xml::grammar(&funcs, lazy, parallel, top),
        })
    }

    /// The grammar of an answer when the request also asks for JSON output (`output`:
    /// a JSON schema or any JSON object), and the text that starts it. With `auto` the
    /// answer is calls or the JSON answer, chosen by the model from its first token (an
    /// agent with an output type sends both: it calls tools, then answers in the
    /// schema); where a call is required or named, the answer is that call, since the
    /// output format shapes a text answer and there is none. `None` when no call may be
    /// made, or when `output` is not JSON (see [`check_output`]).
    pub fn grammar_with_output(&self, output: &Grammar) -> Option<(Grammar, Option<&'static str>)> {
        if self.choice != ToolChoice::Auto {
            return self.grammar();
        }
        let schema = match output {
            Grammar::JsonSchema(s) => s.clone(),
            Grammar::JsonObject => json!({"type": "object"}),
            _ => return None,
        };
        let calls = self.calls_grammar(false, "calls")?;
        let schema = bounded_whitespace(bounded_numbers(schema));
        Some((
            Grammar::Lark(format!(
                "start: calls | answer\nanswer: %json {schema}\n{calls}"
            )),
            None,
        ))
    }

    /// A splitter for one output of this request: calls read in the model's format,
    /// XML argument values typed by each tool's parameters.
    pub fn splitter(&self) -> StreamSplitter {
        let names = self.functions.iter().map(|f| f.name.clone()).collect();
        StreamSplitter::new(
            match self.format {
                CallFormat::Json => CallParser::Json,
                CallFormat::Xml => CallParser::Xml(self.functions.clone()),
            },
            // A model taught JSON calls may write one without its tags.
            (self.format == CallFormat::Json && self.enabled()).then_some(names),
            self.parallel,
        )
        .forced(matches!(
            self.choice,
            ToolChoice::Required | ToolChoice::Named(_)
        ))
    }
}

/// The grammar of JSON calls: `{"name": <a tool>, "arguments": <its parameters>}` on one
/// line between the tags; `lazy`: it starts after the model's own `<tool_call>`.
/// `top` names the rule the calls are.
///
/// The tags are text, as in llama.cpp's call grammars: the mask lets the model take its
/// vocabulary's `<tool_call>` token or spell the tag in pieces, whichever it prefers.
/// Allowing only the token was tried: the default model then wrote the same call again
/// and again after each `</tool_call>` token until the token limit, on every prompt
/// tried, where with text tags it ends after its call.
fn json_grammar(funcs: &[&Function], lazy: bool, parallel: bool, top: &str) -> String {
    let mut g = String::new();
    let body = "\"\\n\" call \"\\n</tool_call>\"";
    let repeat = if parallel {
        format!(" (\"\\n<tool_call>\" {body})*")
    } else {
        String::new()
    };
    if lazy {
        // After the trigger (the model's own `<tool_call>`), the call itself.
        g.push_str(&format!("{top}: {body}{repeat}\n"));
    } else {
        g.push_str(&format!("{top}: \"<tool_call>\" {body}{repeat}\n"));
    }
    let alts: Vec<String> = (0..funcs.len()).map(|i| format!("f{i}")).collect();
    g.push_str(&format!("call: {}\n", alts.join(" | ")));
    for (i, f) in funcs.iter().enumerate() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "name": {"const": f.name},
                "arguments": rebased(&f.parameters),
            },
            "required": ["name", "arguments"],
            "additionalProperties": false,
        });
        if let Some(root) = rebased_root(&f.parameters) {
            schema["$defs"] = json!({ REF_ROOT: root });
        }
        // Calls are one line in this format: at most a space between two tokens.
        schema["x-guidance"] = json!({"whitespace_pattern": r"\x20", "lenient": !f.strict});
        let schema = bounded_numbers(schema);
        g.push_str(&format!("f{i}: %json {schema}\n"));
    }
    g
}

/// Refuses tools beside an output grammar that cannot share an answer with them: a
/// regular expression, a Lark or GBNF grammar constrains the whole text, where a call
/// would be a different text. JSON output can ([`ToolSpec::grammar_with_output`]).
/// `output_field` names the request's output field in the message.
pub fn check_output(
    tools: Option<&ToolSpec>,
    output: Option<&Grammar>,
    output_field: &str,
) -> Result<(), ApiError> {
    let json = matches!(
        output,
        None | Some(Grammar::JsonSchema(_) | Grammar::JsonObject)
    );
    if json || tools.is_none_or(|t| !t.enabled()) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "a tool call and the grammar of `{output_field}` cannot both constrain one answer: \
         use a JSON schema there, or `tool_choice: none`"
    ))
    .with_param("tool_choice"))
}

/// JSON-format tools of these names without parameters, as a test's request gives them.
#[cfg(test)]
pub(crate) fn test_spec(names: &[&str]) -> ToolSpec {
    let tools: Vec<Value> = names
        .iter()
        .map(|n| json!({"type": "function", "function": {"name": n}}))
        .collect();
    match parse(Some(&Value::Array(tools)), None, None) {
        Ok(Some(s)) => s,
        other => panic!("test tools: {other:?}"),
    }
}

/// One call found in the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The function's name.
    pub name: String,
    /// Its arguments as JSON text.
    pub arguments: String,
}

impl Call {
    /// A call to `name` with `arguments` as the model wrote them: JSON written compactly
    /// (as [`parse_json_call`] writes an object), other text as it is.
    pub fn new(name: String, arguments: &str) -> Self {
        let arguments = match serde_json::from_str::<Value>(arguments.trim()) {
            Ok(v) => v.to_string(),
            Err(_) => arguments.to_string(),
        };
        Call { name, arguments }
    }
}

/// How a call's body is read.
#[derive(Debug, Clone, Default)]
enum CallParser {
    /// One line of JSON.
    #[default]
    Json,
    /// XML-like blocks, argument values typed by these functions' parameters.
    Xml(Vec<Function>),
}

impl CallParser {
    fn parse(&self, body: &str) -> Option<Call> {
        match self {
            CallParser::Json => parse_json_call(body),
            CallParser::Xml(functions) => xml::parse_call(body, functions),
        }
    }
}

/// A JSON call's body (the text between the tags) as a call; `None` when it is not one.
fn parse_json_call(body: &str) -> Option<Call> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").cloned().unwrap_or_else(|| json!({}));
    // Arguments sent as a JSON string stay that string; an object is written compactly.
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(Call { name, arguments })
}

mod stream;
pub(crate) use stream::partial_tag;
pub use stream::{split, Piece, StreamSplitter};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_s_grammar_keeps_the_parameters_its_references_point_into() {
        let params = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}},
            "$defs": {"A": {"enum": ["x"]}}});
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": params}}]);
        let s = parse(Some(&tools), Some(&json!("required")), None)
            .unwrap()
            .unwrap();
        let (Grammar::Lark(g), None) = s.grammar().unwrap() else {
            panic!("a required call's grammar");
        };
        assert!(g.contains("\"__tool_parameters\""), "{g}");
    }

    #[test]
    fn json_output_beside_tools_is_one_grammar_and_other_grammars_are_refused() {
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let auto = parse(Some(&tools), None, None).unwrap().unwrap();
        let schema = Grammar::JsonSchema(json!({"type": "object"}));
        let (Grammar::Lark(g), None) = auto.grammar_with_output(&schema).unwrap() else {
            panic!("auto with a schema: calls or the answer, from the first token");
        };
        assert!(g.starts_with("start: calls | answer\n"), "{g}");
        assert!(g.contains("calls: \"<tool_call>\""), "{g}");
        assert!(auto.grammar_with_output(&Grammar::JsonObject).is_some());
        assert!(auto
            .grammar_with_output(&Grammar::Regex("a".into()))
            .is_none());
        // A required call is the answer whatever the output format says.
        let req = parse(Some(&tools), Some(&json!("required")), None)
            .unwrap()
            .unwrap();
        assert_eq!(req.grammar_with_output(&schema), req.grammar());
        assert!(check_output(Some(&auto), Some(&schema), "response_format").is_ok());
        assert!(check_output(Some(&auto), None, "response_format").is_ok());
        let e = check_output(
            Some(&auto),
            Some(&Grammar::Gbnf("root ::= \"a\"".into())),
            "grammar",
        )
        .unwrap_err();
        assert!(e.to_string().contains("`grammar`"), "{e}");
        let none = parse(Some(&tools), Some(&json!("none")), None)
            .unwrap()
            .unwrap();
        assert!(check_output(Some(&none), Some(&Grammar::Regex("a".into())), "x").is_ok());
    }

    #[test]
    fn tool_choices_are_read_and_checked_by_name() {
        let tools = json!([{"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]);
        let s = parse(Some(&tools), None, None).unwrap().unwrap();
        assert_eq!(s.choice, ToolChoice::Auto);
        assert!(s.parallel);
        let (_, trigger) = s.grammar().unwrap();
        assert_eq!(trigger, Some(OPEN));
        let named = json!({"type": "function", "function": {"name": "f"}});
        let s = parse(Some(&tools), Some(&named), Some(false))
            .unwrap()
            .unwrap();
        assert_eq!(s.choice, ToolChoice::Named("f".into()));
        assert!(s.grammar().unwrap().1.is_none());
        let none = parse(Some(&tools), Some(&json!("none")), None)
            .unwrap()
            .unwrap();
        assert!(none.grammar().is_none() && !none.enabled());
        assert!(parse(None, Some(&json!("auto")), None).unwrap().is_none());
        for (t, c, want) in [
            (
                tools.clone(),
                json!({"type": "function", "function": {"name": "g"}}),
                "`g`",
            ),
            (json!([]), json!("required"), "`tools` is empty"),
            (tools.clone(), json!("sometimes"), "`tool_choice`"),
            (
                json!([{"type": "function", "function": {"name": "a b"}}]),
                json!("auto"),
                "tools[0].function.name",
            ),
            (
                json!([{"type": "retrieval"}]),
                json!("auto"),
                "tools[0].type",
            ),
        ] {
            let e = parse(Some(&t), Some(&c), None).unwrap_err();
            assert!(e.message.contains(want), "{}", e.message);
        }
    }
}
