//! The conversation engine (design §11.3): one engine, its append-only KV and the token
//! history of one conversation. Each turn renders the messages through the model's chat
//! template and prefills only the tokens past the longest prefix the KV already holds;
//! generation appends. [`KvHistory`] is that prefix bookkeeping on its own, shared with
//! the server's slots so that there is one copy of the reuse rule.
//!
//! A conversation that outgrows the context follows its [`OverflowPolicy`]: `Refuse` is
//! an error that names the sizes; `Shift` keeps the first `n_keep` tokens (at least the
//! system prompt), drops the oldest half of the rest and re-prefills what follows the
//! kept tokens at their new positions, so the KV equals a fresh prefill of the kept
//! tokens exactly (llama.cpp's context shift, by re-prefilling instead of re-rotating).
//! [`generate_shifting`] applies the same shift to a plain completion (`minfer run`).
//!
//! A turn's prefill runs in the engine's batch-sized chunks and asks its `interrupted`
//! callback between them: an interrupted prefill drops the unfinished user message, and
//! the KV history keeps exactly the chunks that ran, which the next turn reuses as far as
//! its own rendering shares them.

use std::path::Path;
use std::time::{Duration, Instant};

use minfer_tokenizer::{ChatMessage, ChatTemplate, TemplateError, Tokenizer};

use crate::engine::{Engine, EngineError};
use crate::generate::{
    decode_blocks, run_block, sample_next, FinishReason, GenerateOptions, GenerationStats,
};
use crate::session::{self, SavedChat, SessionError};
use crate::speculative::Speculator;

/// Length of the longest common prefix of two token sequences.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The token ids whose KV rows sit at positions `0..len()` of one sequence: what a later
/// prompt may reuse instead of prefilling again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvHistory {
    tokens: Vec<u32>,
}

/// What [`KvHistory::reuse`] decided for a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reuse {
    /// Leading prompt tokens whose KV rows are kept; the rest must be prefilled.
    pub kept: usize,
    /// Whether the history held tokens the prompt does not continue (the rendering was
    /// not a prefix extension), so those rows are prefilled again.
    pub rewound: bool,
}

impl KvHistory {
    /// An empty history (nothing in the KV).
    pub fn new() -> Self {
        Self::default()
    }

    /// A history whose KV rows `0..tokens.len()` already hold `tokens`.
    pub fn from_tokens(tokens: Vec<u32>) -> Self {
        KvHistory { tokens }
    }

    /// The tokens held, in position order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Leading tokens of `prompt` the history already holds.
    pub fn matching(&self, prompt: &[u32]) -> usize {
        common_prefix(&self.tokens, prompt)
    }

    /// Keeps the longest prefix of the history that `prompt` starts with, less its last
    /// token when the whole prompt matches: the last prompt token always runs again,
    /// since its logits start the generation. The caller prefills `prompt[kept..]`.
    pub fn reuse(&mut self, prompt: &[u32]) -> Reuse {
        let common = self.matching(prompt);
        let rewound = common < self.tokens.len();
        let kept = common.min(prompt.len().saturating_sub(1));
        self.tokens.truncate(kept);
        Reuse { kept, rewound }
    }

    /// Records one more token written at position `len()`.
    pub fn push(&mut self, token: u32) {
        self.tokens.push(token);
    }

    /// Records tokens written at positions `len()..`.
    pub fn extend(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }

    /// Forgets every position past `len` (their rows are no longer trusted).
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.tokens.clear();
    }
}

/// What a conversation does when its next turn does not fit the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverflowPolicy {
    /// Keep the first `n_keep` tokens, drop the oldest half of the rest, continue.
    #[default]
    Shift,
    /// Refuse the turn with an error; the conversation is unchanged.
    Refuse,
}

impl std::str::FromStr for OverflowPolicy {
    type Err = String;

    /// `shift` or `refuse`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "shift" => Ok(OverflowPolicy::Shift),
            "refuse" => Ok(OverflowPolicy::Refuse),
            other => Err(format!(
                "unknown context overflow policy `{other}`: use shift or refuse"
            )),
        }
    }
}

/// How a conversation treats its context.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConversationOptions {
    /// What happens when a turn does not fit.
    pub overflow: OverflowPolicy,
    /// Leading tokens a context shift never drops; the system prompt is always kept.
    pub n_keep: usize,
}

