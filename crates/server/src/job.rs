//! What flows between the HTTP side and the inference worker: jobs in, events out,
//! and the log-probability report of a sampled token.

use std::time::{Duration, Instant};

use minfer_runtime::SamplingParams;
use minfer_tokenizer::Tokenizer;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::error::ApiError;

/// Events a request receives; capacity of its channel.
pub const EVENT_CAPACITY: usize = 64;

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// End-of-generation token or stop string.
    Stop,
    /// `max_tokens` (or the slot's context) reached.
    Length,
}

impl Finish {
    /// OpenAI's `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// Log-probability of one candidate token.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The token's text (lossy UTF-8).
    pub text: String,
    /// The token's raw bytes.
    pub bytes: Vec<u8>,
    /// Natural-log probability under the model.
    pub logprob: f32,
    /// The token's id.
    pub id: u32,
}

/// The sampled token's log-probability and the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The sampled token.
    pub chosen: Candidate,
    /// The `top_logprobs` most likely tokens, best first.
    pub top: Vec<Candidate>,
}

/// Token counts of one finished choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// The choice's index in `0..n`.
    pub choice: usize,
    /// Why it ended.
    pub finish: Finish,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens served from the slot's kept prefix.
    pub cached_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// From admission into a slot to the first sampled token (the prompt's prefill).
    pub prompt_time: Duration,
    /// From the first sampled token to the end of the generation.
    pub predicted_time: Duration,
    /// Index into the request's stop strings of the one that ended it, if one did.
    pub stop_word: Option<usize>,
}

/// Where a request's prompt processing stands (llama-server's `prompt_progress`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromptProgress {
    /// Prompt tokens.
    pub total: usize,
    /// Prompt tokens served from the slot's kept prefix.
    pub cache: usize,
    /// Prompt tokens whose KV is in place: the kept ones and those run so far.
    pub processed: usize,
    /// Time since the job entered its slot.
    pub elapsed: Duration,
}

impl PromptProgress {
    /// Whether the whole prompt has run.
    pub fn done(&self) -> bool {
        self.processed >= self.total
    }
}

/// What the worker tells a request.
#[derive(Debug, Clone)]
pub enum Event {
    /// Prompt processing has started, or has finished (sent only to jobs that asked,
    /// [`Job::progress`]; choice 0's prompt, which every choice shares).
    Progress(PromptProgress),
    /// New text of one choice (possibly empty when only log-probabilities are new).
    Chunk {
        /// The choice's index in `0..n`.
        choice: usize,
        /// Text safe to show (never part of a stop string).
        text: String,
        /// Log-probabilities of the tokens sampled since the last chunk, when asked.
        logprobs: Vec<TokenLogprob>,
        /// Tokens the choice has generated so far.
        generated: usize,
    },
    /// One choice ended normally (a request of `n` choices gets `n` of these).
    Done(Summary),
    /// The generation failed.
    Error(ApiError),
}

/// Faults a test can inject into one request's inference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Panic during the prefill.
    Panic,
    /// Panic inside a kernel of the request's first engine step, on a pool thread.
    KernelPanic,
    /// Sleep 10 ms before each of the request's decode steps (a slow model).
    Slow,
    /// Sleep 1.5 s before each step of the request's prompt (a long prefill).
    SlowPrefill,
}

