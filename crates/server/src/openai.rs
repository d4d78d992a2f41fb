//! `/v1/chat/completions` and `/v1/completions`: admission checks, the job, and the
//! answer as one JSON object or as server-sent events ending in `data: [DONE]`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::response::sse::{Event as Sse, Sse as SseBody};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::params::{GenRequest, Prompt};
use crate::worker::{Event, Fault, Job, Summary, TokenLogprob, EVENT_CAPACITY};
use crate::{AppState, RequestLog, StreamLogged};
use minfer_tokenizer::ChatMessage;

/// Text in a prompt that makes inference panic when fault injection is on (tests only).
pub const PANIC_MARKER: &str = "__minfer_inject_panic__";

/// Text in a prompt that makes a kernel panic inside its first engine step when fault
/// injection is on (tests only).
pub const KERNEL_PANIC_MARKER: &str = "__minfer_inject_kernel_panic__";

/// Text in a prompt that slows its decode steps when fault injection is on (tests only).
pub const SLOW_MARKER: &str = "__minfer_inject_slow__";

/// The fault a prompt asks for, when fault injection is on.
pub fn fault_of(st: &AppState, text: &str) -> Option<Fault> {
    if !st.fault_injection {
        None
    } else if text.contains(PANIC_MARKER) {
        Some(Fault::Panic)
    } else if text.contains(KERNEL_PANIC_MARKER) {
        Some(Fault::KernelPanic)
    } else if text.contains(SLOW_MARKER) {
        Some(Fault::Slow)
    } else {
        None
    }
}

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

/// Prompt tokens of a completion request, checked against the vocabulary. A text prompt
/// is the caller's whole prompt, template markers included, so special-token text in it
/// is parsed (as llama-server and `minfer run` do); chat content never is.
pub fn completion_prompt(st: &AppState, p: Prompt) -> Result<(Vec<u32>, Option<Fault>), ApiError> {
    match p {
        Prompt::Text(s) => Ok((st.tok.encode(&s, true, true), fault_of(st, &s))),
        Prompt::Tokens(t) => {
            let n = st.tok.n_vocab();
            if let Some(bad) = t.iter().find(|&&id| id as usize >= n) {
                return Err(ApiError::bad_request(format!(
                    "field `prompt` holds token id {bad}, outside the vocabulary of {n}"
                )));
            }
            Ok((t, None))
        }
    }
}

/// Prompt tokens of a chat request: the template's markers as special tokens, message
/// contents as plain text (unless `--allow-special-in-content` restores the old parsing
/// of specials everywhere).
pub fn chat_prompt(
    st: &AppState,
    msgs: &[ChatMessage],
) -> Result<(Vec<u32>, Option<Fault>), ApiError> {
    let bad =
        |e| ApiError::bad_request(format!("rendering `messages` with the chat template: {e}"));
    let rendered = st.template.render_spans(msgs, true).map_err(bad)?;
    let ids = if st.allow_special_in_content {
        st.tok.encode(&rendered.text, true, true)
    } else {
        rendered.encode(&st.tok, msgs, true).map_err(bad)?
    };
    Ok((ids, fault_of(st, &rendered.text)))
}

/// Checks the prompt against the slot's context, queues the job and answers.
pub async fn generate(
    st: Arc<AppState>,
    kind: Kind,
    prompt: Vec<u32>,
    g: GenRequest,
    fault: Option<Fault>,
    log: RequestLog,
) -> Result<Response, ApiError> {
    let Generation { rx, waits, .. } = submit(&st, prompt, &g, fault, log.start)?;
    let reply = Reply {
        kind,
        id: st.next_id(kind),
        created: now_secs(),
        model: st.model_id.clone(),
    };
    if g.stream {
        stream_reply(rx, reply, g, log, waits).await
    } else {
        collect_reply(rx, reply, waits).await
    }
}

/// A queued generation: its events, each wait bounded by the request's deadline and
/// the server's shutdown. Dropping it cancels the generation in the worker.
pub struct Generation {
    rx: mpsc::Receiver<Event>,
    waits: Waits,
    /// The most tokens it generates (the request's limit, or the rest of the context).
    pub max_tokens: usize,
}

impl Generation {
    /// The next event; a timeout or a shutdown arrives as an `Event::Error`.
    pub async fn next(&mut self) -> Event {
        next_event(&mut self.rx, &mut self.waits).await
    }
}

