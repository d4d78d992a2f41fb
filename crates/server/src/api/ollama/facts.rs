//! What ollama reports about a model (`/api/show`, `/api/tags`): its family, size,
//! quantization and metadata, read once from its file, its capabilities, and ollama's
//! time format.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use minfer_gguf::{GgufFile, MetaValue};
use serde_json::{json, Map, Value};

/// Metadata arrays longer than this (the vocabulary, the merges) are reported as
/// `null` in `/api/show`'s `model_info`, as ollama does without `verbose`.
pub const MAX_INFO_ARRAY: usize = 64;

/// A model as ollama's listing routes describe it, read once when it loads (or when
/// `/api/tags` lists a model that is not loaded).
#[derive(Debug, Clone)]
pub struct ModelFacts {
    pub(super) path: String,
    pub(super) size: u64,
    pub(super) modified_at: String,
    pub(super) digest: String,
    pub(super) family: String,
    pub(super) parameter_count: u64,
    pub(super) quantization: String,
    pub(super) model_info: Map<String, Value>,
}

impl ModelFacts {
    /// Reads the size, time, identity digest and metadata of the model at `path`.
    pub fn new(path: &Path, gguf: &GgufFile) -> Self {
        let meta = std::fs::metadata(path).ok();
        let modified = meta.as_ref().and_then(|m| m.modified().ok());
        let family = gguf.architecture().unwrap_or("unknown").to_string();
        let parameter_count: u64 = gguf.tensors().iter().map(|t| t.n_elements()).sum();
        let digest = minfer_runtime::digest::model_digest(gguf)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut model_info = Map::new();
        for (k, v) in gguf.metadata() {
            model_info.insert(k.clone(), meta_json(v));
        }
        model_info
            .entry("general.parameter_count")
            .or_insert(json!(parameter_count));
        let quantization = gguf
            .get("general.file_type")
            .and_then(MetaValue::as_u64)
            .map_or("unknown", file_type_name)
            .to_string();
        ModelFacts {
            path: path.display().to_string(),
            size: meta.map_or(0, |m| m.len()),
            modified_at: rfc3339(modified.unwrap_or(UNIX_EPOCH)),
            digest,
            family,
            parameter_count,
            quantization,
            model_info,
        }
    }

    pub(super) fn details(&self) -> Value {
        json!({
            "parent_model": "",
            "format": "gguf",
            "family": self.family,
            "families": [self.family],
            "parameter_size": parameter_size(self.parameter_count),
            "quantization_level": self.quantization,
        })
    }
}

/// A metadata value as JSON; long arrays are `null` (see [`MAX_INFO_ARRAY`]).
pub(super) fn meta_json(v: &MetaValue) -> Value {
    match v {
        MetaValue::Array(_, items) if items.len() > MAX_INFO_ARRAY => Value::Null,
        MetaValue::Array(_, items) => items.iter().map(meta_json).collect(),
        MetaValue::String(s) => json!(s),
        MetaValue::Bool(b) => json!(b),
        MetaValue::F32(x) => json!(x),
        MetaValue::F64(x) => json!(x),
        other => other
            .as_i64()
            .map(|x| json!(x))
            .or_else(|| other.as_u64().map(|x| json!(x)))
            .unwrap_or(Value::Null),
    }
}

/// llama.cpp's `general.file_type` names, as ollama's `quantization_level` shows them.
pub(super) fn file_type_name(t: u64) -> &'static str {
    match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => "unknown",
    }
}

/// ollama's `parameter_size`: `494.03M`, `7.6B`.
pub(super) fn parameter_size(n: u64) -> String {
    let x = n as f64;
    if x >= 1e9 {
        format!("{:.1}B", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.2}K", x / 1e3)
    } else {
        n.to_string()
    }
}

/// A time as RFC 3339 in UTC with nanoseconds, as ollama writes `created_at`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// ollama's name for the served model: `id:latest` unless the id has a tag.
pub(crate) fn tag_name(id: &str) -> String {
    if id.contains(':') {
        id.to_string()
    } else {
        format!("{id}:latest")
    }
}

/// What `/api/show` says the model can do, in ollama's words: an encoder only embeds;
/// a generative model completes, takes `tools` and thinks where its chat template
/// renders tools and a reasoning block (clients such as agent front ends check these
/// before they send tools or `think`), and fills in the middle where it has the tokens.
pub(crate) fn capabilities(m: &crate::models::Model, template: &str) -> Vec<&'static str> {
    if m.encoder {
        return vec!["embedding"];
    }
    let mut out = vec!["completion"];
    // A template that renders the request's tools reads the variable `tools`.
    if template.contains("tools") {
        out.push("tools");
    }
    if crate::api::llama::has_fim(m) {
        out.push("insert");
    }
    // `<think>` blocks (Qwen3, Qwen3.5) or harmony's analysis channel (gpt-oss).
    if ["<think>", "enable_thinking", "<|channel|>"]
        .iter()
        .any(|t| template.contains(t))
    {
        out.push("thinking");
    }
    out
}

/// Whether `/api/show` lists `thinking` among `m`'s capabilities: what `think: true`
/// needs, as ollama checks it.
pub(super) fn thinks(m: &crate::models::Model) -> bool {
    let template = m.template.source();
    capabilities(m, template).contains(&"thinking")
}