/// Errors of a conversation turn.
#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    /// The engine refused or failed a step.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The chat template could not render the messages.
    #[error("chat template: {0}")]
    Template(#[from] TemplateError),
    /// The turn does not fit the context and the policy is `refuse`.
    #[error(
        "the conversation needs {needed} positions but the context holds {n_ctx} \
         (--ctx-overflow refuse): clear it, raise -c, or use --ctx-overflow shift"
    )]
    ContextFull {
        /// Positions the turn needs (its prompt and one generated token).
        needed: usize,
        /// The context length.
        n_ctx: usize,
    },
    /// A shift cannot make room: the kept tokens fill the context.
    #[error(
        "the {n_keep} kept tokens (--keep and the system prompt) leave no room in a \
         context of {n_ctx}: lower --keep, shorten the system prompt or raise -c"
    )]
    KeepTooLong {
        /// Tokens the shift must keep.
        n_keep: usize,
        /// The context length.
        n_ctx: usize,
    },
    /// The prefill was interrupted between two chunks; the user message was dropped.
    #[error(
        "interrupted while reading the prompt ({done} of {total} new tokens read): \
         the message was dropped"
    )]
    Interrupted {
        /// New prompt tokens prefilled before the interruption (their KV rows are kept).
        done: usize,
        /// New prompt tokens the turn had to prefill.
        total: usize,
    },
    /// A parameter outside its domain, named.
    #[error("invalid {name}: {message}")]
    Param {
        /// What was refused.
        name: &'static str,
        /// Why.
        message: String,
    },
}

/// Counts and timings of one turn.
#[derive(Debug, Clone)]
pub struct TurnStats {
    /// Tokens of the turn's prompt (the rendered history, after any shift).
    pub prompt_tokens: usize,
    /// Prompt tokens whose KV rows were reused.
    pub reused: usize,
    /// Prompt tokens prefilled this turn.
    pub prefilled: usize,
    /// Whether the rendering rewrote tokens already in the KV, which were prefilled again
    /// from the first differing one.
    pub rewound: bool,
    /// Tokens dropped by context shifts during this turn.
    pub shifted: usize,
    /// Wall time of the prefill (and of re-prefills after a shift).
    pub prefill_time: Duration,
    /// Tokens generated.
    pub gen_tokens: usize,
    /// Wall time of the generation.
    pub gen_time: Duration,
    /// Why the answer ended.
    pub finish: FinishReason,
    /// Whether the answer stopped because the context was full (`refuse` policy).
    pub context_full: bool,
    /// Positions the KV holds after the turn.
    pub n_past: usize,
    /// The generated token ids.
    pub tokens: Vec<u32>,
}

impl TurnStats {
    /// Prefill throughput in tokens per second (0 when nothing was timed).
    pub fn prefill_tps(&self) -> f64 {
        rate(self.prefilled, self.prefill_time)
    }

    /// Decode throughput in tokens per second (0 when nothing was timed).
    pub fn decode_tps(&self) -> f64 {
        rate(self.gen_tokens, self.gen_time)
    }
}

fn rate(n: usize, d: Duration) -> f64 {
    if d.as_secs_f64() > 0.0 {
        n as f64 / d.as_secs_f64()
    } else {
        0.0
    }
}

/// The context shift, one copy for conversations and plain completions: with the KV
/// full, keeps its first `n_keep` positions, drops the oldest half of the rest, and runs
/// what follows (then `tok`) again at the new positions, refilling `logits`. Returns the
/// tokens dropped, or `None` (nothing changed) when there is nothing to drop.
fn shift_and_run(
    engine: &mut Engine,
    kv: &mut KvHistory,
    n_keep: usize,
    tok: u32,
    logits: &mut Vec<f32>,
) -> Result<Option<usize>, EngineError> {
    let discard = kv.len().saturating_sub(n_keep) / 2;
    if discard == 0 {
        return Ok(None);
    }
    let mut rest = kv.tokens()[n_keep + discard..].to_vec();
    rest.push(tok);
    kv.truncate(n_keep);
    *logits = engine.prefill(&rest, n_keep)?;
    kv.extend(&rest);
    Ok(Some(discard))
}

