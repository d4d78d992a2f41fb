//! The generation request every codec reads into ([`GenRequest`], with llama-server's
//! sampling defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, no penalties,
//! a random seed), the bounds the codecs share, and the prompt shapes of a completion.

use minfer_runtime::{Grammar, SamplingParams};

use crate::reasoning::Reasoning;
use crate::tools::ToolSpec;

/// Generation settings shared by chat and text completions.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// Sampler chain parameters.
    pub sampling: SamplingParams,
    /// Most tokens to generate; `None` fills the slot's context.
    pub max_tokens: Option<usize>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stream as server-sent events.
    pub stream: bool,
    /// Send a usage chunk before `[DONE]` when streaming.
    pub include_usage: bool,
    /// Report log-probabilities with this many alternatives per token.
    pub logprobs: Option<usize>,
    /// Report them of the distribution the sampler drew from (after the grammar, top-k,
    /// top-p, min-p and the temperature) instead of the model's (llama-server's
    /// `post_sampling_probs`).
    pub post_sampling: bool,
    /// Choices to generate from the prompt (`n`), 1 to [`MAX_CHOICES`]; the model's slot
    /// count bounds it further when the request is admitted.
    pub n: usize,
    /// The `model` the request names, if any (selects among several served models).
    pub model: Option<String>,
    /// Reuse the longest prompt prefix a slot holds (llama-server's `cache_prompt`).
    pub cache_prompt: bool,
    /// The slot to run in (llama-server's `id_slot`); `None` picks the best free one.
    pub slot: Option<usize>,
    /// The grammar the output must follow, and the request field that gave it (named
    /// when it does not compile).
    pub grammar: Option<(Grammar, &'static str)>,
    /// The tools the model may call.
    pub tools: Option<ToolSpec>,
    /// Whether reasoning is split from the answer (chat routes), and whether the prompt
    /// opened the block.
    pub reasoning: Reasoning,
    /// llama-server's stream telemetry the request asks for.
    pub telemetry: Telemetry,
    /// llama-server's `verbose`: an unstreamed answer echoes the prompt as the model
    /// read it (`__verbose`), for debugging templates.
    pub verbose: bool,
}

/// llama-server's stream telemetry: `timings` on every streamed chunk
/// (`timings_per_token`) and `prompt_progress` chunks while the prompt runs
/// (`return_progress`). A finished answer carries its `timings` either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Telemetry {
    /// `timings_per_token`.
    pub per_token: bool,
    /// `return_progress`.
    pub progress: bool,
}

impl GenRequest {
    /// The tools the model is shown (and whose calls are parsed from its answer): the
    /// request's, unless `tool_choice` is `none`.
    pub fn shown_tools(&self) -> Option<&ToolSpec> {
        self.tools.as_ref().filter(|t| t.enabled())
    }
}

impl Default for GenRequest {
    /// llama-server's sampling defaults with a fresh random seed, one choice, no stop
    /// strings, no streaming, the slot's context as the limit, prefix reuse on, any
    /// slot, the default model: what a codec starts from.
    fn default() -> Self {
        GenRequest {
            sampling: SamplingParams {
                seed: random_seed(),
                ..SamplingParams::default()
            },
            max_tokens: None,
            stop: Vec::new(),
            stream: false,
            include_usage: false,
            logprobs: None,
            post_sampling: false,
            n: 1,
            model: None,
            cache_prompt: true,
            slot: None,
            grammar: None,
            tools: None,
            reasoning: Reasoning::default(),
            telemetry: Telemetry::default(),
            verbose: false,
        }
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// Most alternatives per token that `top_logprobs` may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Highest `temperature` accepted; far above it the distribution is already uniform.
pub const MAX_TEMPERATURE: f32 = 100.0;

/// Magnitude bound of `presence_penalty` and `frequency_penalty` (OpenAI's range).
pub const MAX_PENALTY: f32 = 2.0;

/// Range of `repeat_penalty`: it divides logits, so it must stay away from zero.
pub const REPEAT_PENALTY_RANGE: (f32, f32) = (0.01, 10.0);

/// Most stop strings per request (OpenAI's limit: "up to 4 sequences").
pub const MAX_STOP: usize = 4;

/// Most choices a request may ask for (OpenAI's bound on `n`); a model serves at most
/// as many as it has slots.
pub const MAX_CHOICES: usize = 128;

/// Longest stop string, in bytes (the scanner holds back up to this much text).
pub const MAX_STOP_BYTES: usize = 256;

/// A completion prompt: text to tokenize, or token ids as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Text, tokenized with special-token parsing.
    Text(String),
    /// Token ids used verbatim.
    Tokens(Vec<u32>),
}
