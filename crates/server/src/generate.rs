//! The one generation path every API codec shares: a codec parses its request into a
//! [`GenRequest`] and prompt tokens, [`start`] checks them against the model's slots and
//! queues the job, and the codec reads the [`Generation`]'s events (streaming) or its
//! [`Outcome`] (one answer) and renders them in its own shape. Sampling, slots, stop
//! strings and deadlines live here and in the worker, never in a codec.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::params::{GenRequest, Prompt};
use crate::tools::CallFormat;
use crate::worker::{Event, Fault, Job, Summary, TokenLogprob, EVENT_CAPACITY};
use crate::{AppState, Model};
use minfer_runtime::{CompiledGrammar, Grammar};
use minfer_tokenizer::ChatMessage;

/// Text in a prompt that makes inference panic when fault injection is on (tests only).
pub const PANIC_MARKER: &str = "__minfer_inject_panic__";

/// Text in a prompt that makes a kernel panic inside its first engine step when fault
/// injection is on (tests only).
pub const KERNEL_PANIC_MARKER: &str = "__minfer_inject_kernel_panic__";

/// Text in a prompt that slows its decode steps when fault injection is on (tests only).
pub const SLOW_MARKER: &str = "__minfer_inject_slow__";

/// Text in a prompt that makes its prefill take 1.5 s when fault injection is on (tests
/// only).
pub const SLOW_PREFILL_MARKER: &str = "__minfer_inject_slow_prefill__";

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
    } else if text.contains(SLOW_PREFILL_MARKER) {
        Some(Fault::SlowPrefill)
    } else {
        None
    }
}

