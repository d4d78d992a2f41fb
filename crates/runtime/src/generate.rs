//! The generation loop: prefill, then sample and decode one token at a time, streaming
//! complete UTF-8 text and stopping at end-of-generation tokens, stop strings or a limit.

use std::time::{Duration, Instant};

use minfer_tokenizer::{StreamDecoder, Tokenizer};

use crate::constraint::{CompiledGrammar, Prefetch};
use crate::engine::{Engine, EngineError};
use crate::history::KvHistory;
use crate::sampling::{Sampler, SamplingParams};
use crate::speculative::Speculator;
use crate::stop::{StopEvent, StopScanner};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generation ends before the first occurrence of any of these strings.
    pub stop: Vec<String>,
    /// The sampler chain's parameters.
    pub sampling: SamplingParams,
    /// A grammar every generated token must follow (structured output); `None` is free
    /// text. A constrained generation never speculates.
    pub constraint: Option<CompiledGrammar>,
}

impl GenerateOptions {
    /// The sampler these options describe, with a fresh constraint of their grammar (its
    /// next mask computed on a helper thread while the engine runs each step).
    pub fn sampler(&self) -> Result<Sampler, EngineError> {
        let s = Sampler::new(self.sampling.clone()).map_err(|e| EngineError::Param {
            name: "sampling",
            message: e.to_string(),
        })?;
        Ok(s.with_constraint(self.constraint.as_ref().map(|g| g.start(Prefetch::Helper))))
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The text callback asked to stop (e.g. the client went away).
    Cancelled,
}

/// Counts and timings of one generation.
#[derive(Debug, Clone)]
pub struct GenerationStats {
    /// Prompt tokens prefilled.
    pub prompt_tokens: usize,
    /// Wall time of the prefill.
    pub prompt_time: Duration,
    /// Tokens generated (sampled), end-of-generation token excluded.
    pub gen_tokens: usize,
    /// Wall time from the first sample to the end.
    pub gen_time: Duration,
    /// Why generation ended.
    pub finish: FinishReason,
    /// The generated token ids.
    pub tokens: Vec<u32>,
}

/// Generates a continuation of `prompt` from an empty KV cache, calling `on_text` with
/// each piece of complete UTF-8 text; `on_text` returns `false` to cancel.
pub fn generate(
    engine: &mut Engine,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    opts: &GenerateOptions,
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats, EngineError> {
    generate_reusing(engine, tokenizer, prompt, 0, opts, on_text)
}

/// [`generate`] keeping the first `reuse` prompt tokens the engine's KV already holds (a
/// restored session whose history starts with them): only `prompt[reuse..]` is
/// prefilled. `reuse` must leave at least one token to run, for the first logits.
pub fn generate_reusing(
    engine: &mut Engine,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    reuse: usize,
    opts: &GenerateOptions,
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats, EngineError> {
    generate_speculative(engine, tokenizer, prompt, reuse, opts, None, on_text)
}

/// [`generate_reusing`] with speculative decoding through `spec` when it is given: the
/// same tokens as without it under greedy sampling (and, for a fixed seed, the same
/// distribution under sampling), in fewer target forwards when the drafts are good.
pub fn generate_speculative(
    engine: &mut Engine,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    reuse: usize,
    opts: &GenerateOptions,
    mut spec: Option<&mut Speculator>,
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats, EngineError> {
    if reuse > 0 && (reuse >= prompt.len() || reuse > engine.seq_len()) {
        return Err(EngineError::Param {
            name: "reused prefix",
            message: format!(
                "{reuse} tokens of a {}-token prompt with {} held in the KV",
                prompt.len(),
                engine.seq_len()
            ),
        });
    }
    if prompt.is_empty() {
        return Err(EngineError::Param {
            name: "prompt",
            message: "is empty".into(),
        });
    }
    // Saturating: a huge `max_tokens` must not wrap around into a small, accepted sum.
    let needed = prompt.len().saturating_add(opts.max_tokens);
    if needed > engine.n_ctx() {
        return Err(EngineError::ContextOverflow {
            what: "the prompt plus -n",
            needed,
            n_ctx: engine.n_ctx(),
        });
    }
    let mut sampler = opts.sampler()?;
    // Rows a sliding-window ring dropped cannot be reused, and a recurrent state goes on
    // only from its end or a checkpoint: prefill from the last point the engine holds.
    let reuse = engine.resume_point(reuse);
    if reuse == 0 {
        engine.reset();
    }
    let t0 = Instant::now();
    let logits = engine.prefill_prompt(&prompt[reuse..], reuse)?;
    let prompt_time = t0.elapsed();
    for &t in prompt {
        sampler.accept(t);
    }

    let t1 = Instant::now();
    let mut kv = KvHistory::from_tokens(prompt.to_vec());
    let mut buf = Vec::new();
    let (finish, tokens, unrun) = decode_blocks(
        tokenizer,
        &mut sampler,
        logits,
        opts,
        on_text,
        |tok, sampler, block| {
            run_block(
                engine,
                &mut kv,
                spec.as_deref_mut(),
                sampler,
                tok,
                &mut buf,
                block,
            )?;
            Ok(true)
        },
    )?;
    // The local history is dropped here: the unrun tail needs no trimming.
    let _ = unrun;
    Ok(GenerationStats {
        prompt_tokens: prompt.len() - reuse,
        prompt_time,
        gen_tokens: tokens.len(),
        gen_time: t1.elapsed(),
        finish,
        tokens,
    })
}

/// Runs `tok` (sampled, not yet run) at `kv.len()` and appends the next tokens to
/// `block`, each accepted into `sampler`: through `spec` when there is one and the
/// context leaves room for a block (then possibly several tokens), else one plain step.
/// `kv` records every token whose KV rows are written: `tok` and all of `block` but its
/// last token.
pub(crate) fn run_block(
    engine: &mut Engine,
    kv: &mut KvHistory,
    spec: Option<&mut Speculator>,
    sampler: &mut Sampler,
    tok: u32,
    buf: &mut Vec<f32>,
    block: &mut Vec<u32>,
) -> Result<(), EngineError> {
    match spec {
        // The drafts are verified against the unconstrained chain: a grammar turns
        // speculation off (one plain step per token).
        Some(spec) if !sampler.is_constrained() && kv.len() + 2 <= engine.n_ctx() => {
            spec.step(engine, sampler, kv.tokens(), tok, buf, block)?;
            kv.push(tok);
            kv.extend(&block[..block.len().saturating_sub(1)]);
        }
        _ => {
            engine.forward_into(&[tok], kv.len(), 1, buf)?;
            kv.push(tok);
            block.push(sample_next(sampler, buf)?);
        }
    }
    Ok(())
}

/// Samples the next token from `logits` (under the sampler's grammar, if any) and records
/// it in the penalty window.
pub(crate) fn sample_next(sampler: &mut Sampler, logits: &mut [f32]) -> Result<u32, EngineError> {
    let t = sampler.try_sample(logits).map_err(|e| EngineError::Param {
        name: "grammar",
        message: e.to_string(),
    })?;
    sampler.accept(t);
    Ok(t)
}

/// The generation loop over blocks of tokens (one per plain step, several per
/// speculative step): samples the first token from `logits`, then streams each token
/// through the stop scanner and hands the last token of each block to `advance`, which
/// runs it (with anything drafted) and appends the next block, its tokens sampled and
/// accepted into the sampler; `advance` returns `false` when the token cannot run (the
/// context is full), which ends as a length limit. Returns why generation ended, the
/// generated tokens, and how many tokens of the last block `advance` ran but generation
/// did not reach (the caller's KV history drops them): so that, as in plain decode, all
/// generated tokens have run when an end-of-generation token ended it, all but the last
/// otherwise.
pub(crate) fn decode_blocks(
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    mut logits: Vec<f32>,
    opts: &GenerateOptions,
    mut on_text: impl FnMut(&str) -> bool,
    mut advance: impl FnMut(u32, &mut Sampler, &mut Vec<u32>) -> Result<bool, EngineError>,
) -> Result<(FinishReason, Vec<u32>, usize), EngineError> {
    let mut stream = StreamDecoder::new(false);
    let mut stops = StopScanner::new(&opts.stop);
    let mut tokens = Vec::new();
    let mut finish = FinishReason::Length;
    let mut block = Vec::new();
    let mut unrun = 0;
    if opts.max_tokens > 0 {
        block.push(sample_next(sampler, &mut logits)?);
    }
    'gen: while !block.is_empty() {
        for (k, &tok) in block.iter().enumerate() {
            // Tokens of this block after `tok` ran in the model but are not generated.
            unrun = block.len() - k - 1;
            if tokenizer.is_eog(tok) {
                finish = FinishReason::Stop;
                break 'gen;
            }
            tokens.push(tok);
            let piece = stream
                .push(tokenizer, tok)
                .map_err(|e| EngineError::Param {
                    name: "token",
                    message: e.to_string(),
                })?;
            match stops.push(&piece) {
                StopEvent::Text(t) => {
                    if !t.is_empty() && !on_text(&t) {
                        finish = FinishReason::Cancelled;
                        break 'gen;
                    }
                }
                StopEvent::Stopped(t) => {
                    if !t.is_empty() {
                        on_text(&t);
                    }
                    finish = FinishReason::Stop;
                    break 'gen;
                }
            }
            if tokens.len() == opts.max_tokens {
                break 'gen;
            }
        }
        unrun = 0;
        let last = block[block.len() - 1];
        block.clear();
        if !advance(last, sampler, &mut block)? {
            break;
        }
    }
    if finish != FinishReason::Stop || opts.stop.is_empty() {
        let mut rest = stops.finish();
        rest.push_str(&stream.flush());
        if !rest.is_empty() && finish != FinishReason::Cancelled {
            on_text(&rest);
        }
    }
    Ok((finish, tokens, unrun))
}

/// Greedy continuation of `prompt` by `n` tokens, ignoring end-of-generation tokens
/// (the reference comparisons generate a fixed length).
pub fn greedy_tokens(
    engine: &mut Engine,
    prompt: &[u32],
    n: usize,
) -> Result<Vec<u32>, EngineError> {
    engine.reset();
    let mut logits = engine.prefill(prompt, 0)?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = crate::sampling::argmax(&logits);
        out.push(t);
        if i + 1 < n {
            engine.forward_into(&[t], prompt.len() + i, 1, &mut logits)?;
        }
    }
    Ok(out)
}
