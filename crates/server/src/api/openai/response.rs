//! OpenAI's answers to `/v1/chat/completions` and `/v1/completions`: the shared
//! generation path (`generate`) rendered as one JSON object or as server-sent events
//! ending in `data: [DONE]`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::response::sse::{Event as Sse, Sse as SseBody};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};

use crate::answer::{self, AnswerSplitter, Out};
use crate::api::timings;
use crate::error::ApiError;
use crate::generate::{self, Generation};
use crate::job::Finish;
use crate::params::GenRequest;
use crate::tools;
use crate::worker::{Event, Fault, Summary, TokenLogprob};
use crate::{AppState, Model, RequestLog, StreamLogged};

/// The two response dialects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `chat.completion` objects.
    Chat,
    /// `text_completion` objects.
    Text,
}

/// Seconds since the Unix epoch (0 on a clock before it): `created` fields.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Runs the shared generation for an OpenAI request (one prompt, or a batch of text
/// completion prompts, prompt `p`'s choices numbered from `p * n`) and answers in
/// OpenAI's shape.
pub async fn generate(
    st: Arc<AppState>,
    kind: Kind,
    model: Arc<Model>,
    prompts: Vec<Vec<u32>>,
    g: GenRequest,
    fault: Option<Fault>,
    log: RequestLog,
) -> Result<Response, ApiError> {
    let reply = Reply {
        kind,
        id: st.next_id(kind),
        created: now_secs(),
        model: model.id.clone(),
        fingerprint: model.fingerprint.clone(),
    };
    // llama-server's `verbose`: the prompt as the model reads it (the first, for a batch).
    let echo = (g.verbose && !g.stream)
        .then(|| prompts.first().and_then(|p| model.tok.decode(p, true).ok()))
        .flatten();
    let mut gen = generate::start_many(&st, model, prompts, &g, fault, log.start)
        .await
        // A completion's prompt is `prompt`, not chat's `messages`.
        .map_err(|e| match kind {
            Kind::Text => e.naming_prompt("prompt"),
            Kind::Chat => e,
        })?;
    let unenforced = std::mem::take(&mut gen.unenforced);
    // Calls are parsed out of chat answers whenever the model was shown tools, and
    // reasoning whenever the request splits it.
    let split = (kind == Kind::Chat).then(|| Split {
        tools: g.shown_tools().cloned(),
        reasoning: g.reasoning,
    });
    let resp = if g.stream {
        stream_reply(gen, reply, g, log, split).await
    } else {
        collect_reply(gen, reply, split, echo).await
    };
    resp.map(|r| generate::mark_unenforced(r, &unenforced))
}

/// How a chat answer is taken apart.
#[derive(Debug, Clone)]
struct Split {
    tools: Option<crate::tools::ToolSpec>,
    reasoning: crate::reasoning::Reasoning,
}

impl Split {
    fn splitter(&self) -> AnswerSplitter {
        AnswerSplitter::new(self.reasoning, self.tools.as_ref())
    }
}

/// Fixed parts of every object of one response.
#[derive(Clone)]
struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    /// `system_fingerprint`: the build and the model's weights (see `fingerprint`).
    fingerprint: String,
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
        offset += l.chosen.text.chars().count();
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

