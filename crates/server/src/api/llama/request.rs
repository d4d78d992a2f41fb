//! llama-server's request bodies: `/completion` options in its names and ranges, its
//! prompt shapes (text, token ids, both mixed), its `logit_bias` forms, and the prompt
//! of an `/infill`.

use minfer_runtime::{LOGIT_BIAS_BAN, LOGIT_BIAS_MAX};
use minfer_tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

use super::fim::{infill_layout, ExtraChunk, FIM_BATCH};
use crate::api::fields::{
    self, field, opt_bool, opt_f32, opt_i64, opt_str, out_of_range, wrong, Object,
};
use crate::error::ApiError;
use crate::params::{self, GenRequest};
use crate::Model;

/// Most alternatives per token `n_probs` may ask for.
pub const MAX_N_PROBS: usize = 100;

/// llama-server features minfer does not have, each with its neutral value: any other
/// value is refused by name, since ignoring it would change the output.
pub(super) const UNSUPPORTED: &[(&str, &str)] = &[
    ("mirostat", "0"),
    ("dynatemp_range", "0"),
    ("typical_p", "1"),
    ("dry_multiplier", "0"),
    ("xtc_probability", "0"),
    ("n_cmpl", "1"),
    ("n_indent", "0"),
    ("t_max_predict_ms", "0"),
    ("post_sampling_probs", "false"),
    ("min_keep", "0"),
    ("lora", "[]"),
    ("samplers", "null"),
    ("response_fields", "[]"),
];

pub(super) fn is_neutral(v: &Value, neutral: &str) -> bool {
    match neutral {
        "\"\"" => v.as_str() == Some(""),
        "null" => v.is_null(),
        "false" => v.as_bool() == Some(false),
        "[]" => v.as_array().is_some_and(Vec::is_empty),
        n => {
            let want: f64 = n.parse().unwrap_or(f64::NAN);
            v.as_f64() == Some(want)
        }
    }
}

pub(super) fn check_unsupported(obj: &Object) -> Result<(), ApiError> {
    for &(name, neutral) in UNSUPPORTED {
        if let Some(v) = obj.get(name) {
            if !v.is_null() && !is_neutral(v, neutral) {
                return Err(ApiError::bad_request(format!(
                    "field `{name}` is not supported by this server (only {neutral} is accepted)"
                )));
            }
        }
    }
    Ok(())
}

/// A `/completion` request's options, read into the shared request plus what only the
/// native answer needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The shared generation request.
    pub g: GenRequest,
    /// Alternatives per token in `completion_probabilities` (0: none).
    pub n_probs: usize,
    /// Report the generated token ids in `tokens`.
    pub return_tokens: bool,
    /// End-of-generation tokens are banned.
    pub ignore_eos: bool,
}

