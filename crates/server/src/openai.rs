//! The OpenAI codec of `/v1/chat/completions` and `/v1/completions`: the answer of the
//! shared generation path (`generate`) as one JSON object or as server-sent events ending
//! in `data: [DONE]`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::response::sse::{Event as Sse, Sse as SseBody};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::generate::{self, Generation};
pub use crate::generate::{
    chat_prompt, completion_prompt, fault_of, KERNEL_PANIC_MARKER, PANIC_MARKER, SLOW_MARKER,
};
use crate::params::GenRequest;
use crate::worker::{Event, Fault, Summary, TokenLogprob};
use crate::{AppState, RequestLog, StreamLogged};

/// The two response dialects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `chat.completion` objects.
    Chat,
    /// `text_completion` objects.
    Text,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Runs the shared generation for an OpenAI request and answers in OpenAI's shape.
pub async fn generate(
    st: Arc<AppState>,
    kind: Kind,
    prompt: Vec<u32>,
    g: GenRequest,
    fault: Option<Fault>,
    log: RequestLog,
) -> Result<Response, ApiError> {
    let gen = generate::start(&st, prompt, &g, fault, log.start)?;
    let reply = Reply {
        kind,
        id: st.next_id(kind),
        created: now_secs(),
        model: st.model_id.clone(),
    };
    if g.stream {
        stream_reply(gen, reply, g, log).await
    } else {
        collect_reply(gen, reply).await
    }
}

/// Fixed parts of every object of one response.
#[derive(Clone)]
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
}

fn usage(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
    })
}

fn chat_logprobs(lps: &[TokenLogprob]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            json!({
                "token": l.chosen.text,
                "logprob": l.chosen.logprob,
                "bytes": l.chosen.bytes,
                "top_logprobs": l.top.iter().map(|c| json!({
                    "token": c.text, "logprob": c.logprob, "bytes": c.bytes,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "content": content })
}

fn text_logprobs(lps: &[TokenLogprob], offset0: usize) -> Value {
    let mut offset = offset0;
    let mut offsets = Vec::with_capacity(lps.len());
    for l in lps {
        offsets.push(offset);
        offset += l.chosen.text.len();
    }
    json!({
        "tokens": lps.iter().map(|l| l.chosen.text.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|l| l.chosen.logprob).collect::<Vec<_>>(),
        "top_logprobs": lps.iter().map(|l| {
            l.top.iter().map(|c| (c.text.clone(), json!(c.logprob)))
                .collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

async fn collect_reply(gen: Generation, r: Reply) -> Result<Response, ApiError> {
    let out = gen.collect().await?;
    let (text, lps, summary) = (out.choice.text, out.choice.logprobs, out.choice.summary);
    let want_lp = !lps.is_empty();
    let body = match r.kind {
        Kind::Chat => json!({
            "id": r.id, "object": "chat.completion", "created": r.created, "model": r.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": if want_lp { chat_logprobs(&lps) } else { Value::Null },
                "finish_reason": summary.finish.as_str(),
            }],
            "usage": usage(&summary),
        }),
        Kind::Text => json!({
            "id": r.id, "object": "text_completion", "created": r.created, "model": r.model,
            "choices": [{
                "index": 0,
                "text": text,
                "logprobs": if want_lp { text_logprobs(&lps, 0) } else { Value::Null },
                "finish_reason": summary.finish.as_str(),
            }],
            "usage": usage(&summary),
        }),
    };
    let mut resp = Json(body).into_response();
    resp.extensions_mut().insert(summary);
    Ok(resp)
}

/// One streamed object with a content delta (or the final, empty one).
fn chunk(
    r: &Reply,
    text: Option<&str>,
    lps: &[TokenLogprob],
    offset: usize,
    finish: Option<&str>,
) -> Value {
    match r.kind {
        Kind::Chat => {
            let delta = match text {
                Some(t) => json!({"content": t}),
                None => json!({}),
            };
            json!({
                "id": r.id, "object": "chat.completion.chunk", "created": r.created,
                "model": r.model,
                "choices": [{
                    "index": 0, "delta": delta,
                    "logprobs": if lps.is_empty() { Value::Null } else { chat_logprobs(lps) },
                    "finish_reason": finish,
                }],
            })
        }
        Kind::Text => json!({
            "id": r.id, "object": "text_completion", "created": r.created, "model": r.model,
            "choices": [{
                "index": 0, "text": text.unwrap_or(""),
                "logprobs": if lps.is_empty() { Value::Null } else { text_logprobs(lps, offset) },
                "finish_reason": finish,
            }],
        }),
    }
}

fn data(v: &Value) -> Sse {
    Sse::default().data(v.to_string())
}

struct StreamState {
    gen: Generation,
    first: Option<Event>,
    reply: Reply,
    include_usage: bool,
    offset: usize,
    done: bool,
    log: RequestLog,
}

/// The frames one event becomes.
fn frames(s: &mut StreamState, ev: Event) -> Vec<Sse> {
    match ev {
        Event::Chunk { text, logprobs } => {
            let v = chunk(&s.reply, Some(&text), &logprobs, s.offset, None);
            s.offset += text.len();
            vec![data(&v)]
        }
        Event::Done(sum) => {
            s.done = true;
            s.log.summary = Some(sum);
            let mut out = vec![data(&chunk(
                &s.reply,
                None,
                &[],
                s.offset,
                Some(sum.finish.as_str()),
            ))];
            if s.include_usage {
                let obj = match s.reply.kind {
                    Kind::Chat => "chat.completion.chunk",
                    Kind::Text => "text_completion",
                };
                out.push(data(&json!({
                    "id": s.reply.id, "object": obj, "created": s.reply.created,
                    "model": s.reply.model, "choices": [], "usage": usage(&sum),
                })));
            }
            out.push(Sse::default().data("[DONE]"));
            out
        }
        Event::Error(e) => {
            s.done = true;
            s.log.status = e.status.as_u16();
            vec![data(&e.body()), Sse::default().data("[DONE]")]
        }
    }
}

async fn stream_reply(
    mut gen: Generation,
    reply: Reply,
    g: GenRequest,
    mut log: RequestLog,
) -> Result<Response, ApiError> {
    // The status is decided by the first event: a failure before any token is a plain
    // JSON error, not a 200 stream.
    let first = gen.next().await;
    if let Event::Error(e) = first {
        return Err(e);
    }
    log.status = 200;
    log.emit_on_drop = true;
    let mut head = Vec::new();
    if reply.kind == Kind::Chat {
        head.push(data(&json!({
            "id": reply.id, "object": "chat.completion.chunk", "created": reply.created,
            "model": reply.model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                         "logprobs": null, "finish_reason": null}],
        })));
    }
    let state = StreamState {
        gen,
        first: Some(first),
        reply,
        include_usage: g.include_usage,
        offset: 0,
        done: false,
        log,
    };
    let body = stream::iter(head).chain(events(state));
    let mut resp = SseBody::new(body.map(Ok::<_, Infallible>)).into_response();
    resp.extensions_mut().insert(StreamLogged);
    Ok(resp)
}

fn events(state: StreamState) -> impl Stream<Item = Sse> + Send {
    stream::unfold(state, |mut s| async move {
        if s.done {
            // Dropping the state logs the request.
            return None;
        }
        let ev = match s.first.take() {
            Some(ev) => ev,
            None => s.gen.next().await,
        };
        let out = frames(&mut s, ev);
        Some((stream::iter(out), s))
    })
    .flatten()
}

/// Elapsed wall time as seconds with millisecond precision, for the log.
pub fn secs(start: Instant) -> f64 {
    (start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0
}
