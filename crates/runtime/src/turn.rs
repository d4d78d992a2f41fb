//! What a conversation turn is configured with, reports and fails with: the overflow
//! policy and options, the turn's counts, and its errors (shared by the conversation and
//! the context shift of plain completions).

use std::time::Duration;

use minfer_tokenizer::TemplateError;

use crate::engine::EngineError;
use crate::generate::FinishReason;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_policies_parse_by_name() {
        assert_eq!("shift".parse(), Ok(OverflowPolicy::Shift));
        assert_eq!("refuse".parse(), Ok(OverflowPolicy::Refuse));
        let e = "drop".parse::<OverflowPolicy>().unwrap_err();
        assert!(e.contains("drop") && e.contains("shift or refuse"), "{e}");
    }
}