/// Reads llama-server's sampling and generation options (its names and ranges).
pub fn parse_options(obj: &Object, tok: &Tokenizer) -> Result<Options, ApiError> {
    check_unsupported(obj)?;
    let mut g = GenRequest::default();
    let s = &mut g.sampling;
    if let Some(t) = opt_f32(obj, "temperature")? {
        // llama-server samples greedily at any temperature <= 0.
        if t > params::MAX_TEMPERATURE {
            return Err(out_of_range("temperature", t, "at most 100"));
        }
        s.temperature = t.max(0.0);
    }
    if let Some(k) = opt_i64(obj, "top_k")? {
        s.top_k = usize::try_from(k).unwrap_or(0);
    }
    if let Some(p) = opt_f32(obj, "top_p")? {
        s.top_p = fields::top_p("top_p", p)?;
    }
    if let Some(p) = opt_f32(obj, "min_p")? {
        s.min_p = fields::min_p("min_p", p)?;
    }
    if let Some(r) = opt_f32(obj, "repeat_penalty")? {
        s.repeat_penalty = fields::repeat_penalty("repeat_penalty", r)?;
    }
    if let Some(n) = opt_i64(obj, "repeat_last_n")? {
        // -1 is "the whole context": the longest window the sampler keeps.
        let whole = minfer_runtime::sampling::MAX_PENALTY_WINDOW;
        s.penalty_last_n = fields::repeat_last_n("repeat_last_n", n, whole)?;
    }
    if let Some(p) = opt_f32(obj, "presence_penalty")? {
        s.presence_penalty = p;
    }
    if let Some(p) = opt_f32(obj, "frequency_penalty")? {
        s.frequency_penalty = p;
    }
    match field(obj, "seed") {
        None => {}
        // -1 (llama-server's default) keeps the random seed.
        Some(v) if v.as_i64() == Some(-1) => {}
        Some(v) => {
            s.seed = v
                .as_u64()
                .ok_or_else(|| wrong("seed", "-1 or a non-negative integer"))?
        }
    }
    s.logit_bias = logit_bias(obj, tok)?;
    let ignore_eos = opt_bool(obj, "ignore_eos")?.unwrap_or(false);
    if ignore_eos {
        for &id in tok.eog_ids() {
            s.logit_bias.retain(|&(t, _)| t != id);
            s.logit_bias.push((id, LOGIT_BIAS_BAN));
        }
    }
    s.validate()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    g.max_tokens = n_predict(obj)?;
    g.stop = stop(obj)?;
    g.stream = opt_bool(obj, "stream")?.unwrap_or(false);
    g.cache_prompt = opt_bool(obj, "cache_prompt")?.unwrap_or(true);
    g.telemetry = crate::api::timings::telemetry(obj)?;
    // `grammar` (GBNF), `json_schema` and `response_format`, as on the OpenAI routes.
    g.grammar = fields::output_grammar(obj)?;
    g.slot = crate::api::fields::id_slot(obj)?;
    let n_probs = match opt_i64(obj, "n_probs")? {
        None => 0,
        Some(n) if (0..=MAX_N_PROBS as i64).contains(&n) => n as usize,
        Some(n) => return Err(out_of_range("n_probs", n, "in [0, 100]")),
    };
    let return_tokens = opt_bool(obj, "return_tokens")?.unwrap_or(false);
    // The token ids of a stream and of `return_tokens` come with the log-probabilities.
    if n_probs > 0 || return_tokens || g.stream {
        g.logprobs = Some(n_probs);
    }
    Ok(Options {
        g,
        n_probs,
        return_tokens,
        ignore_eos,
    })
}

/// `n_predict` (or its alias `max_tokens`): -1 is "until the context is full".
pub(super) fn n_predict(obj: &Object) -> Result<Option<usize>, ApiError> {
    let name = if field(obj, "n_predict").is_some() {
        "n_predict"
    } else {
        "max_tokens"
    };
    match opt_i64(obj, name).map_err(|_| wrong(name, "-1 or an integer >= 1"))? {
        None | Some(-1) => Ok(None),
        Some(0) => Err(ApiError::bad_request(format!(
            "field `{name}` is 0: evaluating a prompt without generating is not supported; \
             use -1 or an integer >= 1"
        ))),
        Some(n) if n > 0 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        Some(n) => Err(out_of_range(name, n, "-1 or an integer >= 1")),
    }
}

pub(super) fn stop(obj: &Object) -> Result<Vec<String>, ApiError> {
    let stop = fields::string_list(field(obj, "stop"), "stop", "an array of strings")?;
    fields::check_stop(&stop)?;
    Ok(stop)
}

/// llama-server's `logit_bias`: `[[token, bias], ...]` or `{"token": bias}`, where a
/// token is an id or a text (every token of its encoding is biased) and a bias is a
/// number in [-100, 100] or `false` (never produce it). A token named twice keeps the
/// last bias.
pub(super) fn logit_bias(obj: &Object, tok: &Tokenizer) -> Result<Vec<(u32, f32)>, ApiError> {
    let entries: Vec<(Value, &Value)> = match field(obj, "logit_bias") {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|e| match e.as_array().map(Vec::as_slice) {
                Some([t, b]) => Ok((t.clone(), b)),
                _ => Err(wrong("logit_bias", "an array of [token, bias] pairs")),
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, b)| {
                let t = match k.parse::<u64>() {
                    Ok(id) if k.bytes().all(|c| c.is_ascii_digit()) => json!(id),
                    _ => json!(k),
                };
                (t, b)
            })
            .collect(),
        Some(_) => return Err(wrong("logit_bias", "an array of [token, bias] pairs")),
    };
    let n_vocab = tok.n_vocab();
    let mut out: Vec<(u32, f32)> = Vec::new();
    for (i, (t, b)) in entries.into_iter().enumerate() {
        let name = format!("logit_bias[{i}]");
        let bias = match b {
            Value::Bool(false) => LOGIT_BIAS_BAN,
            v => {
                let x = v
                    .as_f64()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| wrong(&name, "[token, number or false]"))?
                    as f32;
                if !(-LOGIT_BIAS_MAX..=LOGIT_BIAS_MAX).contains(&x) {
                    return Err(out_of_range(&name, x, "a bias in [-100, 100] or false"));
                }
                x
            }
        };
        let ids = match &t {
            Value::String(s) => tok.encode(s, false, false),
            v => vec![v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .filter(|&x| (x as usize) < n_vocab)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "field `{name}` names token {v}: must be a text or a token id below {n_vocab}"
                    ))
                })?],
        };
        for id in ids {
            out.retain(|&(x, _)| x != id);
            out.push((id, bias));
        }
    }
    Ok(out)
}