/// One admitted request as the worker sees it.
#[derive(Debug, Clone)]
pub struct Job {
    /// Prompt tokens (non-empty, inside the vocabulary).
    pub prompt: Vec<u32>,
    /// Choices to generate from the one prefill of the prompt (1 to the slot count);
    /// choice `i` samples with [`choice_seed`]`(seed, i)`.
    pub n: usize,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampler parameters.
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Alternatives per token when log-probabilities are wanted.
    pub logprobs: Option<usize>,
    /// The log-probabilities are of the distribution the sampler drew from, not of the
    /// model's raw logits (llama-server's `post_sampling_probs`).
    pub post_sampling: bool,
    /// When the request arrived (for TTFT).
    pub arrived: Instant,
    /// When the request is abandoned with a 504.
    pub deadline: Instant,
    /// A fault to inject (tests only).
    pub fault: Option<Fault>,
    /// Where events go; closing it cancels the generation.
    pub tx: mpsc::Sender<Event>,
    /// Reuse the longest prefix a slot holds (`false` prefills the whole prompt).
    pub cache_prompt: bool,
    /// The slot the job must run in (llama-server's `id_slot`); `None` picks one.
    pub slot: Option<usize>,
    /// The grammar every choice's tokens must follow; each choice runs its own state.
    /// With it, the request field that gave it, named when it fails mid-generation.
    pub constraint: Option<(minfer_runtime::CompiledGrammar, &'static str)>,
    /// Send [`Event::Progress`] when the prompt starts and when it has run (a stream's
    /// `return_progress` or `timings_per_token`).
    pub progress: bool,
    /// The request's index of this job's first choice: a request of several prompts
    /// sends one job per prompt over one channel, prompt `p`'s choices numbered from
    /// `p * n` (as OpenAI numbers a batch's choices).
    pub first_choice: usize,
    /// Set once, when the job's first choice enters a slot, to that slot's index, so
    /// that an answer can name the slot that ran it (llama-server's `id_slot`).
    pub ran_in: std::sync::Arc<std::sync::OnceLock<usize>>,
}

/// A slot as `/slots` reports it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SlotInfo {
    /// Slot index.
    pub id: usize,
    /// Positions the slot holds.
    pub n_ctx: usize,
    /// Whether a request is using it.
    pub is_processing: bool,
    /// Tokens whose KV the slot keeps for prefix reuse.
    pub cached_tokens: usize,
    /// Prompt tokens of the current (or last) request.
    pub prompt_tokens: usize,
    /// Tokens generated for the current (or last) request.
    pub generated_tokens: usize,
}

/// The sampler seed of choice `i` of a request seeded with `seed`: choice 0 keeps the
/// seed (so `n = 1` samples as it always did), the others get distinct streams derived
/// from it (SplitMix64's finaliser), so a fixed seed gives distinct, reproducible choices.
pub fn choice_seed(seed: u64, i: usize) -> u64 {
    if i == 0 {
        return seed;
    }
    let mut z = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn candidate(tok: &Tokenizer, id: u32, logprob: f32) -> Candidate {
    let bytes = tok
        .token_bytes(id, false)
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    Candidate {
        text: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
        logprob,
        id,
    }
}

/// Log-softmax of the raw logits at `chosen`, and the `k` best alternatives.
pub fn logprob_of(tok: &Tokenizer, raw: &[f32], chosen: u32, k: usize) -> TokenLogprob {
    let max = raw.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max
        + raw
            .iter()
            .map(|&x| ((x - max) as f64).exp())
            .sum::<f64>()
            .ln() as f32;
    let lp = |i: usize| raw.get(i).map_or(f32::NEG_INFINITY, |&x| x - lse);
    let mut top: Vec<usize> = (0..raw.len()).collect();
    let k = k.min(raw.len());
    if k > 0 {
        top.select_nth_unstable_by(k - 1, |&a, &b| raw[b].total_cmp(&raw[a]));
    }
    top.truncate(k);
    top.sort_by(|&a, &b| raw[b].total_cmp(&raw[a]));
    TokenLogprob {
        chosen: candidate(tok, chosen, lp(chosen as usize)),
        top: top
            .into_iter()
            .map(|i| candidate(tok, i as u32, lp(i)))
            .collect(),
    }
}

/// The log-probability of `chosen` and of the `k` most likely tokens (fewer where fewer
/// have mass) in `dist`, the distribution the sampler drew `chosen` from (most likely
/// first, as [`minfer_runtime::Sampler::drawn_from`] gives it).
pub fn post_sampling_of(
    tok: &Tokenizer,
    dist: &[(u32, f64)],
    chosen: u32,
    k: usize,
) -> TokenLogprob {
    let lp = |p: f64| p.ln() as f32;
    let p_chosen = dist.iter().find(|d| d.0 == chosen).map_or(0.0, |d| d.1);
    TokenLogprob {
        chosen: candidate(tok, chosen, lp(p_chosen)),
        top: dist
            .iter()
            .take(k)
            .map(|&(t, p)| candidate(tok, t, lp(p)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_seeds_are_distinct_and_keep_choice_zero() {
        assert_eq!(choice_seed(42, 0), 42);
        let s: Vec<u64> = (0..8).map(|i| choice_seed(42, i)).collect();
        for (i, a) in s.iter().enumerate() {
            assert!(s[i + 1..].iter().all(|b| b != a), "{s:?}");
        }
        assert_eq!(choice_seed(42, 3), choice_seed(42, 3));
        assert_ne!(choice_seed(42, 1), choice_seed(43, 1));
    }

    #[test]
    fn finish_reasons_use_openai_names() {
        assert_eq!(Finish::Stop.as_str(), "stop");
        assert_eq!(Finish::Length.as_str(), "length");
    }
}
