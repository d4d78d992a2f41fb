//! Anthropic's event stream: `message_start`, then per content block
//! `content_block_start`, its deltas (`thinking_delta`, `text_delta`,
//! `input_json_delta`) and `content_block_stop`, a `ping` after the first block opens,
//! then `message_delta` (stop reason and usage) and `message_stop`. A failure
//! mid-stream is an `error` event.

use axum::response::sse::Event as Sse;
use serde_json::{json, Value};

use super::response::{error_body, input, stop_reason, tool_id, usage};
use crate::answer::{coalesce, AnswerSplitter, Out};
use crate::generate::Generation;
use crate::job::{Event, Summary};
use crate::RequestLog;

/// One event: its name and its data.
pub(super) type Frame = (&'static str, Value);

/// The block being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
}

/// The content blocks of one message as events, from the split answer's pieces.
#[derive(Debug)]
pub(super) struct Blocks {
    id: String,
    stop: Vec<String>,
    splitter: AnswerSplitter,
    /// Index of the current (or next) block.
    next: usize,
    open: Option<Open>,
    calls: usize,
    pinged: bool,
}

/// `message_start` for message `id` of `input` prompt tokens.
pub(super) fn start_frame(id: &str, model: &str, input: usize) -> Frame {
    (
        "message_start",
        json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": usage(input, 0),
        }}),
    )
}

impl Blocks {
    /// The blocks of message `id`, whose request gave `stop` sequences.
    pub(super) fn new(id: String, stop: Vec<String>, splitter: AnswerSplitter) -> Self {
        Blocks {
            id,
            stop,
            splitter,
            next: 0,
            open: None,
            calls: 0,
            pinged: false,
        }
    }

    /// The events for the next generated text.
    pub(super) fn push(&mut self, text: &str) -> Vec<Frame> {
        let outs = coalesce(self.splitter.push(text));
        self.blocks(outs)
    }

    /// The last events: held-back text, the open block's end, `message_delta` and
    /// `message_stop`.
    pub(super) fn finish(&mut self, sum: &Summary) -> Vec<Frame> {
        let outs = coalesce(self.splitter.finish());
        let mut out = self.blocks(outs);
        self.close(&mut out);
        let (reason, seq) = stop_reason(sum, &self.stop, self.calls > 0);
        out.push((
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": reason, "stop_sequence": seq},
                   "usage": {"output_tokens": sum.completion_tokens}}),
        ));
        out.push(("message_stop", json!({"type": "message_stop"})));
        out
    }

    fn close(&mut self, out: &mut Vec<Frame>) {
        if self.open.take().is_some() {
            out.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": self.next}),
            ));
            self.next += 1;
        }
    }

    /// Opens a block at the current index, with a `ping` after the first.
    fn begin(&mut self, block: Value, kind: Open, out: &mut Vec<Frame>) {
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": self.next, "content_block": block}),
        ));
        self.open = Some(kind);
        if !self.pinged {
            self.pinged = true;
            out.push(("ping", json!({"type": "ping"})));
        }
    }

    fn delta(&self, delta: Value) -> Frame {
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.next, "delta": delta}),
        )
    }

    fn blocks(&mut self, outs: Vec<Out>) -> Vec<Frame> {
        let mut out = Vec::new();
        for o in outs {
            let (kind, delta) = match o {
                Out::Reasoning(t) => (
                    Open::Thinking,
                    json!({"type": "thinking_delta", "thinking": t}),
                ),
                Out::Text(t) => (Open::Text, json!({"type": "text_delta", "text": t})),
                Out::Call(c) => {
                    // A call is one whole block: its arguments arrive complete.
                    self.close(&mut out);
                    let id = tool_id(&self.id, self.calls);
                    self.calls += 1;
                    let block = json!({"type": "tool_use", "id": id, "name": c.name, "input": {}});
                    self.begin(block, Open::Text, &mut out);
                    let json = input(&c).to_string();
                    out.push(self.delta(json!({"type": "input_json_delta", "partial_json": json})));
                    self.close(&mut out);
                    continue;
                }
            };
            if self.open != Some(kind) {
                self.close(&mut out);
                let block = match kind {
                    Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                    Open::Text => json!({"type": "text", "text": ""}),
                };
                self.begin(block, kind, &mut out);
            }
            out.push(self.delta(delta));
        }
        out
    }
}

/// One stream's state: the generation and its blocks.
pub(super) struct Stream {
    pub(super) gen: Generation,
    pub(super) first: Option<Event>,
    pub(super) blocks: Blocks,
    pub(super) log: RequestLog,
    pub(super) done: bool,
}

fn sse((name, data): Frame) -> Sse {
    Sse::default().event(name).data(data.to_string())
}

impl Stream {
    /// The events one generation event becomes.
    pub(super) fn frames(&mut self, ev: Event) -> Vec<Sse> {
        let frames = match ev {
            Event::Chunk { text, .. } => self.blocks.push(&text),
            // Anthropic's stream has no progress events.
            Event::Progress(_) => Vec::new(),
            Event::Done(sum) => {
                self.done = true;
                self.log.summary = Some(sum);
                self.blocks.finish(&sum)
            }
            Event::Error(e) => {
                self.done = true;
                self.log.status = e.status.as_u16();
                vec![("error", error_body(&e))]
            }
        };
        frames.into_iter().map(sse).collect()
    }
}

/// The `message_start` event as sent.
pub(super) fn start_event(id: &str, model: &str, input: usize) -> Sse {
    sse(start_frame(id, model, input))
}