/// One prompt in llama-server's shapes: a string, token ids, both mixed
/// (`[12, "text", 34]`), or one of those in a one-element array. Strings are encoded
/// with special-token parsing; BOS is added when the prompt starts with a string and
/// the model asks for it (llama-server's rule).
pub fn prompt_tokens(v: &Value, name: &str, tok: &Tokenizer) -> Result<Vec<u32>, ApiError> {
    mixed(v, name, tok, true, true)
}

/// The prompts of a `/completion` request: one prompt as [`prompt_tokens`] reads it, or
/// llama-server's batch, an array of several such prompts (strings, id arrays, mixed
/// arrays or prompt objects), at most [`crate::generate::MAX_PROMPTS`].
pub fn prompt_list(v: &Value, name: &str, tok: &Tokenizer) -> Result<Vec<Vec<u32>>, ApiError> {
    match v {
        Value::Array(a) if a.len() > 1 && !a.iter().any(Value::is_number) => {
            if a.len() > crate::generate::MAX_PROMPTS {
                return Err(ApiError::bad_request(format!(
                    "field `{name}` holds {} prompts: at most {}",
                    a.len(),
                    crate::generate::MAX_PROMPTS
                )));
            }
            a.iter()
                .enumerate()
                .map(|(i, p)| prompt_tokens(p, &format!("{name}[{i}]"), tok))
                .collect()
        }
        _ => Ok(vec![prompt_tokens(v, name, tok)?]),
    }
}

/// `prompt_tokens` with llama-server's `tokenize_mixed` flags.
pub(super) fn mixed(
    v: &Value,
    name: &str,
    tok: &Tokenizer,
    add_special: bool,
    parse_special: bool,
) -> Result<Vec<u32>, ApiError> {
    let several = || {
        ApiError::bad_request(format!(
            "field `{name}` holds several prompts: send one prompt per request"
        ))
    };
    let n_vocab = tok.n_vocab();
    let id = |x: &Value| -> Result<u32, ApiError> {
        x.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .filter(|&x| (x as usize) < n_vocab)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "field `{name}` holds token {x}: must be an id below {n_vocab}"
                ))
            })
    };
    match v {
        Value::String(s) => Ok(tok.encode(s, add_special, parse_special)),
        Value::Array(a) if a.len() == 1 && (a[0].is_array() || a[0].is_string()) => {
            mixed(&a[0], name, tok, add_special, parse_special)
        }
        Value::Array(a) if a.iter().any(Value::is_number) => {
            let mut out = Vec::new();
            for (i, x) in a.iter().enumerate() {
                match x {
                    Value::String(s) => {
                        out.extend(tok.encode(s, add_special && i == 0, parse_special))
                    }
                    x if x.is_number() => out.push(id(x)?),
                    _ => return Err(wrong(name, "a string, token ids, or both mixed")),
                }
            }
            Ok(out)
        }
        Value::Array(a) if a.is_empty() => Ok(Vec::new()),
        Value::Array(_) => Err(several()),
        Value::Object(o) => {
            if o.get("multimodal_data").is_some_and(|m| !m.is_null()) {
                return Err(ApiError::bad_request(format!(
                    "field `{name}.multimodal_data` is not supported: this server has no \
                     multimodal models"
                )));
            }
            match o.get("prompt_string") {
                Some(p) => mixed(p, name, tok, add_special, parse_special),
                None => Err(wrong(
                    name,
                    "a string, token ids, or {\"prompt_string\": ...}",
                )),
            }
        }
        _ => Err(wrong(name, "a string, token ids, or both mixed")),
    }
}

