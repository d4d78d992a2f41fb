//! The harmony format of gpt-oss answers: a turn is a sequence of messages, each a header
//! (`<|start|>assistant`, `<|channel|>NAME`, optional recipient and constraint) then
//! `<|message|>`, its text, and `<|end|>` (the turn's last message ends with `<|return|>`
//! or `<|call|>`, which end generation and are not rendered). The chat template leaves
//! the prompt at `<|start|>assistant`, so the output opens with the first message's
//! `<|channel|>`. [`HarmonySplitter`] turns the `analysis` channel into reasoning and the
//! others (`final`, `commentary`) into answer text, whole or as it streams (a marker cut
//! across tokens is held back until it is whole). Output that does not open with a
//! header passes as answer text.

use crate::reasoning::Part;
use crate::tools::partial_tag;

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";

/// Whether a rendered chat prompt leaves a harmony assistant message for the model to
/// write (the gpt-oss template ends its generation prompt with `<|start|>assistant`).
pub fn opened_by(prompt: &str) -> bool {
    prompt.trim_end().ends_with("<|start|>assistant")
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Reading a message header up to `<|message|>`.
    Header,
    /// Inside a message of the channel (reasoning when `analysis`).
    Body { reasoning: bool },
    /// The output is not harmony-formatted: everything is answer text.
    Plain,
}

/// Splits harmony-formatted output into reasoning (`analysis`) and answer (the other
/// channels), dropping the message markers.
#[derive(Debug, Clone)]
pub struct HarmonySplitter {
    state: State,
    buf: String,
}

impl Default for HarmonySplitter {
    fn default() -> Self {
        HarmonySplitter {
            state: State::Header,
            buf: String::new(),
        }
    }
}

impl HarmonySplitter {
    /// Takes the next piece of output; returns what can be passed on now.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Header => {
                    let t = self.buf.trim_start();
                    let opens = t.starts_with(CHANNEL) || t.starts_with(START);
                    let may_open = CHANNEL.starts_with(t) || START.starts_with(t);
                    if !opens {
                        if !may_open {
                            self.state = State::Plain;
                        }
                        if may_open {
                            break;
                        }
                        continue;
                    }
                    let Some(at) = t.find(MESSAGE) else {
                        break;
                    };
                    let channel = t[..at]
                        .split(CHANNEL)
                        .nth(1)
                        .and_then(|c| c.split([' ', '<']).next())
                        .unwrap_or("");
                    self.state = State::Body {
                        reasoning: channel == "analysis",
                    };
                    let rest = t[at + MESSAGE.len()..].to_string();
                    self.buf = rest;
                }
                State::Body { reasoning } => {
                    let part = |s: &str| {
                        if reasoning {
                            Part::Reasoning(s.to_string())
                        } else {
                            Part::Content(s.to_string())
                        }
                    };
                    // A message ends at `<|end|>`, or where the next header starts.
                    let end = [END, START]
                        .iter()
                        .filter_map(|&m| self.buf.find(m).map(|i| (i, m.len(), m == END)))
                        .min();
                    if let Some((at, len, is_end)) = end {
                        if at > 0 {
                            out.push(part(&self.buf[..at]));
                        }
                        let skip = if is_end { at + len } else { at };
                        self.buf.drain(..skip);
                        self.state = State::Header;
                    } else {
                        let hold = partial_tag(&self.buf, END).max(partial_tag(&self.buf, START));
                        let cut = self.buf.len() - hold;
                        if cut > 0 {
                            out.push(part(&self.buf[..cut]));
                            self.buf.drain(..cut);
                        }
                        break;
                    }
                }
                State::Plain => {
                    if !self.buf.is_empty() {
                        out.push(Part::Content(std::mem::take(&mut self.buf)));
                    }
                    break;
                }
            }
        }
        out
    }

    /// The end of the output: a message cut off by the token limit keeps its kind; an
    /// unfinished header is dropped, unless the output never was harmony.
    pub fn finish(&mut self) -> Vec<Part> {
        let rest = std::mem::take(&mut self.buf);
        if rest.is_empty() {
            return Vec::new();
        }
        match self.state {
            State::Body { reasoning: true } => vec![Part::Reasoning(rest)],
            State::Body { reasoning: false } | State::Plain => vec![Part::Content(rest)],
            State::Header => {
                let t = rest.trim_start();
                if t.starts_with(CHANNEL) || t.starts_with(START) {
                    Vec::new()
                } else {
                    vec![Part::Content(rest)]
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str, step: usize) -> (String, String) {
        let mut s = HarmonySplitter::default();
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
    fn analysis_is_reasoning_and_final_is_the_answer_in_pieces_cut_anywhere() {
        let cases: [(&str, &str, &str); 6] = [
            (
                "<|channel|>analysis<|message|>User asks 2+2. <b> is 4.<|end|>\
                 <|start|>assistant<|channel|>final<|message|>It is 4.",
                "User asks 2+2. <b> is 4.",
                "It is 4.",
            ),
            // No reasoning message.
            ("<|channel|>final<|message|>Hi <|there|>", "", "Hi <|there|>"),
            // A preamble on the commentary channel is answer text, as the final one.
            (
                "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary<|message|>b<|end|><|start|>assistant<|channel|>final<|message|>c",
                "a",
                "bc",
            ),
            // Cut off by the token limit inside the reasoning.
            ("<|channel|>analysis<|message|>still <|en", "still <|en", ""),
            // Not harmony at all: the text as it came.
            ("Plain <|channel|> text", "", "Plain <|channel|> text"),
            ("", "", ""),
        ];
        for (text, reasoning, content) in cases {
            for step in 1..8 {
                assert_eq!(
                    split(text, step),
                    (reasoning.into(), content.into()),
                    "{text:?} in pieces of {step}"
                );
            }
        }
    }

    #[test]
    fn text_passes_on_as_soon_as_it_cannot_be_a_marker() {
        let mut s = HarmonySplitter::default();
        assert_eq!(s.push("<|chan"), vec![]);
        assert_eq!(s.push("nel|>analysis<|mess"), vec![]);
        assert_eq!(s.push("age|>ab<"), vec![Part::Reasoning("ab".into())]);
        assert_eq!(s.push("x"), vec![Part::Reasoning("<x".into())]);
        assert_eq!(s.push("<|end|>"), vec![]);
        assert_eq!(
            s.push("<|start|>assistant<|channel|>final<|message|>ok"),
            vec![Part::Content("ok".into())]
        );
        assert_eq!(s.finish(), vec![]);
    }

    #[test]
    fn the_gpt_oss_generation_prompt_opens_a_message() {
        assert!(opened_by(
            "<|start|>user<|message|>hi<|end|><|start|>assistant"
        ));
        assert!(!opened_by("<|im_start|>assistant\n"));
    }
}
