//! OpenAI tool calls in the `<tool_call>` format of Qwen-style chat templates: the request's
//! `tools` and `tool_choice` read into a [`ToolSpec`], the grammar that constrains a call,
//! and the parser that splits generated text into content and calls, whole ([`split`])
//! or as it streams ([`StreamSplitter`]). Between the tags a call is written in the
//! format the model's template teaches ([`CallFormat`]): one line of JSON,
//! `{"name": <a tool>, "arguments": <its parameters schema>}` (Qwen2.5, Qwen3, Hermes), or
//! Qwen3-Coder's and Qwen3.5's XML-like blocks (`xml`).

use minfer_runtime::Grammar;
use serde_json::{json, Value};

use crate::error::ApiError;

mod bare;
mod xml;

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
        let funcs: Vec<&Function> = match &self.choice {
            ToolChoice::None => return None,
            ToolChoice::Named(n) => self.functions.iter().filter(|f| &f.name == n).collect(),
            ToolChoice::Auto | ToolChoice::Required => self.functions.iter().collect(),
        };
        let parallel = self.parallel && !matches!(self.choice, ToolChoice::Named(_));
        let lazy = self.choice == ToolChoice::Auto;
        let g = match self.format {
            CallFormat::Json => json_grammar(&funcs, lazy, parallel),
            CallFormat::Xml => xml::grammar(&funcs, lazy, parallel),
        };
        Some((Grammar::Lark(g), lazy.then_some(OPEN)))
    }

    /// A splitter for one output of this request: calls read in the model's format,
    /// XML argument values typed by each tool's parameters.
    pub fn splitter(&self) -> StreamSplitter {
        let names = self.functions.iter().map(|f| f.name.clone()).collect();
        StreamSplitter {
            parser: match self.format {
                CallFormat::Json => CallParser::Json,
                CallFormat::Xml => CallParser::Xml(self.functions.clone()),
            },
            // A model taught JSON calls may write one without its tags.
            bare: (self.format == CallFormat::Json && self.enabled()).then_some(names),
            parallel: self.parallel,
            ..StreamSplitter::default()
        }
    }
}

/// The grammar of JSON calls: `{"name": <a tool>, "arguments": <its parameters>}` on one
/// line between the tags; `lazy`: it starts after the model's own `<tool_call>`.
fn json_grammar(funcs: &[&Function], lazy: bool, parallel: bool) -> String {
    let mut g = String::new();
    let body = "\"\\n\" call \"\\n</tool_call>\"";
    let repeat = if parallel {
        format!(" (\"\\n<tool_call>\" {body})*")
    } else {
        String::new()
    };
    if lazy {
        // After the trigger (the model's own `<tool_call>`), the call itself.
        g.push_str(&format!("start: {body}{repeat}\n"));
    } else {
        g.push_str(&format!("start: \"<tool_call>\" {body}{repeat}\n"));
    }
    let alts: Vec<String> = (0..funcs.len()).map(|i| format!("f{i}")).collect();
    g.push_str(&format!("call: {}\n", alts.join(" | ")));
    for (i, f) in funcs.iter().enumerate() {
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"const": f.name},
                "arguments": f.parameters,
            },
            "required": ["name", "arguments"],
            "additionalProperties": false,
        });
        // Calls are one line in this format: at most a space between two tokens.
        let mut schema = schema;
        schema["x-guidance"] = json!({"whitespace_pattern": r"\x20", "lenient": !f.strict});
        g.push_str(&format!("f{i}: %json {schema}\n"));
    }
    g
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

/// Splits a whole output of JSON calls into its text and its calls (see
/// [`StreamSplitter::split`]).
pub fn split(text: &str) -> (String, Vec<Call>) {
    StreamSplitter::default().split(text)
}

impl StreamSplitter {
    /// Splits a whole output into its text and its calls. A block that does not parse as
    /// a call (cut off by the token limit) stays in the text, as generated.
    pub fn split(mut self, text: &str) -> (String, Vec<Call>) {
        let (mut content, mut calls) = (String::new(), Vec::new());
        let mut pieces = self.push(text);
        pieces.extend(self.finish());
        for piece in pieces {
            match piece {
                Piece::Text(t) => content.push_str(&t),
                Piece::Call(c) => calls.push(c),
            }
        }
        (content, calls)
    }
}

/// What the splitter hands on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text outside any call.
    Text(String),
    /// A complete call.
    Call(Call),
}

/// Splits streamed text into content and calls: text is passed on as soon as it cannot
/// be the start of an opening tag; a call is passed on once its closing tag arrives.
/// The default reads JSON calls; [`ToolSpec::splitter`] reads the request's format and
/// also takes an answer that is only a call's JSON, without the tags, as that call
/// (`bare`): such a start is held back until it is one or cannot be.
#[derive(Debug, Default)]
pub struct StreamSplitter {
    parser: CallParser,
    buf: String,
    in_call: bool,
    /// A call has ended: the blank between it and the next call, or the end, is no text.
    after_call: bool,
    /// The request's tool names, where a call without tags is read at the start.
    bare: Option<Vec<String>>,
    /// Whether a bare array of calls is read (`parallel_tool_calls`).
    parallel: bool,
    /// The start of the answer has been read as text: no bare call follows.
    started: bool,
}

/// Length of the longest suffix of `s` that is a proper prefix of `tag`.
pub(crate) fn partial_tag(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && s.ends_with(&tag[..n]))
        .unwrap_or(0)
}