/// Prefills `tokens` at `kv.len()` in the engine's batch-sized chunks (the chunks
/// [`Engine::prefill`] runs), recording each in `kv` once it ran and asking
/// `interrupted` after each. Returns the last token's logits, or `None` when interrupted
/// (then `kv` holds the chunks that ran): an interruption during the last chunk still
/// counts, since no answer has started.
fn prefill_chunks(
    engine: &mut Engine,
    kv: &mut KvHistory,
    tokens: &[u32],
    interrupted: &mut dyn FnMut() -> bool,
) -> Result<Option<Vec<f32>>, EngineError> {
    let end = kv.len().saturating_add(tokens.len());
    if end > engine.n_ctx() {
        return Err(EngineError::ContextOverflow {
            what: "the prompt",
            needed: end,
            n_ctx: engine.n_ctx(),
        });
    }
    let mut logits = Vec::new();
    for chunk in tokens.chunks(engine.n_batch().max(1)) {
        logits = engine.forward(chunk, kv.len(), 1)?;
        kv.extend(chunk);
        if interrupted() {
            return Ok(None);
        }
    }
    Ok(Some(logits))
}

/// Counts of a [`generate_shifting`] run.
#[derive(Debug, Clone)]
pub struct ShiftedGeneration {
    /// Prompt tokens prefilled, timings, finish and the generated tokens.
    pub stats: GenerationStats,
    /// Tokens dropped by context shifts.
    pub shifted: usize,
}

/// Generates a continuation of `prompt` over the KV `kv` describes (its longest prefix
/// shared with the prompt is kept, as [`KvHistory::reuse`] says), running past the end of
/// the context with context shifts that keep the first `n_keep` tokens. The prompt itself
/// must leave room for one generated token. `kv` ends holding what the KV holds.
pub fn generate_shifting(
    engine: &mut Engine,
    tokenizer: &Tokenizer,
    kv: &mut KvHistory,
    prompt: &[u32],
    n_keep: usize,
    opts: &GenerateOptions,
    on_text: impl FnMut(&str) -> bool,
) -> Result<ShiftedGeneration, ConversationError> {
    generate_shifting_with(engine, tokenizer, kv, prompt, n_keep, opts, None, on_text)
}

/// [`generate_shifting`] with speculative decoding through `spec` when given (blocks
/// need room in the context: the steps next to a shift are plain ones).
#[allow(clippy::too_many_arguments)]
pub fn generate_shifting_with(
    engine: &mut Engine,
    tokenizer: &Tokenizer,
    kv: &mut KvHistory,
    prompt: &[u32],
    n_keep: usize,
    opts: &GenerateOptions,
    mut spec: Option<&mut Speculator>,
    on_text: impl FnMut(&str) -> bool,
) -> Result<ShiftedGeneration, ConversationError> {
    let n_ctx = engine.n_ctx();
    if prompt.is_empty() || prompt.len() >= n_ctx {
        return Err(ConversationError::ContextFull {
            needed: prompt.len() + 1,
            n_ctx,
        });
    }
    let n_keep = n_keep.min(prompt.len());
    let mut sampler = opts.sampler()?;
    let reuse = kv.reuse(prompt);
    let t0 = Instant::now();
    let logits = engine.prefill(&prompt[reuse.kept..], reuse.kept)?;
    kv.extend(&prompt[reuse.kept..]);
    let prompt_time = t0.elapsed();
    for &t in prompt {
        sampler.accept(t);
    }
    let t1 = Instant::now();
    let mut shifted = 0;
    let mut buf = Vec::new();
    let (finish, tokens, unrun) = decode_blocks(
        tokenizer,
        &mut sampler,
        logits,
        opts,
        on_text,
        |tok, sampler, block| {
            if kv.len() < n_ctx {
                run_block(
                    engine,
                    kv,
                    spec.as_deref_mut(),
                    sampler,
                    tok,
                    &mut buf,
                    block,
                )?;
                return Ok(true);
            }
            match shift_and_run(engine, kv, n_keep, tok, &mut buf)? {
                Some(d) => {
                    shifted += d;
                    block.push(sample_next(sampler, &mut buf)?);
                    Ok(true)
                }
                None => Ok(false),
            }
        },
    )?;
    kv.truncate(kv.len() - unrun);
    Ok(ShiftedGeneration {
        stats: GenerationStats {
            prompt_tokens: prompt.len() - reuse.kept,
            prompt_time,
            gen_tokens: tokens.len(),
            gen_time: t1.elapsed(),
            finish,
            tokens,
        },
        shifted,
    })
}

