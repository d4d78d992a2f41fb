//! ollama's answers: its error shape, the NDJSON pieces and final object of a chat or
//! generate answer, and a model's listing.

use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::facts::{rfc3339, tag_name, ModelFacts};
use super::request::Shape;
use crate::answer::{Answer, AnswerSplitter, Out};
use crate::error::ApiError;
use crate::generate::Generation;
use crate::job::{Candidate, Event, Finish, Summary, TokenLogprob};
use crate::RequestLog;

/// An error in ollama's shape: `{"error": "..."}` with the status.
#[derive(Debug)]
pub struct OllamaError(pub ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        let mut resp = (self.0.status, Json(json!({"error": self.0.message}))).into_response();
        if let Some(secs) = self.0.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// The fields every answer object starts with.
pub(super) fn head(model: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("model".into(), json!(model));
    m.insert("created_at".into(), json!(rfc3339(SystemTime::now())));
    m
}

pub(super) fn piece(shape: Shape, model: &str, text: &str) -> Value {
    let mut m = head(model);
    match shape {
        Shape::Chat => m.insert(
            "message".into(),
            json!({"role": "assistant", "content": text}),
        ),
        Shape::Generate => m.insert("response".into(), json!(text)),
    };
    m.insert("done".into(), json!(false));
    Value::Object(m)
}

/// A piece of a split answer: its text, its reasoning (`thinking`) and its tool calls
/// (chat only: `message.tool_calls[].function` with `name` and `arguments` as an object).
pub(super) fn split_piece(shape: Shape, model: &str, a: &Answer) -> Value {
    let mut v = piece(shape, model, &a.text);
    if !a.reasoning.is_empty() {
        match shape {
            Shape::Chat => v["message"]["thinking"] = json!(a.reasoning),
            Shape::Generate => v["thinking"] = json!(a.reasoning),
        }
    }
    if !a.calls.is_empty() && shape == Shape::Chat {
        v["message"]["tool_calls"] = a
            .calls
            .iter()
            .map(|c| {
                let args = serde_json::from_str::<Value>(&c.arguments)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({}));
                json!({"function": {"name": c.name, "arguments": args}})
            })
            .collect();
    }
    v
}

/// The last object: `done`, `done_reason` and the counts and durations (nanoseconds),
/// with what is left of the answer.
pub(super) fn done(
    shape: Shape,
    model: &str,
    a: &Answer,
    s: &Summary,
    total: Duration,
    context: Option<Vec<u32>>,
) -> Value {
    let Value::Object(mut m) = split_piece(shape, model, a) else {
        unreachable!("piece builds an object")
    };
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    m.insert("done".into(), json!(true));
    let reason = match s.finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
    };
    m.insert("done_reason".into(), json!(reason));
    if let Some(c) = context {
        m.insert("context".into(), json!(c));
    }
    m.insert("total_duration".into(), json!(ns(total)));
    m.insert("load_duration".into(), json!(0));
    m.insert("prompt_eval_count".into(), json!(s.prompt_tokens));
    m.insert("prompt_eval_duration".into(), json!(ns(s.prompt_time)));
    m.insert("eval_count".into(), json!(s.completion_tokens));
    m.insert("eval_duration".into(), json!(ns(s.predicted_time)));
    Value::Object(m)
}

/// ollama's `logprobs`: per token `{token, logprob, bytes}` and, when alternatives were
/// asked for, their list in the same shape as `top_logprobs`.
pub(super) fn token_logprobs(lps: &[TokenLogprob]) -> Value {
    let one = |c: &Candidate| json!({"token": c.text, "logprob": c.logprob, "bytes": c.bytes});
    lps.iter()
        .map(|l| {
            let mut v = one(&l.chosen);
            if !l.top.is_empty() {
                v["top_logprobs"] = l.top.iter().map(one).collect();
            }
            v
        })
        .collect()
}

/// The answer to a request with no prompt, with `done_reason` `reason` (`load`, or
/// `unload` for `keep_alive` 0): the model is loaded (it always is, and stays so).
pub(super) fn load_answer(shape: Shape, model: &str, reason: &str) -> Response {
    let mut m = head(model);
    match shape {
        Shape::Chat => m.insert(
            "message".into(),
            json!({"role": "assistant", "content": ""}),
        ),
        Shape::Generate => m.insert("response".into(), json!("")),
    };
    m.insert("done".into(), json!(true));
    m.insert("done_reason".into(), json!(reason));
    Json(Value::Object(m)).into_response()
}

/// An NDJSON stream in progress.
pub(super) struct Ndjson {
    pub(super) gen: Generation,
    pub(super) first: Option<Event>,
    pub(super) shape: Shape,
    pub(super) model: String,
    /// The prompt ids, then the generated ones (generate's final `context`).
    pub(super) context: Option<Vec<u32>>,
    pub(super) finished: bool,
    pub(super) log: RequestLog,
    /// Takes the answer apart into text, thinking and tool calls.
    pub(super) splitter: AnswerSplitter,
    /// Whether each line carries its tokens' `logprobs`.
    pub(super) logprobs: bool,
}

/// Pieces of the answer gathered into one.
fn gather(outs: Vec<Out>) -> Answer {
    let mut a = Answer::default();
    for o in outs {
        match o {
            Out::Reasoning(r) => a.reasoning.push_str(&r),
            Out::Text(t) => a.text.push_str(&t),
            Out::Call(c) => a.calls.push(c),
        }
    }
    a
}

impl Ndjson {
    /// The line an event becomes; `None` for a chunk without text.
    pub(super) fn line(&mut self, ev: Event) -> Option<Bytes> {
        let v = match ev {
            // ollama's stream has no progress lines.
            Event::Progress(_) => return None,
            Event::Chunk { text, logprobs, .. } => {
                if let Some(c) = self.context.as_mut() {
                    c.extend(logprobs.iter().map(|l| l.chosen.id));
                }
                let a = gather(self.splitter.push(&text));
                let lps = self.logprobs && !logprobs.is_empty();
                // As ollama: a line carries its tokens' log-probabilities even while the
                // text is held back (a tool call being parsed, a possible stop string).
                if a == Answer::default() && !lps {
                    return None;
                }
                let mut v = split_piece(self.shape, &self.model, &a);
                if lps {
                    v["logprobs"] = token_logprobs(&logprobs);
                }
                v
            }
            Event::Done(s) => {
                self.finished = true;
                self.log.summary = Some(s);
                let total = self.log.start.elapsed();
                let rest = gather(self.splitter.finish());
                done(
                    self.shape,
                    &self.model,
                    &rest,
                    &s,
                    total,
                    self.context.take(),
                )
            }
            Event::Error(e) => {
                self.finished = true;
                self.log.status = e.status.as_u16();
                json!({"error": e.message})
            }
        };
        let mut line = v.to_string().into_bytes();
        line.push(b'\n');
        Some(Bytes::from(line))
    }
}

pub(super) fn listing(id: &str, f: &ModelFacts) -> Value {
    let name = tag_name(id);
    json!({
        "name": name,
        "model": name,
        "modified_at": f.modified_at,
        "size": f.size,
        "digest": f.digest,
        "details": f.details(),
    })
}