/// The one admission path of every API: checks the prompt and `max_tokens` against the
/// slot's context and the logit biases against the vocabulary, then queues the job.
pub fn submit(
    st: &AppState,
    prompt: Vec<u32>,
    g: &GenRequest,
    fault: Option<Fault>,
    arrived: Instant,
) -> Result<Generation, ApiError> {
    let ctx = st.slot_ctx;
    let n = prompt.len();
    if n == 0 {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if n >= ctx {
        return Err(ApiError::bad_request(format!(
            "the prompt has {n} tokens but a slot's context holds {ctx}; \
             leave room for at least one generated token"
        )));
    }
    // n < ctx (checked above), so `room` cannot wrap; comparing max_tokens with it
    // instead of adding it to n keeps any client number from overflowing.
    let room = ctx - n;
    let max_tokens = match g.max_tokens {
        Some(m) if m > room => {
            return Err(ApiError::bad_request(format!(
                "the prompt ({n} tokens) plus max_tokens ({m}) exceeds a slot's context \
                 of {ctx}: max_tokens must be in [1, {room}] for this prompt"
            )))
        }
        Some(m) => m,
        None => room,
    };
    let n_vocab = st.tok.n_vocab();
    g.sampling
        .validate_for_vocab(n_vocab)
        .map_err(|e| match e {
            minfer_runtime::SamplerError::OutOfRange { value, range, .. } => ApiError::bad_request(
                format!("field `logit_bias` has {value}: must be {range} ({n_vocab} tokens)"),
            ),
        })?;
    if let Some(slot) = g.slot.filter(|&s| s >= st.n_slots) {
        return Err(ApiError::bad_request(format!(
            "field `id_slot` is {slot}: must be -1 (any) or in 0..{}",
            st.n_slots
        )));
    }
    let (tx, rx) = mpsc::channel(EVENT_CAPACITY);
    let deadline = deadline(arrived, st.timeout);
    st.worker.submit(Job {
        prompt,
        max_tokens,
        sampling: g.sampling.clone(),
        stop: g.stop.clone(),
        logprobs: g.logprobs,
        arrived,
        deadline,
        fault,
        tx,
        cache_prompt: g.cache_prompt,
        slot: g.slot,
    })?;
    let waits = Waits {
        deadline,
        cancel: st.cancel.clone(),
    };
    Ok(Generation {
        rx,
        waits,
        max_tokens,
    })
}

/// When a request that arrived at `arrived` is abandoned. `Config::validate` bounds the
/// timeout, but the sum is still checked: an `Instant` overflow would panic inside the
/// handler and leave the client without any answer.
fn deadline(arrived: Instant, timeout: Duration) -> Instant {
    arrived
        .checked_add(timeout)
        .or_else(|| arrived.checked_add(crate::MAX_REQUEST_TIMEOUT))
        .unwrap_or(arrived)
}

/// Fixed parts of every object of one response.
#[derive(Clone)]
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
}

/// What bounds every wait of a request: its deadline, and the server's shutdown.
struct Waits {
    deadline: Instant,
    /// Raised when a shutdown stops waiting for in-flight requests.
    cancel: tokio::sync::watch::Receiver<bool>,
}

/// Waits for an event until the request's deadline, wherever the request is (queued,
/// prefilling, decoding, or held back by a slow reader), or until a shutdown cancels
/// it. Dropping the receiver afterwards cancels the generation in the worker.
async fn next_event(rx: &mut mpsc::Receiver<Event>, w: &mut Waits) -> Event {
    let timed_out = || {
        Event::Error(ApiError::new(
            axum::http::StatusCode::GATEWAY_TIMEOUT,
            "the request timed out",
        ))
    };
    if Instant::now() >= w.deadline {
        return timed_out();
    }
    let deadline = tokio::time::Instant::from_std(w.deadline);
    tokio::select! {
        biased;
        _ = w.cancel.wait_for(|c| *c) => Event::Error(ApiError::unavailable(
            "the server is shutting down; the request was cancelled",
            1,
        )),
        got = tokio::time::timeout_at(deadline, rx.recv()) => match got {
            Ok(Some(ev)) => ev,
            Ok(None) => Event::Error(ApiError::internal(
                "the inference worker dropped the request",
            )),
            Err(_) => timed_out(),
        },
    }
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

async fn collect_reply(
    mut rx: mpsc::Receiver<Event>,
    r: Reply,
    mut waits: Waits,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut lps = Vec::new();
    let summary = loop {
        match next_event(&mut rx, &mut waits).await {
            Event::Chunk { text: t, logprobs } => {
                text.push_str(&t);
                lps.extend(logprobs);
            }
            Event::Done(s) => break s,
            Event::Error(e) => return Err(e),
        }
    };
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
    rx: mpsc::Receiver<Event>,
    first: Option<Event>,
    reply: Reply,
    include_usage: bool,
    offset: usize,
    done: bool,
    waits: Waits,
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
    mut rx: mpsc::Receiver<Event>,
    reply: Reply,
    g: GenRequest,
    mut log: RequestLog,
    mut waits: Waits,
) -> Result<Response, ApiError> {
    // The status is decided by the first event: a failure before any token is a plain
    // JSON error, not a 200 stream.
    let first = next_event(&mut rx, &mut waits).await;
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
        rx,
        first: Some(first),
        reply,
        include_usage: g.include_usage,
        offset: 0,
        done: false,
        waits,
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
            None => next_event(&mut s.rx, &mut s.waits).await,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_never_overflow() {
        let now = Instant::now();
        assert_eq!(
            deadline(now, Duration::from_secs(3)),
            now + Duration::from_secs(3)
        );
        // Duration::MAX would panic as `now + timeout`.
        assert!(deadline(now, Duration::MAX) >= now);
    }
}