/// One conversation over an engine it owns: the messages, the tokens in the KV, and the
/// overflow policy.
pub struct Conversation {
    engine: Engine,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    system: Option<String>,
    /// User and assistant turns, in order (the system message is kept apart).
    messages: Vec<ChatMessage>,
    kv: KvHistory,
    /// Tokens of the full rendering dropped by shifts, right after the first `n_keep`.
    dropped: usize,
    opts: ConversationOptions,
    last: Option<TurnStats>,
    /// Speculative decoding of the answers, when set.
    spec: Option<Speculator>,
}

impl Conversation {
    /// A new, empty conversation over `engine`, with the model's chat template (ChatML
    /// when the model has none).
    pub fn new(engine: Engine, opts: ConversationOptions) -> Result<Self, ConversationError> {
        let tokenizer = Tokenizer::from_gguf(engine.file()).map_err(Self::param)?;
        let template = ChatTemplate::from_tokenizer(&tokenizer)?;
        Ok(Conversation {
            engine,
            tokenizer,
            template,
            system: None,
            messages: Vec::new(),
            kv: KvHistory::new(),
            dropped: 0,
            opts,
            last: None,
            spec: None,
        })
    }

    /// A conversation resumed over an engine whose KV rows `0..history.len()` already
    /// hold `history` (a restored session): the next turn reuses them. `messages` are
    /// the user and assistant turns, without the system message.
    pub fn resume(
        engine: Engine,
        opts: ConversationOptions,
        system: Option<String>,
        messages: Vec<ChatMessage>,
        history: Vec<u32>,
    ) -> Result<Self, ConversationError> {
        if history.len() > engine.seq_len() {
            return Err(ConversationError::Param {
                name: "history",
                message: format!(
                    "{} tokens, but the engine's KV holds {} positions",
                    history.len(),
                    engine.seq_len()
                ),
            });
        }
        let mut c = Self::new(engine, opts)?;
        c.system = system;
        c.messages = messages;
        c.kv = KvHistory::from_tokens(history);
        Ok(c)
    }

    /// Decodes the answers speculatively through `spec` (`None`: plain decode).
    pub fn set_speculator(&mut self, spec: Option<Speculator>) {
        self.spec = spec;
    }

    /// The speculator in use, if any (its counters).
    pub fn speculator(&self) -> Option<&Speculator> {
        self.spec.as_ref()
    }

