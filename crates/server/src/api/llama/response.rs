//! llama-server's answers: its error shape, the final object of a completion (settings,
//! timings, stop type, token probabilities), and its server-sent event stream.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

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

/// llama-server's error `type` for an error of this status (its `error_type` names,
/// server-common.cpp): a prompt over the context is `exceed_context_size_error`; the
/// statuses llama-server never answers (405, 408, 409, 413, 415) are request errors.
pub fn llama_type(status: u16, over_context: bool) -> &'static str {
    match status {
        400 if over_context => "exceed_context_size_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        501 => "not_supported_error",
        503 | 504 => "unavailable_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    }
}

/// The JSON body llama-server answers an error with, on its routes and in its streams:
/// `{"error": {"code", "message", "type"}}`, and for a prompt over the context its
/// message with `n_prompt_tokens` and `n_ctx` (server-context.cpp's
/// `exceed_context_size_error`).
pub fn error_body(e: &ApiError) -> Value {
    match e.context {
        Some((prompt, ctx)) => json!({"error": {
            "code": e.status.as_u16(),
            "message": format!(
                "request ({prompt} tokens) exceeds the available context size ({ctx} \
                 tokens), try increasing it"
            ),
            "type": llama_type(e.status.as_u16(), true),
            "n_prompt_tokens": prompt,
            "n_ctx": ctx,
        }}),
        None => json!({"error": {
            "code": e.status.as_u16(),
            "message": e.message,
            "type": llama_type(e.status.as_u16(), false),
        }}),
    }
}

