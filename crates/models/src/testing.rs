//! Tiny random-weight models for tests, written with the project's own GGUF writer
//! (the decoders here, the BERT-family encoders with their WordPiece vocabulary in `bert`).
//!
//! The files are complete enough for llama.cpp to load: every `{arch}.*` key it reads,
//! and a byte-level BPE vocabulary (`tokenizer.ggml.model` "gpt2", pre "qwen2", or
//! "llama-bpe" for the `llama` architecture) whose
//! tokens are the 256 byte symbols, two-letter filler tokens with their merges, then
//! `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` as control tokens at the end.
//!
//! Weights come from a fixed PRNG using only correctly rounded IEEE operations (adds,
//! multiplies, `sqrt`), so the same [`TinySpec`] gives the same bytes on every platform
//! — which is what lets golden outputs be committed for files regenerated in CI.
//! Matrices are normal with std `1/sqrt(fan_in)` so activations stay O(1); norm scales
//! are `1 + 0.1·N(0, 1)`, biases `0.1·N(0, 1)`. The embedding has std 0.1 so that a tied lm head does not just
//! echo the last input token, and the output norm is scaled by [`TINY_OUTPUT_GAIN`] to
//! spread the logits, so greedy picks are rarely near-ties that float noise could flip.

use std::path::Path;

use minfer_gguf::{GgmlType, GgufError, GgufWriter, MetaValue};
use minfer_testkit::SplitMix64;

use crate::weights::{blk, blk_bias, OUTPUT, OUTPUT_NORM, ROPE_FREQS, TOKEN_EMBD};

mod bert;
mod layers;
mod meta;
mod specs;
pub use specs::{golden_models, quant_mix_models};

use layers::{gpt_oss_layer, hybrid_layer, moe_tensors};
use meta::{metadata, tokenizer};

pub use bert::{
    bert_models, bert_reranker, bert_vocab, nomic_models, tiny_bert_bytes, tiny_bert_writer,
    write_tiny_bert, TinyBert, BERT_SEED, BERT_SPECIALS, NOMIC_SEED, TINY_BERT_EPS,
    TINY_NOMIC_ROPE_BASE,
};

/// Control tokens appended at the end of the vocabulary, in this order.
pub const CONTROL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Rope theta written into tiny models.
pub const TINY_ROPE_FREQ_BASE: f32 = 10000.0;

/// Scale of the final norm, which sets the spread of the logits (std about this value).
pub const TINY_OUTPUT_GAIN: f64 = 4.0;

/// Standard deviation of the embedding table.
const EMBD_STD: f64 = 0.1;

/// RMSNorm epsilon written into tiny models.
pub const TINY_RMS_EPS: f32 = 1e-6;

/// Global rope theta of the tiny Gemma 3 models (the local layers keep llama.cpp's
/// default 10000, so the two differ).
pub const TINY_GEMMA3_ROPE_BASE: f32 = 1_000_000.0;

/// Linear rope scaling factor of the tiny Gemma 3 models (global layers only, as
/// llama.cpp applies it).
pub const TINY_GEMMA3_ROPE_FACTOR: f32 = 2.0;

/// Attention-score soft-cap of the tiny Gemma 2 models: low enough to bend their O(1)
/// scores (the real models' 50 would leave them untouched).
pub const TINY_GEMMA2_ATTN_CAP: f32 = 2.0;

/// Final-logit soft-cap of the tiny Gemma 2 models, within their logit spread.
pub const TINY_GEMMA2_FINAL_CAP: f32 = 8.0;

/// Rope theta of the tiny gpt-oss models (the published files' value).
pub const TINY_GPT_OSS_ROPE_BASE: f32 = 150_000.0;

/// YaRN factor and original context of the tiny gpt-oss models (the published files'
/// values; with a 32-dim head the YaRN ramp then falls inside the rotated pairs).
pub const TINY_GPT_OSS_YARN: (f32, u32) = (32.0, 4096);