    fn param(e: impl std::fmt::Display) -> ConversationError {
        ConversationError::Param {
            name: "tokenizer",
            message: e.to_string(),
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine, mutably (a session restore writes its KV).
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// Gives the engine back.
    pub fn into_engine(self) -> Engine {
        self.engine
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Whether the model has no chat template of its own (ChatML is used).
    pub fn is_fallback_template(&self) -> bool {
        self.template.is_fallback()
    }

    /// The tokens whose KV rows the engine holds, in position order.
    pub fn history(&self) -> &[u32] {
        self.kv.tokens()
    }

    /// The user and assistant turns so far.
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    /// The system message, if any.
    pub fn system(&self) -> Option<&str> {
        self.system.as_deref()
    }

    /// The overflow policy and kept-token count.
    pub fn options(&self) -> ConversationOptions {
        self.opts
    }

    /// The stats of the last completed turn.
    pub fn last_stats(&self) -> Option<&TurnStats> {
        self.last.as_ref()
    }

    /// Replaces the system message; the turns stay, and the next turn re-prefills from
    /// the first token the new rendering changes.
    pub fn set_system(&mut self, system: Option<String>) {
        self.system = system;
        self.dropped = 0;
    }

    /// Forgets every turn (the system message stays). The KV is kept: the next turn
    /// reuses whatever prefix it still shares, such as the system prompt.
    pub fn clear(&mut self) {
        self.messages.clear();
        self.dropped = 0;
        self.last = None;
    }

    /// Saves the conversation (its messages, and the tokens and KV rows the engine holds)
    /// to the session file `path`, atomically.
    pub fn save(&mut self, path: &Path) -> Result<(), SessionError> {
        let chat = SavedChat {
            system: self.system.clone(),
            messages: self.messages.clone(),
            dropped: self.dropped,
        };
        session::save_with(&mut self.engine, self.kv.tokens(), Some(&chat), path)
    }

    /// Replaces this conversation with the one saved in `path` by [`Conversation::save`]:
    /// its messages, and its KV rows, which the next turn reuses. A refused file (damaged,
    /// foreign, or a session without a conversation) leaves the conversation as it was.
    pub fn load(&mut self, path: &Path) -> Result<(), SessionError> {
        let (tokens, chat) = match session::load_chat(&mut self.engine, path) {
            Ok(r) => r,
            Err(e) => {
                // A failure after the checks may have rewritten KV rows: trust only what
                // the engine still says it holds.
                self.kv.truncate(self.engine.seq_len());
                return Err(e);
            }
        };
        self.system = chat.system;
        self.messages = chat.messages;
        self.dropped = chat.dropped;
        self.kv = KvHistory::from_tokens(tokens);
        self.last = None;
        Ok(())
    }

    /// The system message followed by the turns.
    fn all_messages(&self) -> Vec<ChatMessage> {
        self.system
            .iter()
            .map(|s| ChatMessage::new("system", s.as_str()))
            .chain(self.messages.iter().cloned())
            .collect()
    }

    /// Token ids of `messages` through the template, contents tokenised as text.
    fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, ConversationError> {
        let rendered = self
            .template
            .render_spans(messages, add_generation_prompt)?;
        Ok(rendered.encode(&self.tokenizer, messages, true)?)
    }

    /// The tokens a shift never drops: `n_keep`, and at least the system prompt.
    fn n_keep(&self, full: &[u32]) -> Result<usize, ConversationError> {
        let mut keep = self.opts.n_keep;
        if let Some(s) = &self.system {
            let sys = self.render(&[ChatMessage::new("system", s.as_str())], false)?;
            keep = keep.max(common_prefix(&sys, full));
        }
        Ok(keep.min(full.len()))
    }

    /// The full rendering less the tokens shifts dropped.
    fn view(&self, full: &[u32], n_keep: usize) -> Vec<u32> {
        let cut = n_keep.saturating_add(self.dropped).min(full.len());
        let mut v = full[..n_keep].to_vec();
        v.extend_from_slice(&full[cut..]);
        v
    }

    /// The prompt the current messages render to (with the generation prompt, less what
    /// shifts dropped), as a turn would build it before adding its user message.
    pub fn prompt_tokens(&self) -> Result<Vec<u32>, ConversationError> {
        let full = self.render(&self.all_messages(), true)?;
        let keep = self.n_keep(&full)?;
        Ok(self.view(&full, keep))
    }

    /// Adds the user message `user`, prefills what the KV does not hold yet, and streams
    /// the answer through `on_text` (which returns `false` to stop it). The answer, even
    /// a stopped one, joins the history. On an error the conversation is unchanged,
    /// apart from KV rows that must be prefilled again.
    pub fn turn(
        &mut self,
        user: &str,
        gen: &GenerateOptions,
        on_text: impl FnMut(&str) -> bool,
    ) -> Result<TurnStats, ConversationError> {
        self.turn_interruptible(user, gen, || false, on_text)
    }

    /// [`Conversation::turn`], asking `interrupted` between prefill chunks: when it says
    /// yes the turn ends with [`ConversationError::Interrupted`], the user message is
    /// dropped, and the KV history holds exactly the prompt chunks that ran.
    pub fn turn_interruptible(
        &mut self,
        user: &str,
        gen: &GenerateOptions,
        mut interrupted: impl FnMut() -> bool,
        on_text: impl FnMut(&str) -> bool,
    ) -> Result<TurnStats, ConversationError> {
        self.messages.push(ChatMessage::new("user", user));
        let dropped = self.dropped;
        match self.run_turn(gen, &mut interrupted, on_text) {
            Ok((stats, answer)) => {
                self.messages.push(ChatMessage::new("assistant", answer));
                self.last = Some(stats.clone());
                Ok(stats)
            }
            Err(e) => {
                self.messages.pop();
                self.dropped = dropped;
                Err(e)
            }
        }
    }

    fn run_turn(
        &mut self,
        gen: &GenerateOptions,
        interrupted: &mut dyn FnMut() -> bool,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<(TurnStats, String), ConversationError> {
        let mut sampler = gen.sampler()?;
        let n_ctx = self.engine.n_ctx();
        let full = self.render(&self.all_messages(), true)?;
        let n_keep = self.n_keep(&full)?;
        let mut prompt = self.view(&full, n_keep);
        if prompt.is_empty() {
            return Err(ConversationError::Param {
                name: "chat template",
                message: "rendered the conversation as no tokens".into(),
            });
        }
        let mut shifted = 0;
        // At least one generated token must fit after the prompt.
        while prompt.len() >= n_ctx {
            if self.opts.overflow == OverflowPolicy::Refuse {
                return Err(ConversationError::ContextFull {
                    needed: prompt.len() + 1,
                    n_ctx,
                });
            }
            let discard = (prompt.len() - n_keep) / 2;
            if discard == 0 {
                return Err(ConversationError::KeepTooLong { n_keep, n_ctx });
            }
            self.dropped += discard;
            shifted += discard;
            prompt = self.view(&full, n_keep);
        }

        let reuse = self.kv.reuse(&prompt);
        let t0 = Instant::now();
        let new = &prompt[reuse.kept..];
        let Some(logits) = prefill_chunks(&mut self.engine, &mut self.kv, new, interrupted)? else {
            return Err(ConversationError::Interrupted {
                done: self.kv.len() - reuse.kept,
                total: new.len(),
            });
        };
        let mut prefill_time = t0.elapsed();
        for &t in &prompt {
            sampler.accept(t);
        }

        let t1 = Instant::now();
        let mut answer = String::new();
        let mut context_full = false;
        let mut reprefill = Duration::ZERO;
        let Conversation {
            engine,
            tokenizer,
            kv,
            dropped,
            opts,
            spec,
            ..
        } = self;
        let mut buf = Vec::new();
        let (finish, tokens, unrun) = decode_blocks(
            tokenizer,
            &mut sampler,
            logits,
            gen,
            |t| {
                answer.push_str(t);
                on_text(t)
            },
            |tok, sampler, block| {
                if kv.len() < n_ctx {
                    run_block(engine, kv, spec.as_mut(), sampler, tok, &mut buf, block)?;
                    return Ok(true);
                }
                if opts.overflow == OverflowPolicy::Refuse {
                    context_full = true;
                    return Ok(false);
                }
                let t = Instant::now();
                let r = shift_and_run(engine, kv, n_keep, tok, &mut buf)?;
                reprefill += t.elapsed();
                match r {
                    Some(discard) => {
                        *dropped += discard;
                        shifted += discard;
                        block.push(sample_next(sampler, &mut buf)?);
                        Ok(true)
                    }
                    None => {
                        context_full = true;
                        Ok(false)
                    }
                }
            },
        )?;
        kv.truncate(kv.len() - unrun);
        prefill_time += reprefill;
        let stats = TurnStats {
            prompt_tokens: prompt.len(),
            reused: reuse.kept,
            prefilled: prompt.len() - reuse.kept,
            rewound: reuse.rewound,
            shifted,
            prefill_time,
            gen_tokens: tokens.len(),
            gen_time: t1.elapsed().saturating_sub(reprefill),
            finish,
            context_full,
            n_past: self.kv.len(),
            tokens,
        };
        Ok((stats, answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_counts_equal_leading_tokens() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
    }

    #[test]
    fn reuse_keeps_the_common_prefix_and_reruns_the_last_prompt_token() {
        let mut h = KvHistory::from_tokens(vec![1, 2, 3]);
        let r = h.reuse(&[1, 2, 3, 4, 5]);
        assert_eq!(
            r,
            Reuse {
                kept: 3,
                rewound: false
            }
        );
        let mut h = KvHistory::from_tokens(vec![1, 2, 3]);
        // The whole prompt is held: its last token still runs, for its logits.
        assert_eq!(
            h.reuse(&[1, 2, 3]),
            Reuse {
                kept: 2,
                rewound: false
            }
        );
        assert_eq!(h.tokens(), &[1, 2]);
        let mut h = KvHistory::from_tokens(vec![1, 2, 3, 4]);
        // A rewrite of earlier tokens: re-prefill from the first differing one.
        assert_eq!(
            h.reuse(&[1, 9, 3, 4, 5]),
            Reuse {
                kept: 1,
                rewound: true
            }
        );
        assert_eq!(h.tokens(), &[1]);
        assert_eq!(
            KvHistory::new().reuse(&[]),
            Reuse {
                kept: 0,
                rewound: false
            }
        );
    }

    #[test]
    fn overflow_policies_parse_by_name() {
        assert_eq!("shift".parse(), Ok(OverflowPolicy::Shift));
        assert_eq!("refuse".parse(), Ok(OverflowPolicy::Refuse));
        let e = "drop".parse::<OverflowPolicy>().unwrap_err();
        assert!(e.contains("drop") && e.contains("shift or refuse"), "{e}");
    }
}
