//! llama-server's answers: its error shape, the final object of a completion (settings,
//! timings, stop type, token probabilities), and its server-sent event stream.

use std::convert::Infallible;
use std::sync::Arc;

use axum::http::header;
use axum::response::sse::{Event as Sse, Sse as SseBody};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};

use super::request::Options;
use crate::api::timings;
use crate::error::ApiError;
use crate::generate::{self, Generation};
use crate::job::{Event, Finish, Summary, TokenLogprob};
use crate::{AppState, Model, RequestLog, StreamLogged};

/// An error in llama-server's shape: `{"error": {"code", "message", "type"}}` with the
/// HTTP status as a number in `code` (OpenAI's routes carry OpenAI's string codes).
#[derive(Debug)]
pub struct LlamaError(pub ApiError);

impl From<ApiError> for LlamaError {
    fn from(e: ApiError) -> Self {
        LlamaError(e)
    }
}

/// The JSON body llama-server answers an error with, on its routes and in its streams.
pub(super) fn error_body(e: &ApiError) -> Value {
    json!({"error": {
        "code": e.status.as_u16(), "message": e.message, "type": e.kind(),
    }})
}

impl IntoResponse for LlamaError {
    fn into_response(self) -> Response {
        let mut resp = (self.0.status, Json(error_body(&self.0))).into_response();
        if let Some(secs) = self.0.retry_after {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        resp
    }
}

/// The `generation_settings` object of an answer (and `/props`' defaults).
pub(super) fn settings_json(m: &Model, o: &Options) -> Value {
    let s = &o.g.sampling;
    let n_predict = o.g.max_tokens.map_or(-1, |m| m as i64);
    json!({
        "n_ctx": m.slot_ctx,
        "model": m.id,
        "n_predict": n_predict,
        "max_tokens": n_predict,
        "seed": s.seed,
        "temperature": s.temperature,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "xtc_probability": 0.0,
        "xtc_threshold": 0.1,
        "typical_p": 1.0,
        "repeat_last_n": s.penalty_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "dry_multiplier": 0.0,
        "mirostat": 0,
        "stop": o.g.stop,
        "n_keep": 0,
        "n_discard": 0,
        "ignore_eos": o.ignore_eos,
        "stream": o.g.stream,
        // llama-server's shape; a ban (`false`, `ignore_eos`) is its -inf, null in JSON.
        "logit_bias": s.logit_bias.iter().map(|&(t, b)| json!({
            "token": t,
            "bias": if b <= minfer_runtime::LOGIT_BIAS_BAN { None } else { Some(b) },
        })).collect::<Vec<_>>(),
        "n_probs": o.n_probs,
        "min_keep": 0,
        "grammar": match &o.g.grammar {
            Some((minfer_runtime::Grammar::Gbnf(g), _)) => g.as_str(),
            _ => "",
        },
        "samplers": ["logit_bias", "penalties", "top_k", "top_p", "min_p", "temperature"],
        "timings_per_token": o.g.telemetry.per_token,
        "cache_prompt": o.g.cache_prompt,
        "id_slot": o.g.slot.map_or(-1, |s| s as i64),
    })
}

/// llama-server's `stop_type` and `stopping_word`.
pub(super) fn stop_type(s: &Summary, stops: &[String]) -> (&'static str, String) {
    match (s.finish, s.stop_word) {
        (Finish::Length, _) => ("limit", String::new()),
        (Finish::Stop, Some(i)) => ("word", stops.get(i).cloned().unwrap_or_default()),
        (Finish::Stop, None) => ("eos", String::new()),
    }
}

/// `completion_probabilities`: each token with its log-probability and alternatives.
pub(super) fn probabilities(lps: &[TokenLogprob]) -> Value {
    let one = |c: &crate::job::Candidate| json!({"id": c.id, "token": c.text, "bytes": c.bytes, "logprob": c.logprob});
    lps.iter()
        .map(|l| {
            let mut v = one(&l.chosen);
            v["top_logprobs"] = l.top.iter().map(one).collect();
            v
        })
        .collect()
}

/// What an answer echoes of its request.
pub(super) struct Echo {
    pub(super) opts: Options,
    pub(super) settings: Value,
    pub(super) prompt_text: String,
    pub(super) model: String,
}

/// The final object of a generation (`stop: true`); a stream's has no content, tokens
/// or probabilities, which went out with its chunks.
pub(super) fn final_object(
    e: &Echo,
    text: &str,
    lps: &[TokenLogprob],
    s: &Summary,
    streamed: bool,
) -> Value {
    let (ty, word) = stop_type(s, &e.opts.g.stop);
    let tokens: Vec<u32> = if e.opts.return_tokens && !streamed {
        lps.iter().map(|l| l.chosen.id).collect()
    } else {
        Vec::new()
    };
    let mut v = json!({
        "index": 0,
        "content": if streamed { "" } else { text },
        "tokens": tokens,
        "stop": true,
        "model": e.model,
        "tokens_predicted": s.completion_tokens,
        "tokens_evaluated": s.prompt_tokens,
        "generation_settings": e.settings,
        "prompt": e.prompt_text,
        "has_new_line": text.contains('\n'),
        "truncated": false,
        "stop_type": ty,
        "stopping_word": word,
        "tokens_cached": s.cached_tokens,
        "timings": timings::of_summary(s),
    });
    if !streamed && e.opts.n_probs > 0 {
        v["completion_probabilities"] = probabilities(lps);
    }
    v
}

/// Runs a parsed native request: one JSON object, or server-sent events ending with the
/// final object (llama-server sends no `[DONE]` on its own routes).
pub(super) async fn run(
    st: Arc<AppState>,
    m: Arc<Model>,
    prompt: Vec<u32>,
    opts: Options,
    fault: Option<crate::job::Fault>,
    mut log: RequestLog,
) -> Result<Response, ApiError> {
    let prompt_text = m.tok.decode(&prompt, true).unwrap_or_default();
    let n_prompt = prompt.len();
    let echo = Echo {
        settings: settings_json(&m, &opts),
        opts,
        prompt_text,
        model: m.id.clone(),
    };
    let mut gen = generate::start(&st, m, prompt, &echo.opts.g, fault, log.start).await?;
    let unenforced = std::mem::take(&mut gen.unenforced);
    if !echo.opts.g.stream {
        // A native request has one choice (`n` is OpenAI's only).
        let (text, lps, summary) = gen.collect_one().await?;
        let mut resp = Json(final_object(&echo, &text, &lps, &summary, false)).into_response();
        resp.extensions_mut().insert(summary);
        return Ok(generate::mark_unenforced(resp, &unenforced));
    }
    // A failure before the first event is a plain JSON error, not a 200 stream.
    let first = gen.next().await;
    if let Event::Error(e) = first {
        return Err(e);
    }
    log.status = 200;
    log.emit_on_drop = true;
    let state = Streaming {
        gen,
        first: Some(first),
        echo,
        n_prompt,
        predicted: 0,
        has_new_line: false,
        done: false,
        log,
    };
    let body = stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let ev = match s.first.take() {
            Some(ev) => ev,
            None => s.gen.next().await,
        };
        let frame = s.frame(ev);
        Some((frame, s))
    });
    let mut resp = SseBody::new(body.map(Ok::<_, Infallible>)).into_response();
    resp.extensions_mut().insert(StreamLogged);
    Ok(generate::mark_unenforced(resp, &unenforced))
}

