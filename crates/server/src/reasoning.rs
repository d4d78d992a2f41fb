//! Reasoning ("thinking") told apart from the answer: models such as Qwen3 and
//! DeepSeek-R1 write their reasoning inside `<think>…</think>` before the answer, and
//! some templates open that block in the prompt already; gpt-oss writes it as harmony's
//! `analysis` channel (`crate::harmony`). [`ThinkSplitter`] splits the
//! generated text, whole or as it streams (a tag cut across tokens is held back until it
//! is whole), and [`Reasoning`] says per request whether to split and whether the block
//! was opened by the prompt. The request fields that switch it are read in
//! `api::thinking`.

use crate::harmony::HarmonySplitter;
pub use crate::part::Part;
use crate::tools::{partial_tag, OPEN as CALL_OPEN};

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
    /// The prompt opened a harmony message (gpt-oss): the output is split by channel
    /// ([`crate::harmony`]) rather than by `<think>` tags.
    pub harmony: bool,
}

impl Reasoning {
    /// A splitter for one choice of this request, or `None` when nothing is split.
    pub fn splitter(&self) -> Option<Splitter> {
        self.split.then(|| {
            if self.harmony {
                Splitter::Harmony(HarmonySplitter::default())
            } else {
                Splitter::Think(ThinkSplitter::new(self.open))
            }
        })
    }

    /// [`Reasoning::splitter`] for a request with tools: a `<tool_call>` in the reasoning
    /// ends it too, and is the answer's ([`ThinkSplitter::ending_at_calls`]).
    pub fn splitter_with_calls(&self) -> Option<Splitter> {
        self.splitter().map(|s| match s {
            Splitter::Think(t) => Splitter::Think(t.ending_at_calls()),
            harmony => harmony,
        })
    }
}

/// One output's splitter, in the format its prompt set up.
#[derive(Debug, Clone)]
pub enum Splitter {
    /// `<think>…</think>` before the answer.
    Think(ThinkSplitter),
    /// harmony channels (gpt-oss).
    Harmony(HarmonySplitter),
}

impl Splitter {
    /// Takes the next piece of output; returns what can be passed on now.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        match self {
            Splitter::Think(s) => s.push(text),
            Splitter::Harmony(s) => s.push(text),
        }
    }

    /// The end of the output: what was held back.
    pub fn finish(&mut self) -> Vec<Part> {
        match self {
            Splitter::Think(s) => s.finish(),
            Splitter::Harmony(s) => s.finish(),
        }
    }
}

/// Whether a rendered chat prompt leaves a reasoning block open for the model to fill
/// (templates that always think, or think unless told not to, end with `<think>\n`).
pub fn opened_by(prompt: &str) -> bool {
    let t = prompt.trim_end();
    t.ends_with(OPEN)
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
    /// A `<tool_call>` ends the block (see [`ThinkSplitter::ending_at_calls`]).
    calls_end: bool,
}

impl ThinkSplitter {
    /// A splitter for one output; `open`: the prompt opened the block already.
    pub fn new(open: bool) -> Self {
        ThinkSplitter {
            state: if open { State::Thinking } else { State::Start },
            buf: String::new(),
            calls_end: false,
        }
    }

    /// This splitter, with a `<tool_call>` ending the reasoning as `</think>` does, the
    /// call itself passed on as answer: a thinking model with tools (Qwen3.5) may open a
    /// call without closing its reasoning, and the call must still reach the tool-call
    /// parser (llama.cpp ends such models' reasoning at either tag).
    pub fn ending_at_calls(mut self) -> Self {
        self.calls_end = true;
        self
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
                    let call = self.calls_end.then(|| self.buf.find(CALL_OPEN)).flatten();
                    let close = self.buf.find(CLOSE);
                    if let Some(at) = call.filter(|&c| close.is_none_or(|e| c < e)) {
                        if at > 0 {
                            out.push(Part::Reasoning(self.buf[..at].to_string()));
                        }
                        self.buf.drain(..at);
                        self.state = State::Content;
                    } else if let Some(end) = close {
                        if end > 0 {
                            out.push(Part::Reasoning(self.buf[..end].to_string()));
                        }
                        self.buf.drain(..end + CLOSE.len());
                        self.state = State::After;
                    } else {
                        let mut held = partial_tag(&self.buf, CLOSE);
                        if self.calls_end {
                            held = held.max(partial_tag(&self.buf, CALL_OPEN));
                        }
                        let cut = self.buf.len() - held;
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
            Part::Call { .. } => {}
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
                Part::Call { .. } => {}
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
    fn a_tool_call_ends_the_reasoning_when_the_request_has_tools() {
        let out = "Need weather.\n<tool_call>\n<function=f>\n</function>\n</tool_call>";
        for step in 1..7 {
            let mut s = ThinkSplitter::new(true).ending_at_calls();
            let chars: Vec<char> = out.chars().collect();
            let mut parts = Vec::new();
            for c in chars.chunks(step) {
                parts.extend(s.push(&c.iter().collect::<String>()));
            }
            parts.extend(s.finish());
            let (mut r, mut c) = (String::new(), String::new());
            for p in parts {
                match p {
                    Part::Reasoning(t) => r.push_str(&t),
                    Part::Content(t) => c.push_str(&t),
                    Part::Call { .. } => panic!("no harmony calls here"),
                }
            }
            assert_eq!(r, "Need weather.\n", "pieces of {step}");
            assert_eq!(c, &out[14..], "pieces of {step}");
        }
        // Without tools the tag is reasoning text; a `</think>` first still closes.
        assert_eq!(split(out, true).0, out);
        let mut s = ThinkSplitter::new(true).ending_at_calls();
        let mut parts = s.push("a</think>b<tool_call>");
        parts.extend(s.finish());
        assert_eq!(
            parts,
            vec![
                Part::Reasoning("a".into()),
                Part::Content("b<tool_call>".into())
            ]
        );
    }

    #[test]
    fn a_prompt_ending_in_an_open_block_opens_the_output() {
        assert!(opened_by("<|im_start|>assistant\n<think>\n"));
        assert!(!opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    }
}