impl StreamSplitter {
    /// Takes the next piece of output; returns what can be passed on now.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            if let (Some(names), false, false) = (&self.bare, self.in_call, self.started) {
                match bare::read(&self.buf, names, self.parallel) {
                    bare::Bare::Wait if self.buf.len() <= bare::MAX_HELD => break,
                    bare::Bare::Calls(calls, used) => {
                        out.extend(calls.into_iter().map(Piece::Call));
                        self.buf.drain(..used);
                        // More bare calls may follow, each on its own.
                        self.after_call = true;
                        continue;
                    }
                    _ => self.started = true,
                }
            }
            if self.in_call {
                let Some(end) = self.buf.find(CLOSE) else {
                    break;
                };
                let body = self.buf[..end].to_string();
                self.buf.drain(..end + CLOSE.len());
                self.in_call = false;
                match self.parser.parse(&body) {
                    Some(c) => out.push(Piece::Call(c)),
                    None => out.push(Piece::Text(format!("{OPEN}{body}{CLOSE}"))),
                }
                self.after_call = true;
            } else if self.after_call && self.buf.starts_with('\n') {
                // The newline between consecutive calls belongs to neither.
                let next = format!("\n{OPEN}");
                if self.buf.starts_with(&next) {
                    self.buf.drain(..1);
                } else if next.starts_with(&self.buf) {
                    break;
                } else {
                    self.after_call = false;
                }
            } else if let Some(at) = self.buf.find(OPEN) {
                let before = self.buf[..at].to_string();
                if !before.is_empty() {
                    out.push(Piece::Text(before));
                }
                self.buf.drain(..at + OPEN.len());
                self.in_call = true;
            } else {
                let keep = partial_tag(&self.buf, OPEN);
                let cut = self.buf.len() - keep;
                if cut > 0 {
                    out.push(Piece::Text(self.buf[..cut].to_string()));
                    self.buf.drain(..cut);
                }
                break;
            }
        }
        out
    }

    /// The end of the output: whatever is held back, as text (an unclosed call too).
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.buf);
        let text = if std::mem::take(&mut self.in_call) {
            format!("{OPEN}{rest}")
        } else if self.after_call && rest.trim().is_empty() {
            String::new()
        } else {
            rest
        };
        if text.is_empty() {
            Vec::new()
        } else {
            vec![Piece::Text(text)]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_split_from_text_whole_and_streamed_in_any_pieces() {
        let out = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"t\", \"arguments\": {}}\n</tool_call>\n";
        let (text, calls) = split(out);
        assert_eq!(text, "Let me check.");
        assert_eq!(
            calls,
            vec![
                Call {
                    name: "get_weather".into(),
                    arguments: "{\"city\":\"Paris\"}".into()
                },
                Call {
                    name: "t".into(),
                    arguments: "{}".into()
                }
            ]
        );
        for step in 1..8 {
            let (text, got) = stream(StreamSplitter::default(), out, step);
            assert_eq!(
                (text.as_str(), got.len()),
                ("Let me check.", 2),
                "step {step}"
            );
        }
        // Text that only looks like the start of a tag is passed on at the end.
        assert_eq!(split("a <tool"), ("a <tool".into(), vec![]));
        // A cut-off call stays text.
        assert_eq!(
            split("<tool_call>\n{\"name\": "),
            ("<tool_call>\n{\"name\": ".into(), vec![])
        );
    }

    /// Every piece of `out` pushed through `s` in chunks of `step` characters, then its
    /// end: the text and the calls.
    fn stream(mut s: StreamSplitter, out: &str, step: usize) -> (String, Vec<Call>) {
        let chars: Vec<char> = out.chars().collect();
        let mut got = Vec::new();
        for chunk in chars.chunks(step) {
            got.extend(s.push(&chunk.iter().collect::<String>()));
        }
        got.extend(s.finish());
        let (mut text, mut calls) = (String::new(), Vec::new());
        for p in got {
            match p {
                Piece::Text(t) => text.push_str(&t),
                Piece::Call(c) => calls.push(c),
            }
        }
        (text, calls)
    }

    #[test]
    fn an_answer_that_is_only_a_calls_json_is_that_call() {
        let spec = test_spec(&["add", "get_weather"]);
        let add = Call {
            name: "add".into(),
            arguments: "{\"a\":3,\"b\":4}".into(),
        };
        for (out, text, calls) in [
            (
                "{\"name\": \"add\", \"arguments\": {\"a\": 3, \"b\": 4}}",
                "",
                vec![add.clone()],
            ),
            (
                "\n```json\n{\"name\": \"add\", \"arguments\": {\"a\": 3, \"b\": 4}}\n```\n",
                "",
                vec![add.clone()],
            ),
            (
                "{\"name\": \"add\", \"arguments\": {\"a\": 3, \"b\": 4}}\nDone.",
                "\nDone.",
                vec![add.clone()],
            ),
            // JSON that is not a call of these tools, JSON after text, a cut-off call:
            // text, as written.
            ("{\"result\": 7}", "{\"result\": 7}", vec![]),
            (
                "{\"name\": \"rm\", \"arguments\": {}}",
                "{\"name\": \"rm\", \"arguments\": {}}",
                vec![],
            ),
            (
                "Sure: {\"name\": \"add\", \"arguments\": {}}",
                "Sure: {\"name\": \"add\", \"arguments\": {}}",
                vec![],
            ),
            (
                "{\"name\": \"add\", \"argu",
                "{\"name\": \"add\", \"argu",
                vec![],
            ),
        ] {
            for step in [1, 2, 3, 7, 1000] {
                assert_eq!(
                    stream(spec.splitter(), out, step),
                    (text.to_string(), calls.clone()),
                    "{out:?} in pieces of {step}"
                );
            }
        }
        // Without tools shown (`tool_choice: none`), and in the plain splitter, the
        // JSON is text.
        let call = "{\"name\": \"add\", \"arguments\": {}}";
        assert_eq!(split(call), (call.to_string(), vec![]));
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
