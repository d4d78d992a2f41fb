//! Hyperparameters shared by the decoder-only architectures, read from `{arch}.*` keys.
//!
//! Defaults follow what llama.cpp assumes when a key is absent, so a file both engines
//! accept means the same model to both: `head_count_kv` defaults to `head_count`,
//! `key_length` to `embedding_length / head_count`, `rope.freq_base` to 10000.

use minfer_gguf::GgufFile;
use minfer_graph::{RopeStyle, Yarn};

use crate::error::ModelError;

/// Default rope theta when `{arch}.rope.freq_base` is absent.
pub const DEFAULT_ROPE_FREQ_BASE: f32 = 10000.0;

/// The hyperparameters a graph builder needs.
#[derive(Debug, Clone, PartialEq)]
pub struct HParams {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Residual stream width.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention).
    pub n_head_kv: usize,
    /// Head dimension (`attention.key_length`); Qwen3 decouples it from `n_embd / n_head`.
    pub head_dim: usize,
    /// FFN width.
    pub n_ff: usize,
    /// Rows of the token embedding (and of the logits).
    pub n_vocab: usize,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Rope theta.
    pub rope_freq_base: f32,
    /// Linear position scale (`1 / rope.scaling.factor`, 1 without scaling).
    pub rope_freq_scale: f32,
    /// YaRN terms (`rope.scaling.type` `yarn`), applied by every rope of the model.
    pub rope_yarn: Option<Yarn>,
    /// Rope pairing of the architecture.
    pub rope_style: RopeStyle,
    /// The routed experts of a mixture-of-experts architecture; `None` for a dense one.
    pub moe: Option<MoeParams>,
}

/// A mixture-of-experts architecture's expert geometry, from `{arch}.expert_*` keys.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeParams {
    /// Experts per layer (`expert_count`).
    pub n_expert: usize,
    /// Experts each token uses (`expert_used_count`), `1..=n_expert`.
    pub n_expert_used: usize,
    /// Width of one expert's FFN (`expert_feed_forward_length`; absent, llama.cpp takes
    /// `feed_forward_length / expert_used_count`).
    pub n_ff_exp: usize,
    /// Width of the shared expert's FFN (`expert_shared_feed_forward_length`; absent,
    /// `feed_forward_length`), for the architectures that have one.
    pub n_ff_shexp: usize,
}

impl MoeParams {
    /// Reads the expert keys of `arch` (`hp` gives the defaults' `feed_forward_length`);
    /// an absent or zero count, or more experts used than exist, is an error naming the key.
    pub(crate) fn read(file: &GgufFile, arch: &str, hp: &HParams) -> Result<Self, ModelError> {
        let key = |name: &str| format!("{arch}.{name}");
        let opt = |name: &str| -> Result<Option<usize>, ModelError> {
            let k = key(name);
            match file.get(&k) {
                None => Ok(None),
                Some(_) => positive(&k, file.get_u32(&k)? as usize).map(Some),
            }
        };
        let n_expert = positive(
            &key("expert_count"),
            file.get_u32(&key("expert_count"))? as usize,
        )?;
        let used_key = key("expert_used_count");
        let n_expert_used = positive(&used_key, file.get_u32(&used_key)? as usize)?;
        if n_expert_used > n_expert {
            return Err(bad(
                &used_key,
                n_expert_used,
                format!("exceeds expert_count = {n_expert}"),
            ));
        }
        let n_ff_exp = match opt("expert_feed_forward_length")? {
            Some(n) => n,
            None => positive(&key("expert_feed_forward_length"), hp.n_ff / n_expert_used)?,
        };
        let n_ff_shexp = opt("expert_shared_feed_forward_length")?.unwrap_or(hp.n_ff);
        Ok(MoeParams {
            n_expert,
            n_expert_used,
            n_ff_exp,
            n_ff_shexp,
        })
    }
}

