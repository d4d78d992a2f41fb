//! The one generation path every API codec shares: a codec parses its request into a
//! [`GenRequest`] and prompt tokens, [`start`] checks them against the model's slots and
//! queues the job, and the codec reads the [`Generation`]'s events (streaming) or its
//! [`Outcome`] (one answer) and renders them in its own shape. Sampling, slots, stop
//! strings and deadlines live here and in the worker, never in a codec.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::api::timings::Timings;
use crate::error::ApiError;
use crate::params::{GenRequest, Telemetry};
use crate::worker::{Event, Fault, Job, PromptProgress, Summary, TokenLogprob, EVENT_CAPACITY};
use crate::{AppState, Model};
use minfer_runtime::{CompiledGrammar, Grammar};

pub use crate::chat_prompt::{
    chat_prompt, chat_prompt_with_tools, completion_prompt, fault_of, render_chat,
    render_chat_with, render_text, ChatPrompt, Continuation, KERNEL_PANIC_MARKER, PANIC_MARKER,
    SLOW_MARKER, SLOW_PREFILL_MARKER,
};

/// A queued or running generation: its events, bounded by the request's deadline and
/// the server's shutdown. Dropping it cancels the generation in the worker.
pub struct Generation {
    /// The model generating; held so that it stays loaded until the request ends.
    pub model: Arc<Model>,
    rx: mpsc::Receiver<Event>,
    waits: Waits,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Choices being generated, over all prompts; each ends with its own `Event::Done`.
    pub n: usize,
    /// Choices per prompt (`n` of the request): choice `c` is prompt `c / per_prompt`'s.
    pub per_prompt: usize,
    /// What the request's lenient schema asked that the grammar does not enforce (see
    /// [`mark_unenforced`]); empty when nothing was left out.
    pub unenforced: Vec<String>,
    /// Per prompt, the slot its first choice ran in, set once the worker admits it
    /// (llama-server's `id_slot`); empty until then.
    pub ran_in: Vec<Arc<std::sync::OnceLock<usize>>>,
    /// The stream telemetry asked for.
    telemetry: Telemetry,
    /// The prompt's progress as last reported, and when its end was reported.
    prompt: Option<(PromptProgress, Instant)>,
}

/// The response header that lists, in the grammar engine's words, the schema keywords a
/// non-strict request asked for that the output is not held to (`Unimplemented keys:
/// ["uniqueItems"]`).
pub const UNENFORCED_HEADER: &str = "x-minfer-schema-unenforced";

/// `resp` with [`UNENFORCED_HEADER`] when `unenforced` lists anything: the entries joined
/// by "; ", non-ASCII and control characters replaced by `?`, cut at 2,048 bytes.
pub fn mark_unenforced(
    mut resp: axum::response::Response,
    unenforced: &[String],
) -> axum::response::Response {
    if unenforced.is_empty() {
        return resp;
    }
    let text: String = unenforced
        .join("; ")
        .chars()
        .map(|c| {
            if c.is_ascii() && !c.is_ascii_control() {
                c
            } else {
                '?'
            }
        })
        .take(2048)
        .collect();
    if let Ok(v) = axum::http::HeaderValue::from_str(&text) {
        resp.headers_mut().insert(UNENFORCED_HEADER, v);
    }
    resp
}

/// One finished choice: its whole text, log-probabilities and counts.
#[derive(Debug, Clone)]
pub struct Choice {
    /// Generated text (stop strings excluded).
    pub text: String,
    /// Log-probabilities of its tokens, when asked for.
    pub logprobs: Vec<TokenLogprob>,
    /// Why it ended and its token counts.
    pub summary: Summary,
}

/// A finished generation.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The choices, in index order.
    pub choices: Vec<Choice>,
    /// Choices per prompt.
    pub per_prompt: usize,
}

impl Outcome {
    /// Counts of the whole request (see [`usage`]).
    pub fn usage(&self) -> Summary {
        let s: Vec<Summary> = self.choices.iter().map(|c| c.summary).collect();
        usage(&s, self.per_prompt)
    }
}

/// Counts of a whole request from its choices' summaries (in choice order, `per_prompt`
/// choices of each prompt): each prompt once (it was prefilled once for its choices),
/// the completion tokens of every choice, the slowest prompt's time; the finish reason
/// and decode time are choice 0's.
///
/// # Panics
/// On no choices (every request has at least one).
pub fn usage(choices: &[Summary], per_prompt: usize) -> Summary {
    let mut u = choices[0];
    u.completion_tokens = choices.iter().map(|c| c.completion_tokens).sum();
    let firsts = choices.iter().step_by(per_prompt.max(1));
    u.prompt_tokens = firsts.clone().map(|c| c.prompt_tokens).sum();
    u.cached_tokens = firsts.clone().map(|c| c.cached_tokens).sum();
    u.prompt_time = firsts.map(|c| c.prompt_time).max().unwrap_or_default();
    u
}

