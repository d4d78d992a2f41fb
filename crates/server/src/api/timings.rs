//! llama-server's telemetry, shared by the routes that report it: `timings` (prompt and
//! predicted token counts, times and rates) of a finished answer or, with
//! `timings_per_token`, of a stream so far; and `prompt_progress` with `return_progress`.

use std::time::Duration;

use serde_json::{json, Value};

use super::fields::{opt_bool, Object};
use crate::error::ApiError;
use crate::job::{PromptProgress, Summary};
use crate::params::Telemetry;

/// Reads `timings_per_token` and `return_progress` (booleans, default false).
pub fn telemetry(obj: &Object) -> Result<Telemetry, ApiError> {
    Ok(Telemetry {
        per_token: opt_bool(obj, "timings_per_token")?.unwrap_or(false),
        progress: opt_bool(obj, "return_progress")?.unwrap_or(false),
    })
}

/// Counts and times of a generation, as far as it has gone.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Prompt tokens served from the slot's kept prefix.
    pub cache_n: usize,
    /// Prompt tokens run.
    pub prompt_n: usize,
    /// Time the prompt took.
    pub prompt: Duration,
    /// Tokens generated.
    pub predicted_n: usize,
    /// Time from the first generated token on.
    pub predicted: Duration,
}

impl Timings {
    /// The timings of a finished choice (or of a whole request's usage).
    pub fn of(s: &Summary) -> Timings {
        Timings {
            cache_n: s.cached_tokens,
            prompt_n: s.prompt_tokens - s.cached_tokens.min(s.prompt_tokens),
            prompt: s.prompt_time,
            predicted_n: s.completion_tokens,
            predicted: s.predicted_time,
        }
    }

    /// llama-server's `timings` object. The predicted rates are over the decode steps,
    /// one fewer than the tokens: the first token comes from the prompt's last logits,
    /// and `predicted` runs from it to the last.
    pub fn to_json(&self) -> Value {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        // A rate over no time or no tokens is reported as 0, not as an infinity JSON lacks.
        let per = |num: f64, den: f64| {
            if den > 0.0 && num > 0.0 {
                num / den
            } else {
                0.0
            }
        };
        let (prompt_ms, predicted_ms) = (ms(self.prompt), ms(self.predicted));
        let prompt_n = self.prompt_n as f64;
        let steps = self.predicted_n.saturating_sub(1) as f64;
        json!({
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": per(prompt_ms, prompt_n),
            "prompt_per_second": per(1000.0 * prompt_n, prompt_ms),
            "predicted_n": self.predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": per(predicted_ms, steps),
            "predicted_per_second": per(1000.0 * steps, predicted_ms),
        })
    }
}

/// llama-server's `timings` of a finished choice.
pub fn of_summary(s: &Summary) -> Value {
    Timings::of(s).to_json()
}

/// llama-server's `prompt_progress` object.
pub fn progress(p: &PromptProgress) -> Value {
    json!({
        "total": p.total,
        "cache": p.cache,
        "processed": p.processed,
        "time_ms": p.elapsed.as_secs_f64() * 1000.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Finish;

    #[test]
    fn rates_follow_the_counts_and_empty_phases_report_zero() {
        let s = Summary {
            choice: 0,
            finish: Finish::Stop,
            prompt_tokens: 12,
            cached_tokens: 2,
            completion_tokens: 5,
            prompt_time: Duration::from_millis(50),
            predicted_time: Duration::ZERO,
            stop_word: None,
        };
        let t = of_summary(&s);
        assert_eq!(t["cache_n"], 2);
        assert_eq!(t["prompt_n"], 10);
        assert_eq!(t["prompt_per_second"], 200.0);
        assert_eq!(t["prompt_per_token_ms"], 5.0);
        assert_eq!(t["predicted_n"], 5);
        assert_eq!(t["predicted_per_second"], 0.0);
        // Five tokens are four decode steps after the first.
        let t = of_summary(&Summary {
            predicted_time: Duration::from_millis(80),
            ..s
        });
        assert_eq!(t["predicted_per_token_ms"], 20.0);
        assert_eq!(t["predicted_per_second"], 50.0);
        // One token took no decode step: no rate.
        let t = of_summary(&Summary {
            completion_tokens: 1,
            ..s
        });
        assert_eq!(t["predicted_per_token_ms"], 0.0);
    }

    #[test]
    fn the_fields_are_booleans() {
        let o = |v: Value| v.as_object().cloned().unwrap_or_default();
        let t = telemetry(&o(json!({"timings_per_token": true}))).unwrap();
        assert!(t.per_token && !t.progress);
        let e = telemetry(&o(json!({"return_progress": "yes"}))).unwrap_err();
        assert!(e.message.contains("return_progress"), "{}", e.message);
    }
}
