//! The server's sampling defaults (`serve --temp 0.6 --top-k 20 --seed 42`, llama-server's
//! flags, what model cards recommend running a model with): each replaces the built-in
//! default of a request that leaves that setting out, on every route. A setting the
//! request gives wins; `null` counts as left out.

use minfer_runtime::SamplingParams;
use serde_json::Value;

use crate::api::fields::Object;

/// One sampler setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knob {
    /// `temperature`.
    Temperature,
    /// `top_k`.
    TopK,
    /// `top_p`.
    TopP,
    /// `min_p`.
    MinP,
    /// `repeat_penalty`.
    RepeatPenalty,
    /// `repeat_last_n`.
    RepeatLastN,
    /// `presence_penalty`.
    PresencePenalty,
    /// `frequency_penalty`.
    FrequencyPenalty,
    /// `seed`.
    Seed,
}

/// The request fields that set each knob, as llama-server's routes (native and OpenAI)
/// and ollama's `options` name them.
pub const LLAMA_NAMES: &[(Knob, &str)] = &[
    (Knob::Temperature, "temperature"),
    (Knob::TopK, "top_k"),
    (Knob::TopP, "top_p"),
    (Knob::MinP, "min_p"),
    (Knob::RepeatPenalty, "repeat_penalty"),
    (Knob::RepeatLastN, "repeat_last_n"),
    (Knob::PresencePenalty, "presence_penalty"),
    (Knob::FrequencyPenalty, "frequency_penalty"),
    (Knob::Seed, "seed"),
];

/// Anthropic's Messages API's names.
pub const ANTHROPIC_NAMES: &[(Knob, &str)] = &[
    (Knob::Temperature, "temperature"),
    (Knob::TopK, "top_k"),
    (Knob::TopP, "top_p"),
];

/// OpenAI's Responses API's names.
pub const RESPONSES_NAMES: &[(Knob, &str)] =
    &[(Knob::Temperature, "temperature"), (Knob::TopP, "top_p")];

/// The server's defaults; `None` keeps the built-in one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingDefaults {
    /// Temperature (0: greedy).
    pub temperature: Option<f32>,
    /// Top-k (0: off).
    pub top_k: Option<usize>,
    /// Top-p in (0, 1].
    pub top_p: Option<f32>,
    /// Min-p in [0, 1].
    pub min_p: Option<f32>,
    /// Repetition penalty (1: off).
    pub repeat_penalty: Option<f32>,
    /// Tokens the penalties look back over.
    pub repeat_last_n: Option<usize>,
    /// Presence penalty.
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Seed of every request that gives none (llama-server's `--seed`); `None`: a fresh
    /// random one per request.
    pub seed: Option<u64>,
}

impl SamplingDefaults {
    /// Sets every knob of `s` that has a default here and that `given` says the request
    /// left out.
    pub fn apply(&self, s: &mut SamplingParams, given: impl Fn(Knob) -> bool) {
        /// `$field = $default` unless the request gave `$knob`.
        macro_rules! fill {
            ($default:expr, $knob:ident, $field:ident) => {
                if let Some(v) = $default.filter(|_| !given(Knob::$knob)) {
                    s.$field = v;
                }
            };
        }
        fill!(self.temperature, Temperature, temperature);
        fill!(self.top_k, TopK, top_k);
        fill!(self.top_p, TopP, top_p);
        fill!(self.min_p, MinP, min_p);
        fill!(self.repeat_penalty, RepeatPenalty, repeat_penalty);
        fill!(self.repeat_last_n, RepeatLastN, penalty_last_n);
        fill!(self.presence_penalty, PresencePenalty, presence_penalty);
        fill!(self.frequency_penalty, FrequencyPenalty, frequency_penalty);
        fill!(self.seed, Seed, seed);
    }

    /// [`Self::apply`] for a request object `obj` whose fields are named by `names`
    /// (a knob without a name there is never given by such a request).
    pub fn apply_to(&self, s: &mut SamplingParams, obj: &Object, names: &[(Knob, &str)]) {
        self.apply(s, |k| {
            names
                .iter()
                .filter(|(n, _)| *n == k)
                .any(|(_, name)| obj.get(*name).is_some_and(|v| !v.is_null()))
        });
    }

    /// [`Self::apply_to`] for ollama, whose settings sit in the request's `options`.
    pub fn apply_to_ollama(&self, s: &mut SamplingParams, obj: &Object) {
        let empty = Object::new();
        let options = obj
            .get("options")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        self.apply_to(s, options, LLAMA_NAMES);
    }

    /// The defaults checked as a request's settings are: the error names the first
    /// setting out of its range.
    pub fn validate(&self) -> Result<(), String> {
        let mut s = SamplingParams::default();
        self.apply(&mut s, |_| false);
        s.validate().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_default_fills_only_what_the_request_left_out() {
        let d = SamplingDefaults {
            temperature: Some(0.6),
            top_k: Some(20),
            seed: Some(42),
            ..SamplingDefaults::default()
        };
        let obj = |v: Value| v.as_object().unwrap().clone();
        let mut s = SamplingParams {
            temperature: 0.3,
            ..SamplingParams::default()
        };
        d.apply_to(
            &mut s,
            &obj(json!({"temperature": 0.3, "seed": null})),
            LLAMA_NAMES,
        );
        assert_eq!((s.temperature, s.top_k, s.seed), (0.3, 20, 42));
        // Responses has no top_k field: the default always holds there.
        let mut s = SamplingParams::default();
        d.apply_to(&mut s, &obj(json!({"top_k": 5})), RESPONSES_NAMES);
        assert_eq!(s.top_k, 20);
        let mut s = SamplingParams {
            top_k: 5,
            ..SamplingParams::default()
        };
        d.apply_to_ollama(&mut s, &obj(json!({"options": {"top_k": 5}})));
        assert_eq!((s.temperature, s.top_k), (0.6, 5));
        let bad = SamplingDefaults {
            top_p: Some(1.5),
            ..SamplingDefaults::default()
        };
        assert!(bad.validate().unwrap_err().contains("top"));
    }
}
