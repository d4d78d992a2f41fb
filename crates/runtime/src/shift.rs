//! The context shift (llama.cpp's, by re-prefilling instead of re-rotating): with the KV
//! full, keep its first `n_keep` positions, drop the oldest half of the rest and run what
//! follows again at the new positions, so the KV equals a fresh prefill of the kept
//! tokens exactly. [`generate_shifting`] applies it to a plain completion (`minfer run`);
//! the conversation uses the same step between turns and inside an answer.

use std::time::Instant;

use minfer_tokenizer::Tokenizer;

use crate::engine::{Engine, EngineError};
use crate::generate::{decode_blocks, run_block, sample_next, GenerateOptions, GenerationStats};
use crate::history::KvHistory;
use crate::speculative::Speculator;
use crate::turn::ConversationError;

/// The context shift, one copy for conversations and plain completions: with the KV
/// full, keeps its first `n_keep` positions, drops the oldest half of the rest, and runs
/// what follows (then `tok`) again at the new positions, refilling `logits`. Returns the
/// tokens dropped, or `None` (nothing changed) when there is nothing to drop.
pub(crate) fn shift_and_run(
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
    // Where sliding-window rings no longer hold the rows before `n_keep`, or recurrent
    // state holds other positions, the kept tokens run again from the last point the
    // engine can go on from (a state checkpoint, or 0).
    let from = engine.resume_point(n_keep);
    let mut run = kv.tokens()[from..n_keep].to_vec();
    run.extend_from_slice(&kv.tokens()[n_keep + discard..]);
    run.push(tok);
    kv.truncate(from);
    *logits = engine.prefill(&run, from)?;
    kv.extend(&run);
    Ok(Some(discard))
}

/// Prefills a prompt's `tokens` at `kv.len()` in the steps [`Engine::prefill_prompt`]
/// runs (batch-sized chunks, stopping at the state checkpoint marks), recording each in
/// `kv` once it ran and asking `interrupted` after each. Returns the last token's logits, or `None` when interrupted
/// (then `kv` holds the chunks that ran): an interruption during the last chunk still
/// counts, since no answer has started.
pub(crate) fn prefill_chunks(
    engine: &mut Engine,
    kv: &mut KvHistory,
    tokens: &[u32],
    interrupted: &mut dyn FnMut() -> bool,
) -> Result<Option<Vec<f32>>, EngineError> {
    engine.prefill_prompt_with(tokens, kv.len(), |chunk| {
        kv.extend(chunk);
        !interrupted()
    })
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
    // Only a prefix the engine can go on from (sliding-window rings, a recurrent state
    // at its end or at a checkpoint) is kept; otherwise the prompt runs from there.
    let reuse = kv.reuse_from(prompt, |k| engine.resume_point(k));
    let t0 = Instant::now();
    let logits = engine.prefill_prompt(&prompt[reuse.kept..], reuse.kept)?;
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