impl HParams {
    /// Width of the query projection: `n_head * head_dim`.
    pub fn n_q_embd(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of one K (or V) row: `n_head_kv * head_dim`.
    pub fn n_kv_embd(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Reads the shared keys of `arch`; `n_vocab` comes from the embedding table.
    pub(crate) fn read(
        file: &GgufFile,
        arch: &str,
        rope_style: RopeStyle,
    ) -> Result<Self, ModelError> {
        let key = |name: &str| format!("{arch}.{name}");
        let req = |name: &str| -> Result<usize, ModelError> {
            let k = key(name);
            let v = file.get_u32(&k)? as usize;
            positive(&k, v)
        };
        let opt = |name: &str| -> Result<Option<usize>, ModelError> {
            let k = key(name);
            match file.get(&k) {
                None => Ok(None),
                Some(_) => positive(&k, file.get_u32(&k)? as usize).map(Some),
            }
        };

        let n_layer = req("block_count")?;
        let n_embd = req("embedding_length")?;
        let n_vocab = crate::tensors::vocab_rows(file, n_embd)?;
        let n_ff = req("feed_forward_length")?;
        let n_head = req("attention.head_count")?;
        let n_ctx_train = req("context_length")?;
        let n_head_kv = opt("attention.head_count_kv")?.unwrap_or(n_head);
        if n_head % n_head_kv != 0 {
            return Err(bad(
                &key("attention.head_count_kv"),
                n_head_kv,
                format!("must divide attention.head_count = {n_head}"),
            ));
        }
        let head_dim = match opt("attention.key_length")? {
            Some(d) => d,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => {
                return Err(bad(
                    &key("attention.head_count"),
                    n_head,
                    format!(
                        "does not divide embedding_length = {n_embd} and attention.key_length is absent"
                    ),
                ))
            }
        };
        if head_dim % 2 != 0 {
            return Err(bad(
                &key("attention.key_length"),
                head_dim,
                "rope needs an even head dimension".into(),
            ));
        }
        if let Some(v) = opt("attention.value_length")? {
            if v != head_dim {
                return Err(bad(
                    &key("attention.value_length"),
                    v,
                    format!("must equal the key length {head_dim}"),
                ));
            }
        }
        if let Some(v) = opt("vocab_size")? {
            if v != n_vocab {
                return Err(bad(
                    &key("vocab_size"),
                    v,
                    format!("token_embd.weight has {n_vocab} rows"),
                ));
            }
        }

        let eps_key = key("attention.layer_norm_rms_epsilon");
        let rms_eps = file.get_f32(&eps_key)?;
        if !(rms_eps.is_finite() && rms_eps > 0.0) {
            return Err(bad(&eps_key, rms_eps, "must be a positive number".into()));
        }
        let (rope_freq_base, rope_freq_scale, rope_yarn) = read_rope(file, arch, n_ctx_train)?;

        Ok(HParams {
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_vocab,
            n_ctx_train,
            rms_eps,
            rope_freq_base,
            rope_freq_scale,
            rope_yarn,
            rope_style,
            moe: None,
        })
    }
}

/// The rope terms of `arch` as llama.cpp reads them: `rope.freq_base` (default
/// [`DEFAULT_ROPE_FREQ_BASE`]), the linear position scale and, for a `yarn` file, its
/// YaRN terms (`n_ctx_train` is the default original context).
pub(crate) fn read_rope(
    file: &GgufFile,
    arch: &str,
    n_ctx_train: usize,
) -> Result<(f32, f32, Option<Yarn>), ModelError> {
    let base_key = format!("{arch}.rope.freq_base");
    let base = match file.get(&base_key) {
        None => DEFAULT_ROPE_FREQ_BASE,
        Some(_) => file.get_f32(&base_key)?,
    };
    if !(base.is_finite() && base > 0.0) {
        return Err(bad(&base_key, base, "must be a positive number".into()));
    }
    let (scale, yarn) = read_rope_scale(file, arch)?;
    let yarn = if yarn {
        Some(read_yarn(file, arch, scale, n_ctx_train)?)
    } else {
        None
    };
    Ok((base, scale, yarn))
}

/// `1 / factor` from `rope.scaling.factor` (or the older `rope.scale_linear`), as llama.cpp
/// reads it, and whether the scaling is YaRN; scaling type `none` means no scaling.
/// Types that need more (longrope) are refused: the graph has no term for them.
fn read_rope_scale(file: &GgufFile, arch: &str) -> Result<(f32, bool), ModelError> {
    let type_key = format!("{arch}.rope.scaling.type");
    let ty = match file.get(&type_key) {
        None => "linear",
        Some(_) => file.get_str(&type_key)?,
    };
    let yarn = match ty {
        "none" => return Ok((1.0, false)),
        "linear" => false,
        "yarn" => true,
        other => {
            return Err(bad(
                &type_key,
                other,
                "only linear and yarn rope scaling are supported".into(),
            ))
        }
    };
    let mut factor = 0.0;
    for name in ["rope.scaling.factor", "rope.scale_linear"] {
        let k = format!("{arch}.{name}");
        if file.get(&k).is_some() {
            factor = file.get_f32(&k)?;
            if !(factor.is_finite() && factor >= 0.0) {
                return Err(bad(&k, factor, "must be a non-negative number".into()));
            }
            break;
        }
    }
    Ok((if factor == 0.0 { 1.0 } else { 1.0 / factor }, yarn))
}

/// The YaRN terms as llama.cpp derives them for a `yarn` file: the extrapolation weight 1,
/// ramp bounds 32 and 1 rotations, the original context from
/// `rope.scaling.original_context_length` (else the training context), and a magnitude
/// whose `attn_factor` cancels the kernel's `1 + 0.1 ln(factor)` against its own
/// `0.1 ln(factor) + 1` (so exactly 1 when the factor exceeds 1) times
/// `rope.scaling.attn_factor` (default 1).
fn read_yarn(
    file: &GgufFile,
    arch: &str,
    freq_scale: f32,
    n_ctx_train: usize,
) -> Result<Yarn, ModelError> {
    let orig_key = format!("{arch}.rope.scaling.original_context_length");
    let n_ctx_orig = match file.get(&orig_key) {
        None => n_ctx_train,
        Some(_) => positive(&orig_key, file.get_u32(&orig_key)? as usize)?,
    };
    let attn_key = format!("{arch}.rope.scaling.attn_factor");
    let rope_attn_factor = match file.get(&attn_key) {
        None => 1.0,
        Some(_) => file.get_f32(&attn_key)?,
    };
    if !(rope_attn_factor.is_finite() && rope_attn_factor > 0.0) {
        return Err(bad(
            &attn_key,
            rope_attn_factor,
            "must be a positive number".into(),
        ));
    }
    let factor = 1.0 / freq_scale;
    let mscale = if factor <= 1.0 {
        1.0
    } else {
        0.1 * factor.ln() + 1.0
    };
    Ok(Yarn {
        ext_factor: 1.0,
        // In llama.cpp's order of f32 operations: times the reciprocal, then the key.
        attn_factor: mscale * (1.0 / (1.0 + 0.1 * factor.ln())) * rope_attn_factor,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig,
    })
}

fn positive(key: &str, v: usize) -> Result<usize, ModelError> {
    if v == 0 {
        return Err(bad(key, v, "must be at least 1".into()));
    }
    Ok(v)
}

fn bad(key: &str, value: impl std::fmt::Display, reason: String) -> ModelError {
    ModelError::BadHparam {
        key: key.to_string(),
        value: value.to_string(),
        reason,
    }
}
