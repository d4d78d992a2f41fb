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
//! The shift lives in [`crate::shift`], which applies it to plain completions too.
//!
//! A turn's prefill runs in the engine's batch-sized chunks and asks its `interrupted`
//! callback between them: an interrupted prefill drops the unfinished user message, and
//! the KV history keeps exactly the chunks that ran, which the next turn reuses as far as
//! its own rendering shares them.

use std::path::Path;
use std::time::{Duration, Instant};

use minfer_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

use crate::engine::Engine;
use crate::generate::{decode_blocks, run_block, sample_next, GenerateOptions};
use crate::history::{common_prefix, KvHistory};
use crate::session::{self, SavedChat, SessionError};
use crate::shift::{prefill_chunks, shift_and_run};
use crate::speculative::Speculator;
use crate::turn::{ConversationError, ConversationOptions, OverflowPolicy, TurnStats};

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

        let engine = &self.engine;
        // The longest shared prefix the engine can go on from (for a recurrent model:
        // its state's end, or the last state checkpoint inside it).
        let reuse = self.kv.reuse_from(&prompt, |k| engine.resume_point(k));
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
