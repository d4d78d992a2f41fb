//! The generation loop: prefill, then sample and decode one token at a time, streaming
//! complete UTF-8 text and stopping at end-of-generation tokens, stop strings or a limit.

use std::time::{Duration, Instant};

use minfer_tokenizer::{StreamDecoder, Tokenizer};

use crate::constraint::{CompiledGrammar, Prefetch};
use crate::engine::{Engine, EngineError};
use crate::sampling::{Sampler, SamplingParams};
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
    /// text.
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
    if reuse == 0 {
        engine.reset();
    }
    let t0 = Instant::now();
    let logits = engine.prefill(&prompt[reuse..], reuse)?;
    let prompt_time = t0.elapsed();
    for &t in prompt {
        sampler.accept(t);
    }

    let t1 = Instant::now();
    let mut pos = prompt.len();
    let (finish, tokens) = decode_loop(
        tokenizer,
        &mut sampler,
        logits,
        opts,
        on_text,
        |tok, logits| {
            engine.forward_into(&[tok], pos, 1, logits)?;
            pos += 1;
            Ok(true)
        },
    )?;
    Ok(GenerationStats {
        prompt_tokens: prompt.len() - reuse,
        prompt_time,
        gen_tokens: tokens.len(),
        gen_time: t1.elapsed(),
        finish,
        tokens,
    })
}

/// The sampling loop shared by [`generate`] and the conversation engine: samples from
/// `logits`, streams text through the stop scanner, and hands each kept token to
/// `advance`, which runs it through the model and refills `logits`; `advance` returns
/// `false` when the token cannot run (the context is full), which ends as a length limit.
/// Returns why generation ended and the generated tokens; all of them have been run
/// through `advance` when an end-of-generation token ended it, all but the last otherwise.
pub(crate) fn decode_loop(
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    mut logits: Vec<f32>,
    opts: &GenerateOptions,
    mut on_text: impl FnMut(&str) -> bool,
    mut advance: impl FnMut(u32, &mut Vec<f32>) -> Result<bool, EngineError>,
) -> Result<(FinishReason, Vec<u32>), EngineError> {
    let mut stream = StreamDecoder::new(false);
    let mut stops = StopScanner::new(&opts.stop);
    let mut tokens = Vec::new();
    let mut finish = FinishReason::Length;
    while tokens.len() < opts.max_tokens {
        let tok = sampler
            .try_sample(&mut logits)
            .map_err(|e| EngineError::Param {
                name: "grammar",
                message: e.to_string(),
            })?;
        if tokenizer.is_eog(tok) {
            finish = FinishReason::Stop;
            break;
        }
        sampler.accept(tok);
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
                    break;
                }
            }
            StopEvent::Stopped(t) => {
                if !t.is_empty() {
                    on_text(&t);
                }
                finish = FinishReason::Stop;
                break;
            }
        }
        if tokens.len() == opts.max_tokens || !advance(tok, &mut logits)? {
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
    Ok((finish, tokens))
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