/// OpenAI's `tool_calls` entry for call `k` of a choice.
fn tool_call(r: &Reply, choice: usize, k: usize, c: &tools::Call) -> Value {
    json!({
        "id": call_id(r, choice, k), "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    })
}

/// A call id unique to the response, its choice and the call's place in it.
fn call_id(r: &Reply, choice: usize, k: usize) -> String {
    let tail = r.id.rsplit('-').next().unwrap_or(&r.id);
    format!("call_{tail}_{choice}_{k}")
}

async fn collect_reply(
    gen: Generation,
    r: Reply,
    split: Option<Split>,
    verbose: Option<String>,
) -> Result<Response, ApiError> {
    let out = gen.collect().await?;
    let summary = out.usage();
    let choices: Vec<Value> = out
        .choices
        .iter()
        .map(|c| {
            let lp = (!c.logprobs.is_empty()).then_some(&c.logprobs);
            match (r.kind, &split) {
                (Kind::Chat, Some(sp)) => {
                    let a = answer::split(&c.text, sp.reasoning, sp.tools.as_ref());
                    let mut message =
                        json!({"role": "assistant", "content": a.text, "refusal": null});
                    if !a.reasoning.is_empty() {
                        message["reasoning_content"] = json!(a.reasoning);
                    }
                    let mut finish = c.summary.finish.as_str();
                    if !a.calls.is_empty() {
                        if a.text.is_empty() {
                            message["content"] = Value::Null;
                        }
                        message["tool_calls"] = a
                            .calls
                            .iter()
                            .enumerate()
                            .map(|(k, call)| tool_call(&r, c.summary.choice, k, call))
                            .collect();
                        // The token limit is reported as OpenAI reports it, calls or not:
                        // the answer stopped short (a call cut off there is dropped).
                        if c.summary.finish == Finish::Stop {
                            finish = "tool_calls";
                        }
                    }
                    json!({
                        "index": c.summary.choice,
                        "message": message,
                        "logprobs": lp.map_or(Value::Null, |l| chat_logprobs(l)),
                        "finish_reason": finish,
                    })
                }
                (Kind::Chat, None) => json!({
                    "index": c.summary.choice,
                    "message": {"role": "assistant", "content": c.text, "refusal": null},
                    "logprobs": lp.map_or(Value::Null, |l| chat_logprobs(l)),
                    "finish_reason": c.summary.finish.as_str(),
                }),
                (Kind::Text, _) => json!({
                    "index": c.summary.choice,
                    "text": c.text,
                    "logprobs": lp.map_or(Value::Null, |l| text_logprobs(l, 0)),
                    "finish_reason": c.summary.finish.as_str(),
                }),
            }
        })
        .collect();
    let mut body = r.head(match r.kind {
        Kind::Chat => "chat.completion",
        Kind::Text => "text_completion",
    });
    body["choices"] = Value::Array(choices);
    body["usage"] = usage(&summary);
    body["timings"] = timings::of_summary(&summary);
    if let Some(prompt) = verbose {
        let content = out
            .choices
            .first()
            .map(|c| c.text.as_str())
            .unwrap_or_default();
        body["__verbose"] = json!({
            "prompt": prompt,
            "content": content,
            "tokens_evaluated": summary.prompt_tokens,
            "tokens_predicted": summary.completion_tokens,
        });
    }
    let mut resp = Json(body).into_response();
    resp.extensions_mut().insert(summary);
    Ok(resp)
}

impl Reply {
    /// The fields every object of this response carries, `choices` empty.
    fn head(&self, object: &str) -> Value {
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "system_fingerprint": self.fingerprint, "choices": [],
        })
    }

    /// One streamed object holding `choice`; `usage: null` on every chunk but the last
    /// when the client asked for the usage chunk, as OpenAI sends it.
    fn chunk(&self, choice: Value, include_usage: bool) -> Value {
        let mut v = self.head(match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text => "text_completion",
        });
        v["choices"] = json!([choice]);
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    }
}