/// Runs llama-server's batch of prompts (non-streamed): one job per prompt, answered
/// as a JSON array of each prompt's final object, with its `index`.
pub(super) async fn run_batch(
    st: Arc<AppState>,
    m: Arc<Model>,
    prompts: Vec<Vec<u32>>,
    opts: Options,
    log: RequestLog,
) -> Result<Response, ApiError> {
    if opts.g.stream {
        return Err(ApiError::bad_request(
            "field `prompt` holds several prompts, which are answered as one JSON array: \
             send them without `stream`, or one prompt per streamed request",
        )
        .with_param("stream"));
    }
    let texts: Vec<String> = prompts
        .iter()
        .map(|p| m.tok.decode(p, true).unwrap_or_default())
        .collect();
    let settings = settings_json(&m, &opts);
    let model = m.id.clone();
    let mut gen = generate::start_many(&st, m, prompts, &opts.g, None, log.start).await?;
    let unenforced = std::mem::take(&mut gen.unenforced);
    let out = gen.collect().await?;
    let mut echo = Echo {
        settings,
        opts,
        prompt_text: String::new(),
        model,
    };
    let mut all = Vec::with_capacity(out.choices.len());
    for (c, text) in out.choices.iter().zip(texts) {
        echo.prompt_text = text;
        let mut v = final_object(&echo, &c.text, &c.logprobs, &c.summary, false);
        v["index"] = json!(c.summary.choice);
        all.push(v);
    }
    let mut resp = Json(Value::Array(all)).into_response();
    resp.extensions_mut().insert(out.usage());
    Ok(generate::mark_unenforced(resp, &unenforced))
}

/// A native stream in progress.
pub(super) struct Streaming {
    pub(super) gen: Generation,
    pub(super) first: Option<Event>,
    pub(super) echo: Echo,
    pub(super) n_prompt: usize,
    pub(super) predicted: usize,
    pub(super) has_new_line: bool,
    pub(super) done: bool,
    pub(super) log: RequestLog,
}

impl Streaming {
    pub(super) fn frame(&mut self, ev: Event) -> Sse {
        let data = |v: Value| Sse::default().data(v.to_string());
        match ev {
            Event::Progress(p) => {
                let mut v = json!({
                    "index": 0,
                    "content": "",
                    "tokens": [],
                    "stop": false,
                    "id_slot": -1,
                    "tokens_predicted": 0,
                    "tokens_evaluated": self.n_prompt,
                    "prompt_progress": timings::progress(&p),
                });
                if let Some(t) = self.gen.timings_now(0) {
                    v["timings"] = t;
                }
                data(v)
            }
            Event::Chunk {
                text,
                logprobs,
                generated,
                ..
            } => {
                self.predicted += logprobs.len();
                self.has_new_line |= text.contains('\n');
                let mut v = json!({
                    "index": 0,
                    "content": text,
                    "tokens": logprobs.iter().map(|l| l.chosen.id).collect::<Vec<_>>(),
                    "stop": false,
                    "tokens_predicted": self.predicted,
                    "tokens_evaluated": self.n_prompt,
                });
                if self.echo.opts.n_probs > 0 {
                    v["completion_probabilities"] = probabilities(&logprobs);
                }
                if let Some(t) = self.gen.timings_now(generated) {
                    v["timings"] = t;
                }
                data(v)
            }
            Event::Done(s) => {
                self.done = true;
                self.log.summary = Some(s);
                let mut v = final_object(&self.echo, "", &[], &s, true);
                v["has_new_line"] = json!(self.has_new_line);
                data(v)
            }
            Event::Error(e) => {
                self.done = true;
                self.log.status = e.status.as_u16();
                data(error_body(&e))
            }
        }
    }
}

/// A JSON answer built off the async threads.
pub(super) fn json_response(bytes: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

pub(super) fn to_json(v: &Value) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(v).map_err(|e| ApiError::internal(format!("encoding the answer: {e}")))
}
