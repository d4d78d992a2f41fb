//! The harmony format of gpt-oss answers: a turn is a sequence of messages, each a header
//! (`<|start|>assistant`, `<|channel|>NAME`, optional recipient and constraint) then
//! `<|message|>`, its text, and `<|end|>` (the turn's last message ends with `<|return|>`
//! or `<|call|>`, which end generation and are not rendered). The chat template leaves
//! the prompt at `<|start|>assistant`, so the output opens with the first message's
//! `<|channel|>`. [`HarmonySplitter`] turns the `analysis` channel into reasoning and the
//! others (`final`, `commentary`) into answer text, whole or as it streams (a marker cut
//! across tokens is held back until it is whole), and a message addressed to a function
//! (`to=functions.NAME`, its body the arguments, the turn ending at `<|call|>`) into a
//! tool call. Output that does not open with a header passes as answer text.

use crate::part::Part;
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
    /// The function the current message is addressed to (`to=functions.NAME`): its
    /// body is that call's arguments, passed on whole at the message's end.
    call: Option<String>,
}

impl Default for HarmonySplitter {
    fn default() -> Self {
        HarmonySplitter {
            state: State::Header,
            buf: String::new(),
            call: None,
        }
    }
}

/// The function a message header addresses (`to=functions.NAME`, before or after the
/// channel), without the `functions.` namespace.
fn recipient(header: &str) -> Option<String> {
    let (_, rest) = header.split_once("to=")?;
    let name = rest.split([' ', '<']).next()?;
    let name = name.strip_prefix("functions.").unwrap_or(name);
    (!name.is_empty()).then(|| name.to_string())
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
                    self.call = recipient(&t[..at]);
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
                        if let Some(name) = self.call.take() {
                            out.push(Part::Call {
                                name,
                                arguments: self.buf[..at].to_string(),
                            });
                        } else if at > 0 {
                            out.push(part(&self.buf[..at]));
                        }
                        let skip = if is_end { at + len } else { at };
                        self.buf.drain(..skip);
                        self.state = State::Header;
                    } else if self.call.is_some() {
                        // A call's arguments pass on whole.
                        break;
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
        if let Some(name) = self.call.take() {
            // The call ended the turn (`<|call|>`, which is not rendered).
            return vec![Part::Call {
                name,
                arguments: rest,
            }];
        }
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
                Part::Call { .. } => panic!("a call in {text:?}"),
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

    /// A function call after the reasoning, as gpt-oss writes one: the arguments whole,
    /// with the recipient before or after the channel.
    #[test]
    fn a_message_to_a_function_is_a_call() {
        let outs = [
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}",
        ];
        for out in outs {
            for step in [1, 3, 1000] {
                let mut s = HarmonySplitter::default();
                let chars: Vec<char> = out.chars().collect();
                let mut parts = Vec::new();
                for c in chars.chunks(step) {
                    parts.extend(s.push(&c.iter().collect::<String>()));
                }
                parts.extend(s.finish());
                let reasoning: String = parts
                    .iter()
                    .filter_map(|p| match p {
                        Part::Reasoning(r) => Some(r.as_str()),
                        _ => None,
                    })
                    .collect();
                assert_eq!(reasoning, "Need weather.", "{out} / {step}");
                let calls: Vec<&Part> = parts
                    .iter()
                    .filter(|p| matches!(p, Part::Call { .. }))
                    .collect();
                assert_eq!(
                    calls,
                    [&Part::Call {
                        name: "get_weather".into(),
                        arguments: "{\"city\": \"Paris\"}".into()
                    }],
                    "{out} / {step}"
                );
                assert!(
                    !parts.iter().any(|p| matches!(p, Part::Content(_))),
                    "{parts:?}"
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