/// The choice of one streamed chunk: a content delta, or (`finish` set) the last one.
fn chunk_choice(
    kind: Kind,
    index: usize,
    text: Option<&str>,
    lps: &[TokenLogprob],
    offset: usize,
    finish: Option<&str>,
) -> Value {
    match kind {
        Kind::Chat => {
            let delta = match text {
                Some(t) => json!({"content": t}),
                None => json!({}),
            };
            json!({
                "index": index, "delta": delta,
                "logprobs": if lps.is_empty() { Value::Null } else { chat_logprobs(lps) },
                "finish_reason": finish,
            })
        }
        Kind::Text => json!({
            "index": index, "text": text.unwrap_or(""),
            "logprobs": if lps.is_empty() { Value::Null } else { text_logprobs(lps, offset) },
            "finish_reason": finish,
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
    /// Characters of text sent so far, per choice (text completions' `text_offset`,
    /// which OpenAI counts in characters).
    offsets: Vec<usize>,
    /// Choices that have ended, with their counts.
    finished: Vec<Option<Summary>>,
    /// Per chat choice: the splitter of its answer and its calls so far.
    /// Log-probabilities of tokens whose text the splitter still holds back ride on the
    /// next chunk it passes on.
    splitters: Option<Vec<(AnswerSplitter, usize, Vec<TokenLogprob>)>>,
    done: bool,
    log: RequestLog,
}

/// The frames one event becomes.
fn frames(s: &mut StreamState, ev: Event) -> Vec<Sse> {
    let kind = s.reply.kind;
    match ev {
        Event::Progress(p) => {
            // llama-server's `return_progress`: an empty delta carrying the progress.
            let c = match kind {
                Kind::Chat => json!({"index": 0, "delta": {}, "logprobs": null,
                                     "finish_reason": null}),
                Kind::Text => chunk_choice(kind, 0, Some(""), &[], 0, None),
            };
            let mut v = s.reply.chunk(c, s.include_usage);
            v["prompt_progress"] = timings::progress(&p);
            if let Some(t) = s.gen.timings_now(0) {
                v["timings"] = t;
            }
            vec![data(&v)]
        }
        Event::Chunk {
            choice,
            text,
            logprobs,
            generated,
        } => {
            let Some(offset) = s.offsets.get_mut(choice) else {
                return Vec::new();
            };
            let mut out = Vec::new();
            if let Some((sp, n, held)) = s.splitters.as_mut().and_then(|v| v.get_mut(choice)) {
                let pieces = answer::coalesce(sp.push(&text));
                held.extend(logprobs);
                out = tool_frames(&s.reply, s.include_usage, choice, pieces, n, held);
            } else {
                let c = chunk_choice(kind, choice, Some(&text), &logprobs, *offset, None);
                *offset += text.chars().count();
                out.push(s.reply.chunk(c, s.include_usage));
            }
            if let (Some(t), Some(last)) = (s.gen.timings_now(generated), out.last_mut()) {
                last["timings"] = t;
            }
            out.iter().map(data).collect()
        }
        Event::Done(sum) => {
            let Some(slot) = s.finished.get_mut(sum.choice) else {
                return Vec::new();
            };
            *slot = Some(sum);
            let offset = s.offsets.get(sum.choice).copied().unwrap_or(0);
            let mut out = Vec::new();
            let mut finish = sum.finish.as_str();
            if let Some((sp, n, held)) = s.splitters.as_mut().and_then(|v| v.get_mut(sum.choice)) {
                let mut rest = answer::coalesce(sp.finish());
                if rest.is_empty() && !held.is_empty() {
                    // Log-probabilities of tokens without text (the end token) still go out.
                    rest.push(Out::Text(String::new()));
                }
                out = tool_frames(&s.reply, s.include_usage, sum.choice, rest, n, held);
                if *n > 0 && sum.finish == Finish::Stop {
                    finish = "tool_calls";
                }
            }
            let c = chunk_choice(kind, sum.choice, None, &[], offset, Some(finish));
            out.push(s.reply.chunk(c, s.include_usage));
            let mut end = None;
            if s.finished.iter().all(Option::is_some) {
                s.done = true;
                let all: Vec<Summary> = s.finished.iter().flatten().copied().collect();
                let total = generate::usage(&all, s.gen.per_prompt);
                s.log.summary = Some(total);
                if s.include_usage {
                    let mut v = s.reply.chunk(Value::Null, false);
                    v["choices"] = json!([]);
                    v["usage"] = usage(&total);
                    out.push(v);
                }
                // llama-server's `timings` ride on the last chunk of a stream.
                if let Some(last) = out.last_mut() {
                    last["timings"] = timings::of_summary(&total);
                }
                end = Some(Sse::default().data("[DONE]"));
            }
            out.iter().map(data).chain(end).collect()
        }
        Event::Error(e) => {
            s.done = true;
            s.log.status = e.status.as_u16();
            vec![data(&e.body()), Sse::default().data("[DONE]")]
        }
    }
}

/// The chunks of a chat stream for what the splitter passed on: reasoning deltas
/// (`reasoning_content`, as llama-server and DeepSeek stream it), content deltas, and
/// each complete call as OpenAI streams one (its index, id, type and name first, with
/// empty arguments; then its arguments). `n` counts the choice's calls.
fn tool_frames(
    r: &Reply,
    include_usage: bool,
    choice: usize,
    pieces: Vec<Out>,
    n: &mut usize,
    held: &mut Vec<TokenLogprob>,
) -> Vec<Value> {
    let mut out = Vec::new();
    for p in pieces {
        let delta = match p {
            Out::Reasoning(t) => vec![json!({"reasoning_content": t})],
            Out::Text(t) => vec![json!({"content": t})],
            Out::Call(c) => {
                let k = *n;
                *n += 1;
                vec![
                    json!({"tool_calls": [{"index": k, "id": call_id(r, choice, k),
                        "type": "function", "function": {"name": c.name, "arguments": ""}}]}),
                    json!({"tool_calls": [{"index": k, "function": {"arguments": c.arguments}}]}),
                ]
            }
        };
        for d in delta {
            let lps = std::mem::take(held);
            let c = json!({
                "index": choice, "delta": d,
                "logprobs": if lps.is_empty() { Value::Null } else { chat_logprobs(&lps) },
                "finish_reason": null,
            });
            out.push(r.chunk(c, include_usage));
        }
    }
    out
}

async fn stream_reply(
    mut gen: Generation,
    reply: Reply,
    g: GenRequest,
    mut log: RequestLog,
    split: Option<Split>,
) -> Result<Response, ApiError> {
    // The status is decided by the first event: a failure before any token is a plain
    // JSON error, not a 200 stream.
    let first = gen.next().await;
    if let Event::Error(e) = first {
        return Err(e);
    }
    log.status = 200;
    log.emit_on_drop = true;
    let n = gen.n;
    let mut head = Vec::new();
    if reply.kind == Kind::Chat {
        // The role comes once per choice, in its first delta, and only there. Its
        // content is null, as llama-server sends it (and OpenAI does before a tool
        // call): llama-server's clients take every content they get to be text.
        for index in 0..n {
            let c = json!({"index": index, "delta": {"role": "assistant", "content": null},
                           "logprobs": null, "finish_reason": null});
            head.push(data(&reply.chunk(c, g.include_usage)));
        }
    }
    let state = StreamState {
        gen,
        first: Some(first),
        reply,
        include_usage: g.include_usage,
        offsets: vec![0; n],
        finished: vec![None; n],
        splitters: split.map(|sp| (0..n).map(|_| (sp.splitter(), 0, Vec::new())).collect()),
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

/// OpenAI's `system_fingerprint` for a model: `fp_` and 16 hex digits of an FNV-1a hash
/// of this build's version and the model's digest, so it changes exactly when the
/// software or the weights that produce the answers change.
pub fn fingerprint(model_digest: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in env!("CARGO_PKG_VERSION")
        .as_bytes()
        .iter()
        .chain(model_digest)
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("fp_{h:016x}")
}

/// Elapsed wall time as seconds with millisecond precision, for the log.
pub fn secs(start: Instant) -> f64 {
    (start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_stable_and_follow_the_model() {
        let a = fingerprint(&[1; 32]);
        assert_eq!(a, fingerprint(&[1; 32]));
        assert_ne!(a, fingerprint(&[2; 32]));
        assert!(a.starts_with("fp_") && a.len() == 19, "{a}");
    }

    #[test]
    fn text_offsets_count_characters() {
        let lp = |t: &str| TokenLogprob {
            chosen: crate::job::Candidate {
                text: t.into(),
                bytes: t.as_bytes().to_vec(),
                logprob: -0.5,
                id: 1,
            },
            top: Vec::new(),
        };
        let v = text_logprobs(&[lp("私は"), lp("あなた"), lp("に")], 3);
        assert_eq!(v["text_offset"], json!([3, 5, 8]));
    }
}
