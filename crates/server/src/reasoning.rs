//! Reasoning ("thinking") told apart from the answer: models such as Qwen3 and
//! DeepSeek-R1 write their reasoning inside `<think>…</think>` before the answer, and
//! some templates open that block in the prompt already. [`ThinkSplitter`] splits the
//! generated text, whole or as it streams (a tag cut across tokens is held back until it
//! is whole), and [`Reasoning`] says per request whether to split and whether the block
//! was opened by the prompt. The request switches live here too: llama-server's
//! `reasoning_format`, and `chat_template_kwargs` / `enable_thinking`, which reach the
//! chat template as variables.

use serde_json::Value;

use crate::api::fields::{field, opt_bool, opt_str, wrong, Object};
use crate::error::ApiError;
use crate::tools::partial_tag;

/// The tag that opens a reasoning block.
pub const OPEN: &str = "<think>";
/// The tag that closes it.
pub const CLOSE: &str = "</think>";

/// Whether and how a request's output is split into reasoning and answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reasoning {
    /// Split the reasoning out (off: it stays in the answer text, as generated).
    pub split: bool,
    /// The prompt ended inside an open `<think>` block: the output starts as reasoning.
    pub open: bool,
}

impl Reasoning {
    /// A splitter for one choice of this request, or `None` when nothing is split.
    pub fn splitter(&self) -> Option<ThinkSplitter> {
        self.split.then(|| ThinkSplitter::new(self.open))
    }
}

/// Whether a rendered chat prompt leaves a reasoning block open for the model to fill
/// (templates that always think, or think unless told not to, end with `<think>\n`).
pub fn opened_by(prompt: &str) -> bool {
    let t = prompt.trim_end();
    t.ends_with(OPEN)
}

/// llama-server's `reasoning_format` of a chat request: `none` leaves the reasoning in
/// the answer; `deepseek` and `auto` (the default) split it out. Other formats
/// (`deepseek-legacy`, which keeps the tags in the answer as well) are refused by name.
pub fn split_requested(obj: &Object) -> Result<bool, ApiError> {
    match opt_str(obj, "reasoning_format")? {
        None | Some("auto") | Some("deepseek") => Ok(true),
        Some("none") => Ok(false),
        Some(other) => Err(ApiError::bad_request(format!(
            "field `reasoning_format` is `{other}`: expected none, deepseek or auto"
        ))
        .with_param("reasoning_format")),
    }
}

/// The extra chat template variables a request gives: `chat_template_kwargs` (an
/// object, as llama-server and vLLM take it), and `enable_thinking` at the top level
/// (a shorthand some clients send), which wins over the same key in the kwargs.
pub fn template_kwargs(obj: &Object) -> Result<Object, ApiError> {
    let mut out = match field(obj, "chat_template_kwargs") {
        None => Object::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(wrong("chat_template_kwargs", "an object")),
    };
    if let Some(on) = opt_bool(obj, "enable_thinking")? {
        out.insert("enable_thinking".into(), Value::Bool(on));
    }
    if out.get("enable_thinking").is_some_and(|v| !v.is_boolean()) {
        return Err(wrong("chat_template_kwargs.enable_thinking", "a boolean"));
    }
    Ok(out)
}

/// The template variables for a thinking switch given as a plain boolean (ollama's
/// `think`, Anthropic's `thinking`): `enable_thinking` set to it, or nothing.
pub fn thinking_kwargs(on: Option<bool>) -> Object {
    let mut out = Object::new();
    if let Some(on) = on {
        out.insert("enable_thinking".into(), Value::Bool(on));
    }
    out
}

/// A piece of split output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Text inside the reasoning block.
    Reasoning(String),
    /// Answer text.
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but blanks yet: a `<think>` may still open.
    Start,
    /// Inside the block.
    Thinking,
    /// Just after `</think>`: the blank lines before the answer belong to neither.
    After,
    /// The answer: everything passes as content.
    Content,
}

/// Splits generated text into reasoning and answer. Only a block at the very start of
/// the output counts (after blanks), or one the prompt opened; a `<think>` later in an
/// answer is answer text. Text that might be the start of a tag is held back until the
/// next piece shows what it is; everything else passes on at once.
#[derive(Debug, Clone)]
pub struct ThinkSplitter {
    state: State,
    buf: String,
}

impl ThinkSplitter {
    /// A splitter for one output; `open`: the prompt opened the block already.
    pub fn new(open: bool) -> Self {
        ThinkSplitter {
            state: if open { State::Thinking } else { State::Start },
            buf: String::new(),
        }
    }

