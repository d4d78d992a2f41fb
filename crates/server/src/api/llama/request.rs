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
    ("min_keep", "0"),
    ("lora", "[]"),
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
    /// llama-server's `n_indent`: once a line after the first starts with less
    /// indentation than this (spaces and tabs), generation stops there; 0: off.
    pub n_indent: usize,
    /// llama-server's `t_max_predict_ms`: generation stops at a newline generated once
    /// this long has passed since the first generated token; `None`: off.
    pub t_max_predict: Option<std::time::Duration>,
    /// llama-server's `response_fields`: the final object holds only these paths
    /// (`a/b` reaches into `a`); empty: every field.
    pub response_fields: Vec<String>,
}

impl Options {
    /// The options of a request that sets nothing: the shared defaults.
    pub fn defaults() -> Self {
        Options {
            g: GenRequest::default(),
            n_probs: 0,
            return_tokens: false,
            ignore_eos: false,
            n_indent: 0,
            t_max_predict: None,
            response_fields: Vec::new(),
        }
    }
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
    samplers(obj, s)?;
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
    let n_indent = match opt_i64(obj, "n_indent")? {
        None => 0,
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|&n| n <= i32::MAX as usize)
            .ok_or_else(|| out_of_range("n_indent", n, "in [0, 2147483647]"))?,
    };
    // llama-server's range is [-1, i64::MAX]; 0 and -1 are off.
    let t_max_predict = match opt_i64(obj, "t_max_predict_ms")? {
        None => None,
        Some(n) if n < -1 => return Err(out_of_range("t_max_predict_ms", n, "at least -1")),
        Some(n) => u64::try_from(n)
            .ok()
            .filter(|&n| n > 0)
            .map(std::time::Duration::from_millis),
    };
    let response_fields = fields::string_list(
        field(obj, "response_fields"),
        "response_fields",
        "an array of strings",
    )?;
    // The token ids of a stream and of `return_tokens` come with the log-probabilities.
    if n_probs > 0 || return_tokens || g.stream {
        g.logprobs = Some(n_probs);
    }
    g.post_sampling = opt_bool(obj, "post_sampling_probs")?.unwrap_or(false);
    Ok(Options {
        g,
        n_probs,
        return_tokens,
        ignore_eos,
        n_indent,
        t_max_predict,
        response_fields,
    })
}

/// A stage of llama.cpp's sampler chain, as `samplers` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    Penalties,
    TopK,
    TopP,
    MinP,
    Temperature,
    Dry,
    TypicalP,
    Xtc,
    TopNSigma,
    AdaptiveP,
    Infill,
}

/// The stages this server runs, in the order it runs them (the order of llama.cpp's
/// default chain without the stages it lacks).
const CHAIN: [Stage; 5] = [
    Stage::Penalties,
    Stage::TopK,
    Stage::TopP,
    Stage::MinP,
    Stage::Temperature,
];

/// The stage a `samplers` name means: llama.cpp's canonical names, their kebab-case and
/// undashed spellings and its aliases (`nucleus`, `temp`, `typ`), case-insensitive.
pub(super) fn stage_named(name: &str) -> Option<Stage> {
    let n = name.to_ascii_lowercase().replace('-', "_");
    Some(match n.as_str() {
        "penalties" => Stage::Penalties,
        "top_k" | "topk" => Stage::TopK,
        "top_p" | "topp" | "nucleus" => Stage::TopP,
        "min_p" | "minp" => Stage::MinP,
        "temperature" | "temp" => Stage::Temperature,
        "dry" => Stage::Dry,
        "typ_p" | "typp" | "typ" => Stage::TypicalP,
        "xtc" => Stage::Xtc,
        "top_n_sigma" | "topnsigma" => Stage::TopNSigma,
        "adaptive_p" | "adaptivep" => Stage::AdaptiveP,
        "infill" => Stage::Infill,
        _ => return None,
    })
}

/// The stage a `samplers` character means (llama.cpp's `--sampling-seq` letters).
pub(super) fn stage_char(c: char) -> Option<Stage> {
    Some(match c {
        'e' => Stage::Penalties,
        'k' => Stage::TopK,
        'p' => Stage::TopP,
        'm' => Stage::MinP,
        't' => Stage::Temperature,
        'd' => Stage::Dry,
        'y' => Stage::TypicalP,
        'x' => Stage::Xtc,
        's' => Stage::TopNSigma,
        'a' => Stage::AdaptiveP,
        'i' => Stage::Infill,
        _ => return None,
    })
}