/// Prompt tokens of a completion request, checked against the vocabulary. A text prompt
/// is the caller's whole prompt, template markers included, so special-token text in it
/// is parsed (as llama-server and `minfer run` do); chat content never is.
pub fn completion_prompt(
    st: &AppState,
    m: &Model,
    p: Prompt,
) -> Result<(Vec<u32>, Option<Fault>), ApiError> {
    match p {
        Prompt::Text(s) => Ok((m.tok.encode(&s, true, true), fault_of(st, &s))),
        Prompt::Tokens(t) => {
            let n = m.tok.n_vocab();
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
    m: &Model,
    msgs: &[ChatMessage],
) -> Result<(Vec<u32>, Option<Fault>), ApiError> {
    chat_prompt_with_tools(st, m, msgs, None)
}

/// [`chat_prompt`] with the request's `tools` array shown to the template.
pub fn chat_prompt_with_tools(
    st: &AppState,
    m: &Model,
    msgs: &[ChatMessage],
    tools: Option<&serde_json::Value>,
) -> Result<(Vec<u32>, Option<Fault>), ApiError> {
    let p = render_chat(st, m, msgs, tools, &serde_json::Map::new())?;
    Ok((p.ids, p.fault))
}

/// A rendered and tokenised chat prompt.
#[derive(Debug)]
pub struct ChatPrompt {
    /// Its tokens.
    pub ids: Vec<u32>,
    /// The fault it asks for (tests only).
    pub fault: Option<Fault>,
    /// It ends inside an open `<think>` block: the answer starts as reasoning.
    pub think_open: bool,
    /// How the model's template writes tool calls.
    pub tool_format: CallFormat,
    /// It opens a harmony assistant message (gpt-oss): the answer is split by channel.
    pub harmony: bool,
}

impl ChatPrompt {
    /// Tells `g` what the rendered prompt decides about the answer: whether it starts
    /// inside a reasoning block or a harmony message, and the format its tool calls come
    /// in.
    pub fn shape(&self, g: &mut GenRequest) {
        g.reasoning.open = self.think_open;
        g.reasoning.harmony = self.harmony;
        if let Some(t) = &mut g.tools {
            t.format = self.tool_format;
        }
    }
}

/// [`chat_prompt_with_tools`] with extra template variables (`chat_template_kwargs`,
/// such as `enable_thinking`), telling whether the prompt leaves a reasoning block open.
pub fn render_chat(
    st: &AppState,
    m: &Model,
    msgs: &[ChatMessage],
    tools: Option<&serde_json::Value>,
    kwargs: &serde_json::Map<String, serde_json::Value>,
) -> Result<ChatPrompt, ApiError> {
    let bad =
        |e| ApiError::bad_request(format!("rendering `messages` with the chat template: {e}"));
    let rendered = m
        .template
        .render_spans_with_context(msgs, tools, true, kwargs)
        .map_err(bad)?;
    let ids = if st.allow_special_in_content {
        m.tok.encode(&rendered.text, true, true)
    } else {
        rendered.encode(&m.tok, msgs, true).map_err(bad)?
    };
    Ok(ChatPrompt {
        ids,
        fault: fault_of(st, &rendered.text),
        think_open: crate::reasoning::opened_by(&rendered.text),
        tool_format: CallFormat::of_template(m.template.source()),
        harmony: crate::harmony::opened_by(&rendered.text),
    })
}

/// A queued or running generation: its events, bounded by the request's deadline and
/// the server's shutdown. Dropping it cancels the generation in the worker.
pub struct Generation {
    /// The model generating; held so that it stays loaded until the request ends.
    pub model: Arc<Model>,
    rx: mpsc::Receiver<Event>,
    waits: Waits,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Choices being generated; each ends with its own `Event::Done`.
    pub n: usize,
    /// What the request's lenient schema asked that the grammar does not enforce (see
    /// [`mark_unenforced`]); empty when nothing was left out.
    pub unenforced: Vec<String>,
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
}

impl Outcome {
    /// Counts of the whole request: the prompt once (it was prefilled once), the
    /// completion tokens of every choice; the finish reason is choice 0's.
    pub fn usage(&self) -> Summary {
        let mut u = self.choices[0].summary;
        u.completion_tokens = self
            .choices
            .iter()
            .map(|c| c.summary.completion_tokens)
            .sum();
        u
    }
}

/// The request's output grammar or tool-call grammar, the request field that gave it and
/// the text that starts it (a lazy tool-call grammar); `None` when nothing constrains.
fn constraint_source(g: &GenRequest) -> Option<(Grammar, &'static str, Option<&'static str>)> {
    match (&g.grammar, g.tools.as_ref().and_then(|t| t.grammar())) {
        (Some((gr, field)), _) => Some((gr.clone(), *field, None)),
        (None, Some((gr, trigger))) => Some((gr, "tools", trigger)),
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
    let ctx = m.slot_ctx;
    let n = prompt.len();
    if n == 0 {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if g.n > m.n_slots {
        return Err(ApiError::bad_request(format!(
            "field `n` is {}: must be in [1, {}], the slots of this model (each choice \
             generates in its own slot)",
            g.n, m.n_slots
        ))
        .with_param("n"));
    }
    // A slot holds the prompt and at least one generated token.
    if n >= ctx {
        return Err(ApiError::context_length_exceeded(ctx, n));
    }
    // n < ctx (checked above), so `room` cannot wrap. A completion longer than the room
    // left is generated up to the full context and ends as `length`, as llama-server
    // does with context shift off (clients that send a large default `max_tokens` work
    // on a small context); only a prompt that leaves no room is refused.
    let room = ctx - n;
    let max_tokens = g.max_tokens.map_or(room, |m| m.min(room));
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
    if g.slot.is_some() && g.n > 1 {
        // Each choice needs its own slot; one named slot cannot hold them all.
        return Err(ApiError::bad_request(
            "field `id_slot` names one slot, but `n` asks for several choices, each in its own slot",
        )
        .with_param("id_slot"));
    }
    let (tx, rx) = mpsc::channel(EVENT_CAPACITY);
    let deadline = deadline(arrived, st.timeout);
    m.worker.submit(Job {
        prompt,
        n: g.n,
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
        constraint,
    })?;
    Ok(Generation {
        model: m,
        rx,
        waits: Waits {
            deadline,
            cancel: st.cancel.clone(),
        },
        prompt_tokens: n,
        n: g.n,
        unenforced,
    })
}

impl Generation {
    /// The next event, or an error event once the deadline passes or a shutdown cancels
    /// the request.
    pub async fn next(&mut self) -> Event {
        next_event(&mut self.rx, &mut self.waits).await
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
        Ok(Outcome { choices })
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