/// Geometry, storage type and seed of a tiny model.
#[derive(Debug, Clone, PartialEq)]
pub struct TinySpec {
    /// `"qwen2"`, `"qwen3"`, `"qwen2moe"`, `"qwen3moe"`, `"qwen35"`, `"qwen35moe"`,
    /// `"qwen3next"`, `"llama"`, `"gemma2"`, `"gemma3"` or `"gpt-oss"`.
    pub arch: &'static str,
    /// Blocks.
    pub n_layer: usize,
    /// Residual width.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Head dimension (Qwen2 requires `n_embd / n_head`).
    pub head_dim: usize,
    /// FFN width.
    pub n_ff: usize,
    /// Vocabulary size (at least 259: bytes plus the control tokens).
    pub n_vocab: usize,
    /// `context_length`.
    pub n_ctx: usize,
    /// Type of the matrices (norms and biases stay F32; for `gpt-oss` only the stacked
    /// experts, see [`TinySpec::dense_wtype`]); their input widths must be whole blocks
    /// of it.
    pub wtype: GgmlType,
    /// Omit `output.weight` so the lm head is the embedding.
    pub tied: bool,
    /// Write `rope_freqs.weight` ([`tiny_rope_freqs`], Llama 3 scaling; `llama` only).
    pub rope_freqs: bool,
    /// `attention.sliding_window` (Gemma and gpt-oss only; the layer pattern is
    /// llama.cpp's default for the architecture).
    pub sliding_window: Option<usize>,
    /// Routed experts (`qwen2moe`, `qwen3moe`, `qwen35moe`, `qwen3next`, `gpt-oss` only;
    /// their FFN is the experts).
    pub moe: Option<TinyMoe>,
    /// Gated DeltaNet layers (`qwen35`, `qwen35moe`, `qwen3next` only).
    pub ssm: Option<TinySsm>,
    /// PRNG seed.
    pub seed: u64,
}

/// The expert geometry of a tiny mixture-of-experts model.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyMoe {
    /// `expert_count`.
    pub n_expert: usize,
    /// `expert_used_count`.
    pub n_expert_used: usize,
    /// `expert_feed_forward_length` (whole blocks of the weight type).
    pub n_ff_exp: usize,
    /// `expert_shared_feed_forward_length` (`qwen2moe` only).
    pub n_ff_shexp: usize,
}

/// The recurrent geometry of a tiny hybrid (`qwen35`) model.
#[derive(Debug, Clone, PartialEq)]
pub struct TinySsm {
    /// `ssm.conv_kernel`.
    pub d_conv: usize,
    /// `ssm.state_size` (key and value head size).
    pub s: usize,
    /// `ssm.group_count` (key heads).
    pub h_k: usize,
    /// `ssm.time_step_rank` (value heads).
    pub h_v: usize,
    /// `full_attention_interval`: every this-th layer is full attention.
    pub interval: usize,
    /// `rope.dimension_count` (rotated dims of the full layers' heads).
    pub n_rot: usize,
    /// `rope.dimension_sections`, covering the `n_rot / 2` pairs.
    pub sections: [i32; 4],
}

impl TinySsm {
    /// Convolved channels (q, k and v heads).
    pub fn channels(&self) -> usize {
        2 * self.h_k * self.s + self.h_v * self.s
    }

    /// Whether layer `il` is recurrent.
    pub fn recurrent(&self, il: usize) -> bool {
        !(il + 1).is_multiple_of(self.interval)
    }
}

impl TinySpec {
    /// The type of the matrices outside the stacked experts: F32 for `gpt-oss`, whose
    /// published files quantize the experts (to MXFP4) and keep the rest wider; `wtype`
    /// for every other architecture.
    pub fn dense_wtype(&self) -> GgmlType {
        if self.arch == "gpt-oss" {
            GgmlType::F32
        } else {
            self.wtype
        }
    }
}

/// The Llama 3 shaped frequency factors of a tiny model with `n_pairs` rope pairs: 1 for
/// the fastest quarter, 8 from the middle on, linear in between (llama.cpp's converter
/// derives real ones from wavelengths; this table keeps to correctly rounded operations
/// and turns visibly slower angles at the short positions the tests use).
pub fn tiny_rope_freqs(n_pairs: usize) -> Vec<f32> {
    let (lo, hi) = (n_pairs / 4, n_pairs / 2);
    (0..n_pairs)
        .map(|i| match i {
            i if i < lo => 1.0,
            i if i >= hi => 8.0,
            i => (1.0 + 7.0 * (i - lo) as f64 / (hi - lo) as f64) as f32,
        })
        .collect()
}

/// Writes the model `spec` describes to `path` (atomically, via the GGUF writer).
pub fn write_tiny_model(path: &Path, spec: &TinySpec) -> Result<(), GgufError> {
    tiny_model_writer(spec)?.write_to(path)
}

/// Writes the model `spec` describes with `template` as its `tokenizer.chat_template`
/// (for tests of template features: tool calls, a thinking switch).
pub fn write_tiny_model_with_template(
    path: &Path,
    spec: &TinySpec,
    template: &str,
) -> Result<(), GgufError> {
    let mut w = tiny_model_writer(spec)?;
    w.add_meta(
        "tokenizer.chat_template",
        MetaValue::String(template.to_string()),
    );
    w.write_to(path)
}

/// The file `spec` describes, as bytes.
pub fn tiny_model_bytes(spec: &TinySpec) -> Result<Vec<u8>, GgufError> {
    tiny_model_writer(spec)?.to_bytes()
}

