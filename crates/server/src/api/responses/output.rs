//! A response's output items built from the split answer: a `reasoning` item, a
//! `message` item with one `output_text` part, and a `function_call` item per call,
//! with the typed stream events that announce them (`response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`/`.done`,
//! `response.content_part.done`, `response.function_call_arguments.delta`/`.done`,
//! `response.reasoning_text.delta`/`.done`, `response.output_item.done`). The whole
//! answer and the stream go through the same builder, so both carry the same items.

use serde_json::{json, Value};

use crate::answer::{split_ordered, Out};
use crate::reasoning::Reasoning;
use crate::tools::{Call, ToolSpec};

/// The kind of the item being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Message,
}

#[derive(Debug)]
struct OpenItem {
    kind: Kind,
    id: String,
    text: String,
}

/// Builds the output items of one response and their events.
#[derive(Debug)]
pub struct Builder {
    serial: String,
    items: Vec<Value>,
    open: Option<OpenItem>,
    /// The answer text, for the stored conversation.
    pub text: String,
    /// The calls with their call ids, for the stored conversation.
    pub calls: Vec<(String, Call)>,
}

impl Builder {
    /// A builder for the response whose id ends in `serial`.
    pub fn new(serial: &str) -> Self {
        Builder {
            serial: serial.to_string(),
            items: Vec::new(),
            open: None,
            text: String::new(),
            calls: Vec::new(),
        }
    }

    /// The finished builder of a whole (unstreamed) answer `text`, split as `reasoning`
    /// and `tools` say: its pieces go in the order the model wrote them, so its items and
    /// their ids are those the stream gives for the same answer.
    pub fn whole(serial: &str, text: &str, reasoning: Reasoning, tools: Option<&ToolSpec>) -> Self {
        let mut b = Builder::new(serial);
        b.push(split_ordered(text, reasoning, tools));
        b.finish();
        b
    }

    /// The finished items.
    pub fn items(&self) -> &[Value] {
        &self.items
    }

    /// Takes pieces of the answer; returns the events they make (without
    /// `sequence_number`, which the stream adds).
    pub fn push(&mut self, outs: Vec<Out>) -> Vec<Value> {
        let mut ev = Vec::new();
        for o in outs {
            match o {
                Out::Reasoning(t) => self.write(Kind::Reasoning, &t, &mut ev),
                Out::Text(t) => {
                    self.text.push_str(&t);
                    self.write(Kind::Message, &t, &mut ev)
                }
                Out::Call(c) => self.call(c, &mut ev),
            }
        }
        ev
    }

    /// Ends the open item, if any; returns its closing events.
    pub fn finish(&mut self) -> Vec<Value> {
        let mut ev = Vec::new();
        self.close(&mut ev);
        ev
    }

    fn index(&self) -> usize {
        self.items.len()
    }

    fn write(&mut self, kind: Kind, t: &str, ev: &mut Vec<Value>) {
        if self.open.as_ref().map(|o| o.kind) != Some(kind) {
            self.close(ev);
            let n = self.index();
            let id = match kind {
                Kind::Reasoning => format!("rs_{}_{n}", self.serial),
                Kind::Message => format!("msg_{}_{n}", self.serial),
            };
            let item = item(kind, &id, "", "in_progress");
            ev.push(json!({"type": "response.output_item.added", "output_index": n, "item": item}));
            if kind == Kind::Message {
                ev.push(json!({"type": "response.content_part.added", "item_id": id,
                    "output_index": n, "content_index": 0, "part": part("")}));
            }
            self.open = Some(OpenItem {
                kind,
                id,
                text: String::new(),
            });
        }
        let n = self.index();
        if let Some(o) = &mut self.open {
            o.text.push_str(t);
            let ty = match kind {
                Kind::Reasoning => "response.reasoning_text.delta",
                Kind::Message => "response.output_text.delta",
            };
            let mut e = json!({"type": ty, "item_id": o.id, "output_index": n,
                               "content_index": 0, "delta": t});
            if kind == Kind::Message {
                e["logprobs"] = json!([]);
            }
            ev.push(e);
        }
    }

    fn close(&mut self, ev: &mut Vec<Value>) {
        let Some(o) = self.open.take() else {
            return;
        };
        let n = self.index();
        match o.kind {
            Kind::Reasoning => ev.push(json!({"type": "response.reasoning_text.done",
                "item_id": o.id, "output_index": n, "content_index": 0, "text": o.text})),
            Kind::Message => {
                ev.push(json!({"type": "response.output_text.done", "item_id": o.id,
                    "output_index": n, "content_index": 0, "text": o.text, "logprobs": []}));
                ev.push(
                    json!({"type": "response.content_part.done", "item_id": o.id,
                    "output_index": n, "content_index": 0, "part": part(&o.text)}),
                );
            }
        }
        let done = item(o.kind, &o.id, &o.text, "completed");
        ev.push(json!({"type": "response.output_item.done", "output_index": n, "item": done}));
        self.items.push(done);
    }

    fn call(&mut self, c: Call, ev: &mut Vec<Value>) {
        self.close(ev);
        let n = self.index();
        let k = self.calls.len();
        let id = format!("fc_{}_{k}", self.serial);
        let call_id = format!("call_{}_{k}", self.serial);
        let item = |args: &str, status: &str| {
            json!({"type": "function_call", "id": id, "call_id": call_id, "name": c.name,
                   "arguments": args, "status": status})
        };
        ev.push(
            json!({"type": "response.output_item.added", "output_index": n,
                       "item": item("", "in_progress")}),
        );
        ev.push(
            json!({"type": "response.function_call_arguments.delta", "item_id": id,
                       "output_index": n, "delta": c.arguments}),
        );
        ev.push(
            json!({"type": "response.function_call_arguments.done", "item_id": id,
                       "output_index": n, "name": c.name, "arguments": c.arguments}),
        );
        let done = item(&c.arguments, "completed");
        ev.push(json!({"type": "response.output_item.done", "output_index": n, "item": done}));
        self.items.push(done);
        self.calls.push((call_id, c));
    }
}

fn part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn item(kind: Kind, id: &str, text: &str, status: &str) -> Value {
    match kind {
        Kind::Reasoning => json!({"type": "reasoning", "id": id, "summary": [],
            "content": if text.is_empty() { json!([]) }
                       else { json!([{"type": "reasoning_text", "text": text}]) },
            "status": status}),
        Kind::Message => json!({"type": "message", "id": id, "status": status,
            "role": "assistant",
            "content": if status == "in_progress" { json!([]) } else { json!([part(text)]) }}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_and_events_follow_the_responses_stream_order() {
        let mut b = Builder::new("x");
        let mut ev = b.push(vec![
            Out::Reasoning("hm".into()),
            Out::Reasoning("m".into()),
            Out::Text("Hi".into()),
            Out::Call(Call {
                name: "f".into(),
                arguments: "{\"a\":1}".into(),
            }),
        ]);
        ev.extend(b.finish());
        let types: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        let items = b.items();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0]["content"][0]["text"], "hmm");
        assert_eq!(items[1]["content"][0]["text"], "Hi");
        assert_eq!(items[2]["call_id"], "call_x_0");
        assert_eq!(items[2]["arguments"], "{\"a\":1}");
        // Every event of an item names its output index.
        assert!(ev.iter().all(|e| e["output_index"].is_u64()));
        assert_eq!(b.text, "Hi");
    }
}