/// The request's output grammar or tool-call grammar, the request field that gave it and
/// the text that starts it (a lazy tool-call grammar); `None` when nothing constrains.
/// Tools beside a JSON output answer in calls or in that JSON (the request parsers refuse
/// them beside any other output grammar).
fn constraint_source(g: &GenRequest) -> Option<(Grammar, &'static str, Option<&'static str>)> {
    let tools = g.tools.as_ref().filter(|t| t.enabled());
    match (&g.grammar, tools) {
        (Some((gr, field)), Some(t)) => match t.grammar_with_output(gr) {
            Some((both, trigger)) => Some((both, *field, trigger)),
            None => Some((gr.clone(), *field, None)),
        },
        (Some((gr, field)), None) => Some((gr.clone(), *field, None)),
        (None, Some(t)) => t.grammar().map(|(gr, trigger)| (gr, "tools", trigger)),
        (None, None) => None,
    }
}

/// `grammar` compiled against the model's vocabulary; one that does not compile, or is
/// past a limit of the grammar engine, is a 400 naming `field` and the reason.
fn compile_constraint(
    m: &Model,
    grammar: &Grammar,
    field: &'static str,
    trigger: Option<&'static str>,
) -> Result<CompiledGrammar, ApiError> {
    let vocab = m.grammar_vocab().map_err(ApiError::internal)?;
    let c = CompiledGrammar::new(&vocab, grammar).map_err(|e| ApiError::constraint(field, &e))?;
    Ok(match trigger {
        Some(t) => c.triggered_by(t),
        None => c,
    })
}

/// Checks the prompt against the model's slots (and `id_slot` against their number),
/// queues the job and returns its generation. `arrived` is when the request arrived (its deadline counts from there).
pub async fn start(
    st: &AppState,
    m: Arc<Model>,
    prompt: Vec<u32>,
    g: &GenRequest,
    fault: Option<Fault>,
    arrived: Instant,
) -> Result<Generation, ApiError> {
    start_many(st, m, vec![prompt], g, fault, arrived).await
}

/// Most prompts one request may hold (a batch of completions).
pub const MAX_PROMPTS: usize = 64;

/// [`start`] for a batch of prompts (OpenAI's and llama-server's completions take an
/// array): one job per prompt, each with `g.n` choices, all reporting on one channel,
/// prompt `p`'s choices numbered `p * n ..`. Every prompt is checked before any is
/// queued, so a refusal names its prompt and runs nothing.
pub async fn start_many(
    st: &AppState,
    m: Arc<Model>,
    prompts: Vec<Vec<u32>>,
    g: &GenRequest,
    fault: Option<Fault>,
    arrived: Instant,
) -> Result<Generation, ApiError> {
    // The grammar is compiled first, so that a grammar past the engine's limits is the
    // error whatever else the request asks (2,000 tools also overflow the context), and
    // off the async threads, since a large one takes a while.
    let constraint = match constraint_source(g) {
        None => None,
        Some((grammar, field, trigger)) => {
            let model = Arc::clone(&m);
            let c = st
                .blocking
                .run(move || compile_constraint(&model, &grammar, field, trigger))
                .await??;
            Some((c, field))
        }
    };
    let unenforced = constraint
        .as_ref()
        .map_or_else(Vec::new, |(c, _)| c.unenforced().to_vec());
    if prompts.is_empty() || prompts.len() > MAX_PROMPTS {
        return Err(ApiError::bad_request(format!(
            "field `prompt` holds {} prompts: send 1 to {MAX_PROMPTS}",
            prompts.len()
        ))
        .with_param("prompt"));
    }
    let ctx = m.slot_ctx;
    let many = prompts.len() > 1;
    // A refusal of one prompt of a batch names it.
    let of = |i: usize, mut e: ApiError| {
        if many {
            e.message = format!("prompt {i}: {}", e.message);
        }
        e
    };
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(of(i, ApiError::bad_request("the prompt is empty")));
        }
        // A slot holds the prompt and at least one generated token.
        if p.len() >= ctx {
            return Err(of(i, ApiError::context_length_exceeded(ctx, p.len())));
        }
    }
    if g.n > m.n_slots {
        return Err(ApiError::bad_request(format!(
            "field `n` is {}: must be in [1, {}], the slots of this model (each choice \
             generates in its own slot)",
            g.n, m.n_slots
        ))
        .with_param("n"));
    }
    let n_vocab = m.tok.n_vocab();
    g.sampling
        .validate_for_vocab(n_vocab)
        .map_err(|e| match e {
            minfer_runtime::SamplerError::OutOfRange { value, range, .. } => ApiError::bad_request(
                format!("field `logit_bias` has {value}: must be {range} ({n_vocab} tokens)"),
            ),
        })?;
    if let Some(slot) = g.slot.filter(|&s| s >= m.n_slots) {
        return Err(ApiError::bad_request(format!(
            "field `id_slot` is {slot}: must be -1 (any) or in 0..{}",
            m.n_slots
        ))
        .with_param("id_slot"));
    }
    let (tx, rx) = mpsc::channel(EVENT_CAPACITY);
    let deadline = deadline(arrived, st.timeout);
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    let n_prompts = prompts.len();
    let ran_in: Vec<Arc<std::sync::OnceLock<usize>>> =
        (0..n_prompts).map(|_| Arc::default()).collect();
    for (i, prompt) in prompts.into_iter().enumerate() {
        // prompt.len() < ctx (checked above), so `room` cannot wrap. A completion longer
        // than the room left is generated up to the full context and ends as `length`,
        // as llama-server does with context shift off (clients that send a large default
        // `max_tokens` work on a small context); only a prompt that leaves no room is
        // refused.
        let room = ctx - prompt.len();
        m.worker.submit(Job {
            prompt,
            n: g.n,
            max_tokens: m.answer_limit(g.max_tokens).map_or(room, |n| n.min(room)),
            sampling: g.sampling.clone(),
            stop: g.stop.clone(),
            logprobs: g.logprobs,
            post_sampling: g.post_sampling,
            arrived,
            deadline,
            fault,
            tx: tx.clone(),
            cache_prompt: g.cache_prompt,
            // A named slot holds one prompt at a time: the batch's first takes it.
            slot: g.slot.filter(|_| i == 0),
            constraint: constraint.clone(),
            // Progress reports one prompt's processing; a batch has no single one.
            progress: !many && g.stream && (g.telemetry.per_token || g.telemetry.progress),
            first_choice: i * g.n,
            ran_in: Arc::clone(&ran_in[i]),
        })?;
    }
    Ok(Generation {
        model: m,
        rx,
        waits: Waits {
            deadline,
            cancel: st.cancel.clone(),
        },
        prompt_tokens,
        n: g.n * n_prompts,
        per_prompt: g.n,
        unenforced,
        ran_in,
        telemetry: g.telemetry,
        prompt: None,
    })
}