/// The writer holding the model `spec` describes (tests add or change keys before
/// writing).
pub(crate) fn tiny_model_writer(spec: &TinySpec) -> Result<GgufWriter, GgufError> {
    let mut w = GgufWriter::new();
    metadata(&mut w, spec)?;
    let pre = if spec.arch == "llama" {
        "llama-bpe"
    } else {
        "qwen2"
    };
    tokenizer(&mut w, spec.n_vocab, pre)?;
    let mut rng = SplitMix64::new(spec.seed);
    let (ne, nq, nkv, nf) = (
        spec.n_embd,
        spec.n_head * spec.head_dim,
        spec.n_head_kv * spec.head_dim,
        spec.n_ff,
    );
    let embd = rng.normal_vec(ne * spec.n_vocab, EMBD_STD);
    w.add_tensor_f32(
        TOKEN_EMBD,
        &[ne as u64, spec.n_vocab as u64],
        spec.dense_wtype(),
        &embd,
    )?;
    for il in 0..spec.n_layer {
        if let Some(ssm) = &spec.ssm {
            hybrid_layer(&mut w, &mut rng, spec, ssm, il)?;
            continue;
        }
        if spec.arch == "gpt-oss" {
            gpt_oss_layer(&mut w, &mut rng, spec, il)?;
            continue;
        }
        let mut mat = |w: &mut GgufWriter, name: String, i: usize, o: usize| {
            let v = rng.normal_vec(i * o, 1.0 / (i as f64).sqrt());
            w.add_tensor_f32(&name, &[i as u64, o as u64], spec.wtype, &v)
                .map(|_| ())
        };
        mat(&mut w, blk(il, "attn_q"), ne, nq)?;
        mat(&mut w, blk(il, "attn_k"), ne, nkv)?;
        mat(&mut w, blk(il, "attn_v"), ne, nkv)?;
        mat(&mut w, blk(il, "attn_output"), nq, ne)?;
        match &spec.moe {
            None => {
                mat(&mut w, blk(il, "ffn_gate"), ne, nf)?;
                mat(&mut w, blk(il, "ffn_up"), ne, nf)?;
                mat(&mut w, blk(il, "ffn_down"), nf, ne)?;
            }
            Some(m) => moe_tensors(&mut w, &mut rng, spec, m, il)?,
        }
        let mut vec = |w: &mut GgufWriter, name: String, n: usize, center: f64| {
            let v: Vec<f32> = rng
                .normal_vec(n, 0.1)
                .into_iter()
                .map(|x| (center + f64::from(x)) as f32)
                .collect();
            w.add_tensor_f32(&name, &[n as u64], GgmlType::F32, &v)
                .map(|_| ())
        };
        vec(&mut w, blk(il, "attn_norm"), ne, 1.0)?;
        vec(&mut w, blk(il, "ffn_norm"), ne, 1.0)?;
        if matches!(spec.arch, "qwen3" | "qwen3moe" | "gemma3") {
            vec(&mut w, blk(il, "attn_q_norm"), spec.head_dim, 1.0)?;
            vec(&mut w, blk(il, "attn_k_norm"), spec.head_dim, 1.0)?;
        }
        if spec.arch.starts_with("gemma") {
            vec(&mut w, blk(il, "post_attention_norm"), ne, 1.0)?;
            vec(&mut w, blk(il, "post_ffw_norm"), ne, 1.0)?;
        } else if spec.arch == "qwen2" || spec.arch == "qwen2moe" {
            vec(&mut w, blk_bias(il, "attn_q"), nq, 0.0)?;
            vec(&mut w, blk_bias(il, "attn_k"), nkv, 0.0)?;
            vec(&mut w, blk_bias(il, "attn_v"), nkv, 0.0)?;
        }
    }
    let norm: Vec<f32> = rng
        .normal_vec(ne, 0.1)
        .into_iter()
        .map(|x| ((1.0 + f64::from(x)) * TINY_OUTPUT_GAIN) as f32)
        .collect();
    w.add_tensor_f32(OUTPUT_NORM, &[ne as u64], GgmlType::F32, &norm)?;
    if spec.rope_freqs {
        let n_pairs = spec.head_dim / 2;
        let f = tiny_rope_freqs(n_pairs);
        w.add_tensor_f32(ROPE_FREQS, &[n_pairs as u64], GgmlType::F32, &f)?;
    }
    if !spec.tied {
        // The same logit spread as a tied head over the embedding would give.
        let out = rng.normal_vec(ne * spec.n_vocab, EMBD_STD);
        w.add_tensor_f32(
            OUTPUT,
            &[ne as u64, spec.n_vocab as u64],
            spec.dense_wtype(),
            &out,
        )?;
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_vocab_below_the_fixed_tokens_is_refused() {
        let spec = TinySpec {
            n_vocab: 200,
            ..TinySpec::qwen2(GgmlType::F32, 1)
        };
        let e = tiny_model_bytes(&spec).unwrap_err().to_string();
        assert!(e.contains("n_vocab 200"), "{e}");
    }
}