pub(super) fn input_extra(obj: &Object) -> Result<Vec<ExtraChunk>, ApiError> {
    let Some(v) = field(obj, "input_extra") else {
        return Ok(Vec::new());
    };
    let what = "an array of {\"filename\", \"text\"} objects";
    let arr = v.as_array().ok_or_else(|| wrong("input_extra", what))?;
    arr.iter()
        .enumerate()
        .map(|(i, c)| {
            let o = c
                .as_object()
                .ok_or_else(|| wrong(&format!("input_extra[{i}]"), "an object"))?;
            let get = |k: &str| -> Result<Option<String>, ApiError> {
                opt_str(o, k)
                    .map_err(|_| wrong(&format!("input_extra[{i}].{k}"), "a string"))
                    .map(|s| s.map(str::to_string))
            };
            // `text` is required and `filename` optional, as llama-server checks them.
            let text = get("text")?.ok_or_else(|| {
                ApiError::bad_request(format!(
                    "field `input_extra[{i}].text` is required: each chunk is \
                     {{\"filename\", \"text\"}}"
                ))
            })?;
            Ok(ExtraChunk {
                filename: get("filename")?.unwrap_or_else(|| "tmp".to_string()),
                text,
            })
        })
        .collect()
}

/// The prompt tokens of an `/infill` request.
pub(super) fn infill_prompt(
    m: &Model,
    obj: &Object,
    n_predict: Option<usize>,
) -> Result<Vec<u32>, ApiError> {
    let fim = m
        .fim
        .as_ref()
        .map_err(|why| ApiError::bad_request(why.clone()))?;
    let part = |name: &str| -> Result<Vec<u32>, ApiError> {
        match field(obj, name) {
            None => Ok(Vec::new()),
            Some(v) => mixed(v, name, &m.tok, false, false),
        }
    };
    let (prefix, suffix) = (part("input_prefix")?, part("input_suffix")?);
    let prompt = match field(obj, "prompt") {
        None => Vec::new(),
        Some(v) => mixed(v, "prompt", &m.tok, false, false)?,
    };
    let extra = input_extra(obj)?;
    let ctx = m.slot_ctx;
    let batch = FIM_BATCH.min(ctx);
    // The extra context fills what the slot has left once the rest and the answer fit
    // (llama-server reserves a whole batch, which on a small slot leaves nothing).
    let prefix_n = prefix.len().min(3 * (batch / 4));
    let suffix_n = suffix
        .len()
        .min((batch / 4).saturating_sub(2 + prompt.len()));
    let answer = n_predict.unwrap_or(ctx / 4);
    let used = prefix_n + suffix_n + prompt.len() + 4 + answer;
    let bos = m.tok.add_bos().then(|| m.tok.bos()).flatten();
    let encode = |s: &str| m.tok.encode(s, false, false);
    Ok(infill_layout(
        fim,
        encode,
        bos,
        prefix,
        suffix,
        &extra,
        &prompt,
        batch,
        ctx.saturating_sub(used),
    ))
}

/// Whether the model has the FIM tokens `/infill` needs.
pub fn has_fim(m: &Model) -> bool {
    m.fim.is_ok()
}

/// The fill-in-the-middle prompt for `prefix` and `suffix` text (ollama's `suffix`), laid
/// out as `/infill` lays it.
pub fn fim_prompt(
    m: &Model,
    prefix: &str,
    suffix: &str,
    n_predict: Option<usize>,
) -> Result<Vec<u32>, ApiError> {
    let mut obj = Map::new();
    obj.insert("input_prefix".into(), json!(prefix));
    obj.insert("input_suffix".into(), json!(suffix));
    infill_prompt(m, &obj, n_predict)
}

/// Fields of a `/tokenize` request (llama-server's).
pub const TOKENIZE_FIELDS: &[&str] = &[
    "content",
    "add_special",
    "parse_special",
    "with_pieces",
    "model",
];

/// Fields of a `/detokenize` request.
pub const DETOKENIZE_FIELDS: &[&str] = &["tokens", "model"];