    /// Takes the next piece of output; returns what can be passed on now.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.buf = rest.to_string();
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(t) {
                        break;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Thinking => {
                    if let Some(end) = self.buf.find(CLOSE) {
                        if end > 0 {
                            out.push(Part::Reasoning(self.buf[..end].to_string()));
                        }
                        self.buf.drain(..end + CLOSE.len());
                        self.state = State::After;
                    } else {
                        let cut = self.buf.len() - partial_tag(&self.buf, CLOSE);
                        if cut > 0 {
                            out.push(Part::Reasoning(self.buf[..cut].to_string()));
                            self.buf.drain(..cut);
                        }
                        break;
                    }
                }
                State::After => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        self.buf.clear();
                        break;
                    }
                    self.buf = t.to_string();
                    self.state = State::Content;
                }
                State::Content => {
                    if !self.buf.is_empty() {
                        out.push(Part::Content(std::mem::take(&mut self.buf)));
                    }
                    break;
                }
            }
        }
        out
    }

    /// The end of the output: what was held back (a reasoning block cut off by the
    /// token limit stays reasoning; blanks or a partial tag at the start are content).
    pub fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.buf);
        if rest.is_empty() {
            return Vec::new();
        }
        match self.state {
            State::Thinking => vec![Part::Reasoning(rest)],
            State::After => Vec::new(),
            State::Start | State::Content => vec![Part::Content(rest)],
        }
    }
}

/// Splits a whole output into (reasoning, answer); `open` as for [`ThinkSplitter::new`].
pub fn split(text: &str, open: bool) -> (String, String) {
    let mut s = ThinkSplitter::new(open);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for p in s.push(text).into_iter().chain(s.finish()) {
        match p {
            Part::Reasoning(r) => reasoning.push_str(&r),
            Part::Content(c) => content.push_str(&c),
        }
    }
    (reasoning, content)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The output fed in pieces of `step` characters, joined per kind.
    fn streamed(text: &str, open: bool, step: usize) -> (String, String) {
        let mut s = ThinkSplitter::new(open);
        let chars: Vec<char> = text.chars().collect();
        let mut parts = Vec::new();
        for c in chars.chunks(step) {
            parts.extend(s.push(&c.iter().collect::<String>()));
        }
        parts.extend(s.finish());
        let mut r = (String::new(), String::new());
        for p in parts {
            match p {
                Part::Reasoning(t) => r.0.push_str(&t),
                Part::Content(t) => r.1.push_str(&t),
            }
        }
        r
    }

    #[test]
    fn reasoning_is_split_whole_and_in_pieces_cut_anywhere() {
        let cases: [(&str, bool, &str, &str); 8] = [
            (
                "<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.",
                false,
                "\nLet me see: 2+2.\n",
                "It is 4.",
            ),
            ("\n<think>a < b</think>yes", false, "a < b", "yes"),
            // The prompt opened the block: the output starts inside it.
            ("2+2 is 4.\n</think>\n\nFour.", true, "2+2 is 4.\n", "Four."),
            // Cut off by the token limit inside the block: all reasoning.
            ("<think>still going </thi", false, "still going </thi", ""),
            // No block: all answer, a later tag included.
            (
                "Hello <think>x</think>",
                false,
                "",
                "Hello <think>x</think>",
            ),
            ("<thin", false, "", "<thin"),
            ("", true, "", ""),
            // `enable_thinking: false` templates prefill an empty block: the answer
            // follows the close tag the model never writes.
            ("Plain answer", false, "", "Plain answer"),
        ];
        for (text, open, reasoning, content) in cases {
            assert_eq!(
                split(text, open),
                (reasoning.into(), content.into()),
                "{text:?}"
            );
            for step in 1..6 {
                assert_eq!(
                    streamed(text, open, step),
                    (reasoning.into(), content.into()),
                    "{text:?} in pieces of {step}"
                );
            }
        }
    }

    #[test]
    fn reasoning_passes_on_as_soon_as_it_cannot_be_a_tag() {
        let mut s = ThinkSplitter::new(false);
        assert_eq!(s.push("<th"), vec![]);
        assert_eq!(s.push("ink>abc</"), vec![Part::Reasoning("abc".into())]);
        assert_eq!(s.push("b>"), vec![Part::Reasoning("</b>".into())]);
        assert_eq!(s.push("</think>"), vec![]);
        assert_eq!(s.push("\n\n"), vec![]);
        assert_eq!(s.push("ok"), vec![Part::Content("ok".into())]);
        assert_eq!(s.finish(), vec![]);
    }

    #[test]
    fn switches_are_read_and_bad_values_named() {
        let obj = |v: Value| v.as_object().cloned().unwrap();
        assert!(split_requested(&obj(serde_json::json!({}))).unwrap());
        assert!(!split_requested(&obj(serde_json::json!({"reasoning_format": "none"}))).unwrap());
        let e = split_requested(&obj(serde_json::json!({"reasoning_format": "x"}))).unwrap_err();
        assert!(e.message.contains("reasoning_format"), "{}", e.message);
        let k = template_kwargs(&obj(serde_json::json!({
            "chat_template_kwargs": {"enable_thinking": true, "custom": 1},
            "enable_thinking": false,
        })))
        .unwrap();
        assert_eq!(k["enable_thinking"], false);
        assert_eq!(k["custom"], 1);
        let e = template_kwargs(&obj(serde_json::json!({"chat_template_kwargs": 3}))).unwrap_err();
        assert!(e.message.contains("chat_template_kwargs"), "{}", e.message);
        assert!(opened_by("<|im_start|>assistant\n<think>\n"));
        assert!(!opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    }
}
