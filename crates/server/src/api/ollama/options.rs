//! ollama's `options`: its names and defaults, mapped onto the sampler's settings; the
//! runtime-only ones accepted and ignored, unknown ones logged, as ollama does.

use serde_json::Value;

use crate::api::fields::{self, field, opt_f32, unsupported, wrong, Object};
use crate::error::ApiError;
use crate::params::{self, GenRequest};

/// Options that only tune ollama's runtime (threads, GPU layers, memory mapping): they
/// do not change the answer, and minfer sets those from its own command line.
pub(super) const RUNTIME_OPTIONS: &[&str] = &[
    "num_keep",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "num_thread",
    "use_mmap",
    "use_mlock",
    "numa",
    "vocab_only",
    "f16_kv",
    "logits_all",
    "penalize_newline",
    "mirostat_tau",
    "mirostat_eta",
];

/// Sampling options minfer does not have, with their neutral values; any other value is
/// refused, since ignoring it would change the output.
pub(super) const UNSUPPORTED_OPTIONS: &[(&str, f64)] =
    &[("mirostat", 0.0), ("typical_p", 1.0), ("tfs_z", 1.0)];

/// Most stop strings `options.stop` may hold: ollama sets no limit, and a long list
/// only slows the scan of each piece of text, so the bound is generous.
pub(super) const MAX_STOP: usize = 64;

/// `options` in ollama's names and defaults (temperature 0.8, top_k 40, top_p 0.9,
/// min_p 0, repeat_penalty 1.1 over the last 64 tokens, a random seed).
pub fn parse_options(obj: &Object, slot_ctx: usize) -> Result<GenRequest, ApiError> {
    let mut g = GenRequest::default();
    {
        let s = &mut g.sampling;
        s.top_p = 0.9;
        s.min_p = 0.0;
        s.repeat_penalty = 1.1;
        s.penalty_last_n = 64;
    }
    let o = match field(obj, "options") {
        None => return Ok(g),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(wrong("options", "an object")),
    };
    let name = |k: &str| format!("options.{k}");
    let num = |k: &str| -> Result<Option<f32>, ApiError> {
        opt_f32(o, k).map_err(|e| {
            ApiError::bad_request(
                e.message
                    .replace(&format!("`{k}`"), &format!("`options.{k}`")),
            )
        })
    };
    let int = |k: &str| -> Result<Option<i64>, ApiError> {
        match o.get(k).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(v) => whole_number(v)
                .map(Some)
                .ok_or_else(|| wrong(&name(k), "an integer")),
        }
    };
    let range = |k: &str, v: f32, what: &str| {
        ApiError::bad_request(format!("field `options.{k}` is {v}: must be {what}"))
    };
    for (k, v) in o {
        let known = RUNTIME_OPTIONS.contains(&k.as_str())
            || UNSUPPORTED_OPTIONS.iter().any(|(n, _)| n == k)
            || [
                "num_predict",
                "temperature",
                "top_k",
                "top_p",
                "min_p",
                "repeat_penalty",
                "repeat_last_n",
                "presence_penalty",
                "frequency_penalty",
                "seed",
                "stop",
                "num_ctx",
            ]
            .contains(&k.as_str());
        if !known && !v.is_null() {
            // ollama logs unknown options and goes on; so does this server.
            eprintln!("minfer serve: ignoring unknown ollama option `{k}`");
        }
    }
    for &(k, neutral) in UNSUPPORTED_OPTIONS {
        if let Some(v) = num(k)? {
            if f64::from(v) != neutral {
                return Err(unsupported(
                    &name(k),
                    &format!("only {neutral} is accepted"),
                ));
            }
        }
    }
    let s = &mut g.sampling;
    if let Some(t) = num("temperature")? {
        if !(0.0..=params::MAX_TEMPERATURE).contains(&t) {
            return Err(range("temperature", t, "in [0, 100]"));
        }
        s.temperature = t;
    }
    if let Some(k) = int("top_k")? {
        s.top_k = usize::try_from(k).unwrap_or(0);
    }
    if let Some(p) = num("top_p")? {
        s.top_p = fields::top_p(&name("top_p"), p)?;
    }
    if let Some(p) = num("min_p")? {
        s.min_p = fields::min_p(&name("min_p"), p)?;
    }
    if let Some(r) = num("repeat_penalty")? {
        s.repeat_penalty = fields::repeat_penalty(&name("repeat_penalty"), r)?;
    }
    if let Some(n) = int("repeat_last_n")? {
        // -1 is "the whole context": the longest window the sampler keeps.
        let whole = minfer_runtime::sampling::MAX_PENALTY_WINDOW.min(slot_ctx);
        s.penalty_last_n = fields::repeat_last_n(&name("repeat_last_n"), n, whole)?;
    }
    if let Some(p) = num("presence_penalty")? {
        s.presence_penalty = p;
    }
    if let Some(p) = num("frequency_penalty")? {
        s.frequency_penalty = p;
    }
    match int("seed")? {
        // ollama's -1 (and no seed) is a random one.
        None | Some(-1) => {}
        Some(x) => s.seed = x as u64,
    }
    s.validate()
        .map_err(|e| ApiError::bad_request(format!("options: {e}")))?;
    g.max_tokens = match int("num_predict")? {
        // -1 is unlimited and -2 fills the context: both end at the slot's context.
        None | Some(-1) | Some(-2) => None,
        Some(n) if n > 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "field `options.num_predict` is {n}: must be -1, -2 or an integer >= 1"
            )))
        }
    };
    if let Some(n) = int("num_ctx")? {
        if n < 1 || n as u64 > slot_ctx as u64 {
            return Err(ApiError::bad_request(format!(
                "field `options.num_ctx` is {n}: a slot of this server holds {slot_ctx} \
                 tokens (start `minfer serve` with a larger --ctx-size, or fewer --slots)"
            )));
        }
    }
    g.stop = fields::string_list(o.get("stop"), "options.stop", "an array of strings")?;
    if g.stop.len() > MAX_STOP
        || g.stop
            .iter()
            .any(|s| s.is_empty() || s.len() > params::MAX_STOP_BYTES)
    {
        return Err(ApiError::bad_request(format!(
            "field `options.stop` must hold at most {MAX_STOP} strings of 1 to {} bytes",
            params::MAX_STOP_BYTES
        )));
    }
    Ok(g)
}

/// `v` as an integer: an integer, or a float without a fractional part (ollama reads
/// every JSON number as a float, so clients send `40.0` for `top_k`); `None` for a
/// fraction, a value past 64 bits or anything not a number.
pub(super) fn whole_number(v: &Value) -> Option<i64> {
    if let Some(i) = v.as_i64() {
        return Some(i);
    }
    let x = v.as_f64()?;
    // 2^63 itself is past i64; every float below it in magnitude with no fraction fits.
    let bound = 9_223_372_036_854_775_808.0;
    (x.fract() == 0.0 && (-bound..bound).contains(&x)).then_some(x as i64)
}