/// llama-server's `samplers`: the chain to run, as an array of names or a string of
/// letters. Names llama.cpp does not know are skipped, as it skips them. This server's
/// chain is fixed (penalties, top-k, top-p, min-p, temperature), so the stages listed
/// must come in that order, each once; a stage of it that is not listed is switched
/// off (its neutral value: no penalties, top-k 0, top-p 1, min-p 0, temperature 1, as
/// llama.cpp's chain samples without a temperature stage). A stage this server lacks
/// is accepted only when its own fields leave it neutral (`dry`, `typ_p`, `xtc`,
/// `top_n_sigma`, `adaptive_p`); `infill`, llama.cpp's fill-in-the-middle sampler, is
/// taken without effect, since code-completion clients list it on every request.
pub(super) fn samplers(
    obj: &Object,
    s: &mut minfer_runtime::SamplingParams,
) -> Result<(), ApiError> {
    let stages: Vec<Stage> = match field(obj, "samplers") {
        None => return Ok(()),
        Some(Value::String(c)) => c.chars().filter_map(stage_char).collect(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(stage_named))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                wrong(
                    "samplers",
                    "an array of sampler names or a string of letters",
                )
            })?
            .into_iter()
            .flatten()
            .collect(),
        Some(_) => {
            return Err(wrong(
                "samplers",
                "an array of sampler names or a string of letters",
            ))
        }
    };
    let num = |k: &str| field(obj, k).and_then(Value::as_f64);
    let mut at = 0;
    for &st in &stages {
        let lacking = |name: &str, neutral: bool, how: &str| {
            if neutral {
                Ok(())
            } else {
                Err(ApiError::bad_request(format!(
                    "field `samplers` lists `{name}`, a sampler this server does not have; \
                     it is accepted only while it has no effect ({how})"
                )))
            }
        };
        match st {
            Stage::Dry => lacking(
                "dry",
                num("dry_multiplier").is_none_or(|x| x == 0.0),
                "dry_multiplier 0",
            )?,
            Stage::TypicalP => lacking(
                "typ_p",
                num("typical_p").is_none_or(|x| x >= 1.0),
                "typical_p 1",
            )?,
            Stage::Xtc => lacking(
                "xtc",
                num("xtc_probability").is_none_or(|x| x <= 0.0),
                "xtc_probability 0",
            )?,
            Stage::TopNSigma => lacking(
                "top_n_sigma",
                num("top_n_sigma").is_none_or(|x| x <= 0.0),
                "top_n_sigma -1",
            )?,
            Stage::AdaptiveP => lacking(
                "adaptive_p",
                num("adaptive_target").is_none_or(|x| x < 0.0),
                "adaptive_target -1",
            )?,
            // llama.cpp's fill-in-the-middle sampler, which code-completion clients
            // (llama.vim, llama.vscode) list on every request: taken without effect, so
            // that those clients work; the answer is drawn by the rest of the chain.
            Stage::Infill => {}
            ours => {
                let Some(i) = CHAIN.iter().position(|&c| c == ours) else {
                    continue;
                };
                if i < at {
                    return Err(ApiError::bad_request(
                        "field `samplers` orders this server's samplers differently: it runs \
                         penalties, top_k, top_p, min_p, temperature in that order, each once; \
                         list them in that order",
                    ));
                }
                at = i + 1;
            }
        }
    }
    for stage in CHAIN {
        if stages.contains(&stage) {
            continue;
        }
        match stage {
            Stage::Penalties => {
                s.repeat_penalty = 1.0;
                s.presence_penalty = 0.0;
                s.frequency_penalty = 0.0;
            }
            Stage::TopK => s.top_k = 0,
            Stage::TopP => s.top_p = 1.0,
            Stage::MinP => s.min_p = 0.0,
            _ => s.temperature = 1.0,
        }
    }
    Ok(())
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

/// Most stop strings a native request may hold: llama-server sets no limit (OpenAI's
/// is 4), so this is a bound on the scanner's work, as ollama's `options.stop` has.
pub const MAX_NATIVE_STOP: usize = 64;

/// `stop`: a string or an array of up to [`MAX_NATIVE_STOP`] strings of at most
/// [`params::MAX_STOP_BYTES`] bytes; empty strings are skipped, as llama-server skips
/// them.
pub(super) fn stop(obj: &Object) -> Result<Vec<String>, ApiError> {
    let mut stop = fields::string_list(field(obj, "stop"), "stop", "an array of strings")?;
    if stop.len() > MAX_NATIVE_STOP {
        return Err(out_of_range(
            "stop",
            format!("{} strings", stop.len()),
            &format!("at most {MAX_NATIVE_STOP} strings"),
        ));
    }
    if let Some((i, s)) = stop
        .iter()
        .enumerate()
        .find(|(_, s)| s.len() > params::MAX_STOP_BYTES)
    {
        return Err(out_of_range(
            &format!("stop[{i}]"),
            format!("{} bytes long", s.len()),
            &format!("at most {} bytes long", params::MAX_STOP_BYTES),
        ));
    }
    stop.retain(|s| !s.is_empty());
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
            // An empty list (as clients send it for text) carries nothing.
            let media = o.get("multimodal_data");
            if media.is_some_and(|m| !m.is_null() && m.as_array().is_none_or(|a| !a.is_empty())) {
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
