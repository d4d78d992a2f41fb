//! A chat answer taken apart: its reasoning (`reasoning`), its text and its tool calls
//! (`tools`), whole ([`split`]) or as it streams ([`AnswerSplitter`]). Every chat codec
//! renders these three in its own shape, so the order of the two splits (reasoning
//! first, then calls in what remains) is decided once, here.

use crate::reasoning::{Part, Reasoning, Splitter};
use crate::tools::{Call, Piece, StreamSplitter, ToolSpec};

/// One piece of a split answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    /// Reasoning text.
    Reasoning(String),
    /// Answer text.
    Text(String),
    /// A complete tool call.
    Call(Call),
}

/// A whole answer, split.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    /// The reasoning (empty when there was none or it was not split).
    pub reasoning: String,
    /// The answer text.
    pub text: String,
    /// The tool calls, in order.
    pub calls: Vec<Call>,
}

/// Splits one streamed answer: reasoning when `reasoning.split`, tool calls (in the
/// model's format) when the model was shown tools.
#[derive(Debug)]
pub struct AnswerSplitter {
    think: Option<Splitter>,
    tools: Option<StreamSplitter>,
}

impl AnswerSplitter {
    /// A splitter for one choice; `tools`: the request's tools when they are shown.
    pub fn new(reasoning: Reasoning, tools: Option<&ToolSpec>) -> Self {
        AnswerSplitter {
            think: match tools {
                Some(_) => reasoning.splitter_with_calls(),
                None => reasoning.splitter(),
            },
            tools: tools.map(ToolSpec::splitter),
        }
    }

    /// Takes the next piece of output; returns what can be passed on now.
    pub fn push(&mut self, text: &str) -> Vec<Out> {
        let parts = match &mut self.think {
            Some(t) => t.push(text),
            None => vec![Part::Content(text.to_string())],
        };
        self.route(parts)
    }

    /// The end of the output: whatever either splitter held back.
    pub fn finish(&mut self) -> Vec<Out> {
        let parts = self
            .think
            .as_mut()
            .map(Splitter::finish)
            .unwrap_or_default();
        let mut out = self.route(parts);
        if let Some(t) = &mut self.tools {
            out.extend(t.finish().into_iter().map(piece));
        }
        out
    }

    fn route(&mut self, parts: Vec<Part>) -> Vec<Out> {
        let mut out = Vec::new();
        for p in parts {
            match p {
                Part::Reasoning(r) => out.push(Out::Reasoning(r)),
                // A call in the model's own message format: a call when the model was
                // shown tools, else the text it wrote.
                Part::Call { name, arguments } => match &self.tools {
                    Some(_) => out.push(Out::Call(Call::new(name, &arguments))),
                    None => out.push(Out::Text(arguments)),
                },
                Part::Content(c) => match &mut self.tools {
                    Some(t) => out.extend(t.push(&c).into_iter().map(piece)),
                    None => out.push(Out::Text(c)),
                },
            }
        }
        out
    }
}

fn piece(p: Piece) -> Out {
    match p {
        Piece::Text(t) => Out::Text(t),
        Piece::Call(c) => Out::Call(c),
    }
}

/// Splits a whole answer into its pieces in the order the model wrote them, adjacent
/// pieces of one kind joined: what a codec that keeps the order (Responses' output
/// items, Anthropic's content blocks) renders, as its stream would.
pub fn split_ordered(text: &str, reasoning: Reasoning, tools: Option<&ToolSpec>) -> Vec<Out> {
    let mut s = AnswerSplitter::new(reasoning, tools);
    let mut outs = s.push(text);
    outs.extend(s.finish());
    coalesce(outs)
}

/// Splits a whole answer (see [`AnswerSplitter`]).
pub fn split(text: &str, reasoning: Reasoning, tools: Option<&ToolSpec>) -> Answer {
    let mut a = Answer::default();
    for o in split_ordered(text, reasoning, tools) {
        match o {
            Out::Reasoning(r) => a.reasoning.push_str(&r),
            Out::Text(t) => a.text.push_str(&t),
            Out::Call(c) => a.calls.push(c),
        }
    }
    a
}

/// Joins adjacent pieces of the same kind (fewer events for a client to read).
pub fn coalesce(outs: Vec<Out>) -> Vec<Out> {
    let mut v: Vec<Out> = Vec::with_capacity(outs.len());
    for o in outs {
        match (v.last_mut(), o) {
            (Some(Out::Reasoning(a)), Out::Reasoning(b)) => a.push_str(&b),
            (Some(Out::Text(a)), Out::Text(b)) => a.push_str(&b),
            (_, o) => v.push(o),
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_then_calls_are_split_from_one_answer() {
        let out = "<think>I should call f.</think>\n\nSure.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
        let on = Reasoning {
            split: true,
            open: false,
            harmony: false,
        };
        let spec = crate::tools::test_spec(&["f"]);
        let tools = Some(&spec);
        let a = split(out, on, tools);
        assert_eq!(a.reasoning, "I should call f.");
        assert_eq!(a.text, "Sure.");
        assert_eq!(a.calls.len(), 1);
        assert_eq!(a.calls[0].arguments, "{\"x\":1}");
        // Streamed a character at a time: the same three parts.
        let mut s = AnswerSplitter::new(on, tools);
        let mut outs = Vec::new();
        for c in out.chars() {
            outs.extend(s.push(&c.to_string()));
        }
        outs.extend(s.finish());
        let outs = coalesce(outs);
        assert_eq!(
            outs,
            vec![
                Out::Reasoning("I should call f.".into()),
                Out::Text("Sure.".into()),
                Out::Call(a.calls[0].clone())
            ]
        );
        // Neither split: the text as generated.
        let plain = split(out, Reasoning::default(), None);
        assert_eq!((plain.text.as_str(), plain.calls.len()), (out, 0));
    }

    /// A gpt-oss answer: the analysis channel is the reasoning, the final one the text.
    #[test]
    fn harmony_channels_are_reasoning_and_text() {
        let out = "<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant<|channel|>final<|message|>4";
        let on = Reasoning {
            split: true,
            open: false,
            harmony: true,
        };
        let a = split(out, on, None);
        assert_eq!((a.reasoning.as_str(), a.text.as_str()), ("Add them.", "4"));
        let off = Reasoning { split: false, ..on };
        assert_eq!(split(out, off, None).text, out);
        // A call to a function the model was shown: an OpenAI tool call, arguments compact.
        let call = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"x\": 1}";
        let spec = crate::tools::test_spec(&["f"]);
        let a = split(call, on, Some(&spec));
        assert_eq!((a.text.as_str(), a.calls.len()), ("", 1));
        assert_eq!(
            (a.calls[0].name.as_str(), a.calls[0].arguments.as_str()),
            ("f", "{\"x\":1}")
        );
    }
}
