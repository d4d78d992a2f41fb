//! The Responses event stream: `response.created` and `response.in_progress`, the
//! output items' events as the answer is generated, then `response.completed` (or
//! `response.incomplete` at the token limit); every event numbered by
//! `sequence_number`. A failure mid-stream is an `error` event.

use std::sync::Arc;

use axum::response::sse::Event as Sse;
use serde_json::{json, Value};

use super::output::Builder;
use super::response::{entry, finished, Kept};
use crate::answer::{coalesce, AnswerSplitter};
use crate::api::timings;
use crate::generate::Generation;
use crate::job::Event;
use crate::{AppState, RequestLog};

/// One stream's state.
pub(super) struct Stream {
    pub(super) st: Arc<AppState>,
    pub(super) gen: Generation,
    pub(super) first: Option<Event>,
    pub(super) base: Value,
    pub(super) builder: Builder,
    pub(super) splitter: AnswerSplitter,
    /// What to keep of the request when the response is stored.
    pub(super) history: Option<Kept>,
    pub(super) model: String,
    pub(super) log: RequestLog,
    pub(super) seq: u64,
    pub(super) done: bool,
}

impl Stream {
    /// `data` numbered and named as the event it is.
    fn sse(&mut self, mut data: Value) -> Sse {
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        let name = data["type"].as_str().unwrap_or("message").to_string();
        Sse::default().event(name).data(data.to_string())
    }

    /// The opening events.
    pub(super) fn head(&mut self) -> Vec<Sse> {
        let r = self.base.clone();
        vec![
            self.sse(json!({"type": "response.created", "response": r})),
            self.sse(json!({"type": "response.in_progress", "response": r})),
        ]
    }

    /// The events one generation event becomes.
    pub(super) fn frames(&mut self, ev: Event) -> Vec<Sse> {
        let events = match ev {
            Event::Progress(p) => {
                // llama-server's `return_progress`: the prompt's progress on an
                // in-progress event.
                let mut ev = json!({"type": "response.in_progress", "response": self.base,
                    "prompt_progress": timings::progress(&p)});
                if let Some(t) = self.gen.timings_now(0) {
                    ev["timings"] = t;
                }
                vec![ev]
            }
            Event::Chunk {
                text, generated, ..
            } => {
                let outs = coalesce(self.splitter.push(&text));
                let mut ev = self.builder.push(outs);
                if let (Some(t), Some(last)) = (self.gen.timings_now(generated), ev.last_mut()) {
                    last["timings"] = t;
                }
                ev
            }
            Event::Done(sum) => {
                self.done = true;
                self.log.summary = Some(sum);
                let outs = coalesce(self.splitter.finish());
                let mut ev = self.builder.push(outs);
                ev.extend(self.builder.finish());
                let r = finished(&self.base, &self.builder, &sum);
                let ty = if r["status"] == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                ev.push(json!({"type": ty, "response": r, "timings": timings::of_summary(&sum)}));
                if let Some(history) = self.history.take() {
                    let id = r["id"].as_str().unwrap_or_default().to_string();
                    let e = entry(r, history, &self.builder, &self.model);
                    self.st.responses.put(id, e);
                }
                ev
            }
            Event::Error(e) => {
                self.done = true;
                self.log.status = e.status.as_u16();
                vec![
                    json!({"type": "error", "code": e.code, "message": e.message,
                            "param": e.param}),
                ]
            }
        };
        events.into_iter().map(|e| self.sse(e)).collect()
    }
}