impl Generation {
    /// The next event, or an error event once the deadline passes or a shutdown cancels
    /// the request.
    ///
    /// [`Event::Progress`] comes out only to a request that asked for `return_progress`;
    /// it is recorded either way, for [`Self::timings_now`].
    pub async fn next(&mut self) -> Event {
        loop {
            let ev = next_event(&mut self.rx, &mut self.waits).await;
            if let Event::Progress(p) = ev {
                self.prompt = Some((p, Instant::now()));
                if !self.telemetry.progress {
                    continue;
                }
            }
            return ev;
        }
    }

    /// With `timings_per_token`, the `timings` of the stream so far, a choice having
    /// generated `generated` tokens; `None` when the request did not ask.
    pub fn timings_now(&self, generated: usize) -> Option<serde_json::Value> {
        if !self.telemetry.per_token {
            return None;
        }
        let mut t = Timings {
            predicted_n: generated,
            ..Timings::default()
        };
        if let Some((p, at)) = self.prompt {
            t.cache_n = p.cache;
            t.prompt_n = p.processed - p.cache.min(p.processed);
            t.prompt = p.elapsed;
            if p.done() {
                t.predicted = at.elapsed();
            }
        }
        Some(t.to_json())
    }

    /// Waits for the whole answer of a one-choice request (llama-server's and ollama's
    /// requests have one): its text, its tokens' log-probabilities and its summary.
    pub async fn collect_one(mut self) -> Result<(String, Vec<TokenLogprob>, Summary), ApiError> {
        let (mut text, mut lps) = (String::new(), Vec::new());
        loop {
            match self.next().await {
                Event::Chunk {
                    text: t, logprobs, ..
                } => {
                    text.push_str(&t);
                    lps.extend(logprobs);
                }
                Event::Done(s) => return Ok((text, lps, s)),
                Event::Error(e) => return Err(e),
                Event::Progress(_) => {}
            }
        }
    }

    /// Waits for the whole answer: every choice, each to its end.
    pub async fn collect(mut self) -> Result<Outcome, ApiError> {
        let mut texts = vec![String::new(); self.n];
        let mut lps: Vec<Vec<TokenLogprob>> = vec![Vec::new(); self.n];
        let mut done: Vec<Option<Summary>> = vec![None; self.n];
        while done.iter().any(Option::is_none) {
            match self.next().await {
                Event::Chunk {
                    choice,
                    text,
                    logprobs,
                    ..
                } => {
                    if let (Some(t), Some(l)) = (texts.get_mut(choice), lps.get_mut(choice)) {
                        t.push_str(&text);
                        l.extend(logprobs);
                    }
                }
                Event::Done(s) => {
                    if let Some(d) = done.get_mut(s.choice) {
                        *d = Some(s);
                    }
                }
                Event::Error(e) => return Err(e),
                Event::Progress(_) => {}
            }
        }
        let choices = texts
            .into_iter()
            .zip(lps)
            .zip(done.into_iter().flatten())
            .map(|((text, logprobs), summary)| Choice {
                text,
                logprobs,
                summary,
            })
            .collect();
        Ok(Outcome {
            choices,
            per_prompt: self.per_prompt,
        })
    }
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