impl IntoResponse for LlamaError {
    fn into_response(self) -> Response {
        let mut resp = (self.0.status, Json(error_body(&self.0))).into_response();
        let h = resp.headers_mut();
        if let Some(secs) = self.0.retry_after {
            h.insert(header::RETRY_AFTER, axum::http::HeaderValue::from(secs));
        }
        // As OpenAI's shape does: a client that lacks the key is told the scheme.
        if self.0.status == axum::http::StatusCode::UNAUTHORIZED {
            h.insert(
                header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

/// The `generation_settings` object of an answer (and `/props`' defaults).
pub(super) fn settings_json(m: &Model, o: &Options) -> Value {
    let s = &o.g.sampling;
    let n_predict = m.answer_limit(o.g.max_tokens).map_or(-1, |n| n as i64);
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
        "post_sampling_probs": o.g.post_sampling,
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

/// `completion_probabilities`: each token with its log-probability and alternatives, or,
/// for `post_sampling_probs` (`post`), with its probability under the distribution the
/// sampler drew from and that distribution's most likely tokens, as llama-server names
/// them (`prob`, `top_probs`).
pub(super) fn probabilities(lps: &[TokenLogprob], post: bool) -> Value {
    let one = |c: &crate::job::Candidate| {
        let mut v = json!({"id": c.id, "token": c.text, "bytes": c.bytes});
        match post {
            true => v["prob"] = json!((c.logprob as f64).exp()),
            false => v["logprob"] = json!(c.logprob),
        }
        v
    };
    let top = if post { "top_probs" } else { "top_logprobs" };
    lps.iter()
        .map(|l| {
            let mut v = one(&l.chosen);
            v[top] = l.top.iter().map(one).collect();
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
    /// Positions of the model's slot: a generation that fills them is `truncated`.
    pub(super) n_ctx: usize,
    /// The slot the prompt ran in, once the worker admitted it.
    pub(super) slot: Arc<OnceLock<usize>>,
}

impl Echo {
    /// llama-server's `id_slot`: the slot that ran the request, -1 before it has one.
    pub(super) fn id_slot(&self) -> i64 {
        self.slot.get().map_or(-1, |&s| s as i64)
    }
}

/// Whether a generation stopped because the slot's context ran out (llama-server's
/// `truncated`): it ended on the length limit with every position of the slot used,
/// not on the `n_predict` it asked for.
pub(super) fn truncated(s: &Summary, n_ctx: usize) -> bool {
    s.finish == Finish::Length && s.prompt_tokens + s.completion_tokens >= n_ctx
}

/// llama-server's `response_fields` (its `json_get_nested_values`): an object holding,
/// under each path as given, the value it reaches in `v` (`a/b` is `v["a"]["b"]`);
/// paths that reach nothing are left out.
pub fn select_fields(v: &Value, paths: &[String]) -> Value {
    let mut out = serde_json::Map::new();
    for path in paths {
        let mut cur = Some(v);
        for key in path.split('/') {
            cur = cur.and_then(|c| c.as_object()).and_then(|o| o.get(key));
        }
        if let Some(found) = cur {
            out.insert(path.clone(), found.clone());
        }
    }
    Value::Object(out)
}

/// llama-server's `n_indent` and `t_max_predict_ms` stops, read off the generated text
/// as it comes (per chunk: a token, or the tokens a stop string held back).
#[derive(Debug, Default)]
pub struct Limits {
    n_indent: usize,
    t_max: Option<Duration>,
    /// The text generated so far.
    text: String,
    /// Whether an earlier chunk held a newline.
    has_new_line: bool,
    /// Start of the line whose indentation is checked next (0: none yet).
    last_nl_pos: usize,
    first_at: Option<Instant>,
}

impl Limits {
    /// The stops a request asks for (none: every push answers `None`).
    pub fn new(n_indent: usize, t_max: Option<Duration>) -> Self {
        Limits {
            n_indent,
            t_max,
            ..Limits::default()
        }
    }

    /// Takes the next chunk of text, arriving at `now`. `Some(n)` when generation must
    /// stop, keeping the first `n` bytes of [`Self::text`]. The rules are
    /// server-context.cpp's: once a newline has been seen, a line that starts with
    /// less indentation than `n_indent` is cut before its first non-blank character
    /// (the newline and its blanks stay); a chunk holding a newline ends generation
    /// once `t_max` has passed since the first chunk.
    pub fn push(&mut self, chunk: &str, now: Instant) -> Option<usize> {
        let first = *self.first_at.get_or_insert(now);
        self.text.push_str(chunk);
        let mut stop = None;
        if self.has_new_line && self.n_indent > 0 {
            if self.last_nl_pos > 0 {
                let line = &self.text.as_bytes()[self.last_nl_pos..];
                let blanks = line
                    .iter()
                    .take_while(|&&b| b == b' ' || b == b'\t')
                    .count();
                if blanks < line.len() && blanks < self.n_indent {
                    stop = Some(self.last_nl_pos + blanks);
                }
            }
            // The next line to check starts after the next newline (one per chunk, as
            // llama-server finds one per token).
            if let Some(i) = self.text[self.last_nl_pos..].find('\n') {
                self.last_nl_pos += i + 1;
            }
        }
        if chunk.contains('\n') {
            self.has_new_line = true;
            if self
                .t_max
                .is_some_and(|t| now.saturating_duration_since(first) > t)
            {
                stop = stop.or(Some(self.text.len()));
            }
        }
        if let Some(n) = stop {
            self.text.truncate(n);
        }
        stop
    }

    /// The summary of a generation these limits ended: its `generated` tokens, from a
    /// request that arrived at `arrived` with `prompt_tokens` (`cached` of them kept).
    /// The worker never reported its end, so the times are the ones seen here.
    pub fn summary(
        &self,
        prompt_tokens: usize,
        cached: usize,
        generated: usize,
        arrived: Instant,
    ) -> Summary {
        let now = Instant::now();
        let first = self.first_at.unwrap_or(now);
        Summary {
            choice: 0,
            finish: Finish::Length,
            prompt_tokens,
            cached_tokens: cached,
            completion_tokens: generated,
            prompt_time: first.saturating_duration_since(arrived),
            predicted_time: now.saturating_duration_since(first),
            stop_word: None,
        }
    }
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
        "id_slot": e.id_slot(),
        "stop": true,
        "model": e.model,
        "tokens_predicted": s.completion_tokens,
        "tokens_evaluated": s.prompt_tokens,
        "generation_settings": e.settings,
        "prompt": e.prompt_text,
        "has_new_line": text.contains('\n'),
        "truncated": truncated(s, e.n_ctx),
        "stop_type": ty,
        "stopping_word": word,
        "tokens_cached": s.cached_tokens,
        "timings": timings::of_summary(s),
    });
    if !streamed && e.opts.n_probs > 0 {
        v["completion_probabilities"] = probabilities(lps, e.opts.g.post_sampling);
    }
    if e.opts.response_fields.is_empty() {
        v
    } else {
        select_fields(&v, &e.opts.response_fields)
    }
}

/// Reads a one-choice generation to its end, or to the stop `limits` call for (the
/// generation is then dropped, which cancels it in the worker): its text, its tokens'
/// log-probabilities and its summary.
async fn collect_limited(
    mut gen: Generation,
    mut limits: Limits,
    arrived: Instant,
) -> Result<(String, Vec<TokenLogprob>, Summary), ApiError> {
    let (mut lps, mut cached) = (Vec::new(), 0);
    loop {
        match gen.next().await {
            Event::Chunk {
                text,
                logprobs,
                generated,
                ..
            } => {
                lps.extend(logprobs);
                if limits.push(&text, Instant::now()).is_some() {
                    let s = limits.summary(gen.prompt_tokens, cached, generated, arrived);
                    return Ok((limits.text, lps, s));
                }
            }
            Event::Done(s) => return Ok((limits.text, lps, s)),
            Event::Error(e) => return Err(e),
            Event::Progress(p) => cached = p.cache,
        }
    }
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
    let mut echo = Echo {
        settings: settings_json(&m, &opts),
        opts,
        prompt_text,
        model: m.id.clone(),
        n_ctx: m.slot_ctx,
        slot: Arc::default(),
    };
    let mut gen = generate::start(&st, m, prompt, &echo.opts.g, fault, log.start).await?;
    let unenforced = std::mem::take(&mut gen.unenforced);
    if let Some(slot) = gen.ran_in.first() {
        echo.slot = Arc::clone(slot);
    }
    let limits = Limits::new(echo.opts.n_indent, echo.opts.t_max_predict);
    if !echo.opts.g.stream {
        // A native request has one choice (`n` is OpenAI's only).
        let (text, lps, summary) = collect_limited(gen, limits, log.start).await?;
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
        limits,
        cached: 0,
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
    let (model, n_ctx) = (m.id.clone(), m.slot_ctx);
    let mut gen = generate::start_many(&st, m, prompts, &opts.g, None, log.start).await?;
    let unenforced = std::mem::take(&mut gen.unenforced);
    let ran_in = gen.ran_in.clone();
    let out = gen.collect().await?;
    let mut echo = Echo {
        settings,
        opts,
        prompt_text: String::new(),
        model,
        n_ctx,
        slot: Arc::default(),
    };
    let mut all = Vec::with_capacity(out.choices.len());
    for (c, text) in out.choices.iter().zip(texts) {
        echo.prompt_text = text;
        // One job per prompt, each with one choice: choice `i` is prompt `i`'s.
        if let Some(slot) = ran_in.get(c.summary.choice) {
            echo.slot = Arc::clone(slot);
        }
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
    /// The `n_indent` and `t_max_predict_ms` stops.
    pub(super) limits: Limits,
    /// Prompt tokens kept in the slot, as the prompt's progress reported them.
    pub(super) cached: usize,
    pub(super) log: RequestLog,
}

impl Streaming {
    pub(super) fn frame(&mut self, ev: Event) -> Sse {
        let data = |v: Value| Sse::default().data(v.to_string());
        match ev {
            Event::Progress(p) => {
                self.cached = p.cache;
                let mut v = json!({
                    "index": 0,
                    "content": "",
                    "tokens": [],
                    "stop": false,
                    "id_slot": self.echo.id_slot(),
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
                // A limit that ends the generation here ends the stream with the final
                // object next (this chunk has gone out whole, as llama-server's has);
                // the generation is dropped with the stream, which cancels it.
                if self.limits.push(&text, Instant::now()).is_some() {
                    let s =
                        self.limits
                            .summary(self.n_prompt, self.cached, generated, self.log.start);
                    self.first = Some(Event::Done(s));
                }
                let mut v = json!({
                    "index": 0,
                    "content": text,
                    "tokens": logprobs.iter().map(|l| l.chosen.id).collect::<Vec<_>>(),
                    "stop": false,
                    "id_slot": self.echo.id_slot(),
                    "tokens_predicted": self.predicted,
                    "tokens_evaluated": self.n_prompt,
                });
                if self.echo.opts.n_probs > 0 {
                    v["completion_probabilities"] =
                        probabilities(&logprobs, self.echo.opts.g.post_sampling);
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
