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

use minfer_gguf::{GgmlType, GgufError, GgufWriter, MetaType, MetaValue};
use minfer_testkit::SplitMix64;

use crate::weights::{blk, blk_bias, OUTPUT, OUTPUT_NORM, ROPE_FREQS, TOKEN_EMBD};

mod bert;
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
    /// A small Qwen2: 2 layers, width 128, 4 heads over 2 KV heads, untied head.
    pub fn qwen2(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            arch: "qwen2",
            n_layer: 2,
            n_embd: 128,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 32,
            n_ff: 256,
            n_vocab: 512,
            n_ctx: 256,
            wtype,
            tied: false,
            rope_freqs: false,
            sliding_window: None,
            moe: None,
            ssm: None,
            seed,
        }
    }

    /// A small Llama: 2 layers, width 128, 4 heads of 32 over 2 KV heads, untied head,
    /// normal-layout rope without frequency factors.
    pub fn llama(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            arch: "llama",
            ..Self::qwen2(wtype, seed)
        }
    }

    /// A Llama whose every matrix row is a whole k-quant super-block (256): width 256,
    /// 8 heads of 32 over 2 KV heads, tied head, Llama 3 frequency factors.
    pub fn llama3_kquant(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            n_embd: 256,
            n_head: 8,
            n_head_kv: 2,
            head_dim: 32,
            tied: true,
            rope_freqs: true,
            ..Self::llama(wtype, seed)
        }
    }

    /// A small Qwen3 with a decoupled head dim (64 vs 128/4): 2 layers, tied head.
    pub fn qwen3(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            arch: "qwen3",
            n_layer: 2,
            n_embd: 128,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_ff: 256,
            n_vocab: 512,
            n_ctx: 256,
            wtype,
            tied: true,
            rope_freqs: false,
            sliding_window: None,
            moe: None,
            ssm: None,
            seed,
        }
    }

    /// A Qwen3 whose every matrix row is a whole k-quant super-block (256): width 256,
    /// 8 heads of 64 (decoupled: 256/8 = 32) over 2 KV heads, 2 layers, tied head.
    pub fn qwen3_kquant(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            n_embd: 256,
            n_head: 8,
            n_head_kv: 2,
            head_dim: 64,
            ..Self::qwen3(wtype, seed)
        }
    }

    /// A small Qwen3-MoE with Qwen3's attention: 8 experts of width 32, 2 used per
    /// token, tied head.
    pub fn qwen3moe(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            arch: "qwen3moe",
            moe: Some(TinyMoe {
                n_expert: 8,
                n_expert_used: 2,
                n_ff_exp: 32,
                n_ff_shexp: 0,
            }),
            ..Self::qwen3(wtype, seed)
        }
    }

    /// A Qwen3-MoE whose every matrix row is a whole k-quant super-block (256): width
    /// 256, 4 experts of width 256 (fewer, to keep the file small), 2 used.
    pub fn qwen3moe_kquant(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            moe: Some(TinyMoe {
                n_expert: 4,
                n_expert_used: 2,
                n_ff_exp: 256,
                n_ff_shexp: 0,
            }),
            ..Self::qwen3moe(wtype, seed).kquant_attention()
        }
    }

    /// A small Qwen2-MoE with Qwen2's attention: 8 experts of width 32, 2 used per
    /// token, a shared expert of width 64, untied head (the architecture requires it).
    pub fn qwen2moe(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            arch: "qwen2moe",
            moe: Some(TinyMoe {
                n_expert: 8,
                n_expert_used: 2,
                n_ff_exp: 32,
                n_ff_shexp: 64,
            }),
            ..Self::qwen2(wtype, seed)
        }
    }

    /// A Qwen2-MoE whose every matrix row is a whole k-quant super-block (256): width
    /// 256, 8 heads of 32, 4 experts (2 used) and a shared expert, all of width 256.
    pub fn qwen2moe_kquant(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            n_embd: 256,
            n_head: 8,
            head_dim: 32,
            moe: Some(TinyMoe {
                n_expert: 4,
                n_expert_used: 2,
                n_ff_exp: 256,
                n_ff_shexp: 256,
            }),
            ..Self::qwen2moe(wtype, seed)
        }
    }

    /// The same spec with Qwen3's k-quant attention geometry (width 256, 8 heads of 64
    /// over 2 KV heads).
    fn kquant_attention(self) -> Self {
        TinySpec {
            n_embd: 256,
            n_head: 8,
            n_head_kv: 2,
            head_dim: 64,
            ..self
        }
    }

    /// A small Qwen3.5: 6 layers, every third full attention (4 Gated DeltaNet layers of
    /// 2 key and 4 value heads of 16, conv width 4; 2 full layers of 4 heads of 32 over 2
    /// KV heads, half of each head roped), width 64, tied head.
    pub fn qwen35(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            arch: "qwen35",
            n_layer: 6,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 32,
            n_ff: 128,
            ssm: Some(TinySsm {
                d_conv: 4,
                s: 16,
                h_k: 2,
                h_v: 4,
                interval: 3,
                n_rot: 16,
                sections: [3, 3, 2, 0],
            }),
            ..Self::qwen3(wtype, seed)
        }
    }

    /// A small Qwen3.5-MoE: Qwen3.5's geometry with 4 experts of width 32 (2 used per
    /// token) and a shared expert of width 64 in every layer.
    pub fn qwen35moe(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            arch: "qwen35moe",
            moe: Some(TinyMoe {
                n_expert: 4,
                n_expert_used: 2,
                n_ff_exp: 32,
                n_ff_shexp: 64,
            }),
            ..Self::qwen35(wtype, seed)
        }
    }

    /// A small Qwen3-Next: Qwen3.5-MoE's geometry with the joint `ssm_ba`
    /// projection (no rope sections).
    pub fn qwen3next(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            arch: "qwen3next",
            ..Self::qwen35moe(wtype, seed)
        }
    }

    /// A small Gemma 2: 4 layers (local and global alternating), width 64, 4 heads of
    /// 32 (decoupled from 64/4) over 2 KV heads, a window of 4 rows (shorter than the
    /// test prompt), tied head.
    pub fn gemma2(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            arch: "gemma2",
            n_layer: 4,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 32,
            n_ff: 128,
            n_vocab: 512,
            n_ctx: 256,
            wtype,
            tied: true,
            rope_freqs: false,
            sliding_window: Some(4),
            moe: None,
            ssm: None,
            seed,
        }
    }

    /// A small Gemma 3 with Gemma 2's geometry and 7 layers, so llama.cpp's default
    /// pattern (every sixth layer global) gives both kinds.
    pub fn gemma3(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            arch: "gemma3",
            n_layer: 7,
            ..Self::gemma2(wtype, seed)
        }
    }

    /// A Gemma 3 whose every matrix row is a whole k-quant super-block (256): width 256,
    /// 4 heads of 64 over 2 KV heads, FFN 256.
    pub fn gemma3_kquant(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            n_embd: 256,
            head_dim: 64,
            n_ff: 256,
            ..Self::gemma3(wtype, seed)
        }
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

    /// A small gpt-oss: 4 layers (local and global alternating, a window of 4 rows,
    /// shorter than the test prompt), width 64, 4 heads of 32 over 2 KV heads (so the
    /// query width differs from the residual's), 8 experts of width 32 with 4 used per
    /// token, untied head (the architecture requires one), YaRN rope as the published
    /// files have it.
    pub fn gpt_oss(wtype: GgmlType, seed: u64) -> Self {
        TinySpec {
            arch: "gpt-oss",
            n_layer: 4,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 32,
            n_ff: 32,
            n_vocab: 512,
            n_ctx: 256,
            wtype,
            tied: false,
            rope_freqs: false,
            sliding_window: Some(4),
            moe: Some(TinyMoe {
                n_expert: 8,
                n_expert_used: 4,
                n_ff_exp: 32,
                n_ff_shexp: 0,
            }),
            ssm: None,
            seed,
        }
    }
}

// Seeds picked among the first 150 for wide top-1 margins along the 32-token greedy path
// of every type in the family, preferring continuations that do not repeat one token.
const QWEN2_SEED: u64 = 75;
const QWEN3_SEED: u64 = 147;
const KQUANT_SEED: u64 = 57;
const LLAMA_SEED: u64 = 75;
const LLAMA3_SEED: u64 = 57;
// Gemma: picked among the first 60 by llama.cpp's F32 greedy path (widest smallest
// margin among continuations of several distinct tokens; the quantized variants share
// their family's seed unsearched).
const GEMMA2_SEED: u64 = 5;
const GEMMA3_SEED: u64 = 8;
// MoE: picked among the first 24 where every type of the family stays within its
// tolerance of llama.cpp along the teacher-forced path (a quantized variant's router can
// otherwise flip a near-tied expert choice against llama.cpp's), preferring greedy
// paths of many distinct tokens.
const QWEN3MOE_SEED: u64 = 13;
const QWEN2MOE_SEED: u64 = 20;
// Qwen3.5: the first seed tried. Only F32 is in the set: with Q8_0 matrices the f32
// reference kernels differ from llama.cpp's Q8_0-rounded activations by 0.28 of the logit
// std on this random model (the CPU backend, which rounds as llama.cpp does, matches it to
// 1e-5), past the Q8_0 tolerance.
const QWEN35_SEED: u64 = 1;
// gpt-oss: picked among seeds 2 to 13 as the one whose MXFP4 variant stays within its
// tolerance of llama.cpp along the teacher-forced path: choosing 4 of 8 experts, the
// router meets near-tied choices often, and llama.cpp's Q8_0-rounded expert activations
// flip them against the f32 reference kernels (the others miss by 0.15 to 1.1 of the
// logit std).
const GPT_OSS_SEED: u64 = 10;
// Qwen3.5-MoE: the first seed from 1 on whose F32 router choices along the
// teacher-forced path are not near-ties that the CPU backend's summation order flips
// against llama.cpp's (seed 1 flips one at the third decode step).
const QWEN35MOE_SEED: u64 = 2;

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

/// F32 models for checking `minfer quantize`'s per-tensor types against llama-quantize's
/// (`crates/cli/tests/golden/quant_mix.json`): 8 layers, so the rules that pick the first
/// eighth or every third layer pick some; 4 query heads per KV head with whole k-quant
/// rows and a tied head; rows of 128 (the 256-block types fall back); and 8 experts,
/// which the rules treat apart.
pub fn quant_mix_models() -> Vec<(&'static str, TinySpec)> {
    vec![
        (
            "mix-llama",
            TinySpec {
                n_layer: 8,
                ..TinySpec::llama3_kquant(GgmlType::F32, 71)
            },
        ),
        (
            "mix-qwen2",
            TinySpec {
                n_layer: 8,
                ..TinySpec::qwen2(GgmlType::F32, 72)
            },
        ),
        (
            "mix-qwen3moe",
            TinySpec {
                moe: Some(TinyMoe {
                    n_expert: 8,
                    n_expert_used: 2,
                    n_ff_exp: 256,
                    n_ff_shexp: 0,
                }),
                ..TinySpec::qwen3moe(GgmlType::F32, 73).kquant_attention()
            },
        ),
    ]
}

/// The committed golden set: file stem and spec. Golden outputs in `tests/golden/`
/// are keyed by the stem; regenerate them whenever this list changes.
pub fn golden_models() -> Vec<(&'static str, TinySpec)> {
    vec![
        ("qwen2-f32", TinySpec::qwen2(GgmlType::F32, QWEN2_SEED)),
        ("qwen2-q8_0", TinySpec::qwen2(GgmlType::Q8_0, QWEN2_SEED)),
        ("qwen3-f32", TinySpec::qwen3(GgmlType::F32, QWEN3_SEED)),
        ("qwen3-f16", TinySpec::qwen3(GgmlType::F16, QWEN3_SEED)),
        ("qwen3-q8_0", TinySpec::qwen3(GgmlType::Q8_0, QWEN3_SEED)),
        (
            "qwen3-q4_k",
            TinySpec::qwen3_kquant(GgmlType::Q4K, KQUANT_SEED),
        ),
        (
            "qwen3-q6_k",
            TinySpec::qwen3_kquant(GgmlType::Q6K, KQUANT_SEED),
        ),
        ("llama-f32", TinySpec::llama(GgmlType::F32, LLAMA_SEED)),
        (
            "llama-f16-tied",
            TinySpec {
                tied: true,
                ..TinySpec::llama(GgmlType::F16, LLAMA_SEED)
            },
        ),
        ("llama-q8_0", TinySpec::llama(GgmlType::Q8_0, LLAMA_SEED)),
        (
            "llama3-f32",
            TinySpec {
                rope_freqs: true,
                ..TinySpec::llama(GgmlType::F32, LLAMA_SEED)
            },
        ),
        (
            "llama3-q4_k",
            TinySpec::llama3_kquant(GgmlType::Q4K, LLAMA3_SEED),
        ),
        (
            "llama3-q6_k",
            TinySpec::llama3_kquant(GgmlType::Q6K, LLAMA3_SEED),
        ),
        // The i-quants, MXFP4 and the ternary types on the Qwen3 geometries: 32-element
        // blocks on the small one, 256-element super-blocks on the k-quant one.
        ("qwen3-iq4_nl", TinySpec::qwen3(GgmlType::Iq4Nl, QWEN3_SEED)),
        ("qwen3-mxfp4", TinySpec::qwen3(GgmlType::Mxfp4, QWEN3_SEED)),
        (
            "qwen3-iq4_xs",
            TinySpec::qwen3_kquant(GgmlType::Iq4Xs, KQUANT_SEED),
        ),
        (
            "qwen3-iq3_s",
            TinySpec::qwen3_kquant(GgmlType::Iq3S, KQUANT_SEED),
        ),
        (
            "qwen3-iq3_xxs",
            TinySpec::qwen3_kquant(GgmlType::Iq3Xxs, KQUANT_SEED),
        ),
        (
            "qwen3-iq2_s",
            TinySpec::qwen3_kquant(GgmlType::Iq2S, KQUANT_SEED),
        ),
        (
            "qwen3-iq2_xs",
            TinySpec::qwen3_kquant(GgmlType::Iq2Xs, KQUANT_SEED),
        ),
        (
            "qwen3-iq2_xxs",
            TinySpec::qwen3_kquant(GgmlType::Iq2Xxs, KQUANT_SEED),
        ),
        (
            "qwen3-iq1_m",
            TinySpec::qwen3_kquant(GgmlType::Iq1M, KQUANT_SEED),
        ),
        (
            "qwen3-iq1_s",
            TinySpec::qwen3_kquant(GgmlType::Iq1S, KQUANT_SEED),
        ),
        (
            "qwen3-tq2_0",
            TinySpec::qwen3_kquant(GgmlType::Tq2_0, KQUANT_SEED),
        ),
        (
            "qwen3-tq1_0",
            TinySpec::qwen3_kquant(GgmlType::Tq1_0, KQUANT_SEED),
        ),
        ("gemma2-f32", TinySpec::gemma2(GgmlType::F32, GEMMA2_SEED)),
        ("gemma3-f32", TinySpec::gemma3(GgmlType::F32, GEMMA3_SEED)),
        ("gemma3-q8_0", TinySpec::gemma3(GgmlType::Q8_0, GEMMA3_SEED)),
        (
            "gemma3-q4_k",
            TinySpec::gemma3_kquant(GgmlType::Q4K, GEMMA3_SEED),
        ),
        (
            "qwen3moe-f32",
            TinySpec::qwen3moe(GgmlType::F32, QWEN3MOE_SEED),
        ),
        (
            "qwen3moe-q8_0",
            TinySpec::qwen3moe(GgmlType::Q8_0, QWEN3MOE_SEED),
        ),
        (
            "qwen3moe-q4_k",
            TinySpec::qwen3moe_kquant(GgmlType::Q4K, QWEN3MOE_SEED),
        ),
        (
            "qwen2moe-f32",
            TinySpec::qwen2moe(GgmlType::F32, QWEN2MOE_SEED),
        ),
        (
            "qwen2moe-q8_0",
            TinySpec::qwen2moe(GgmlType::Q8_0, QWEN2MOE_SEED),
        ),
        (
            "qwen2moe-q4_k",
            TinySpec::qwen2moe_kquant(GgmlType::Q4K, QWEN2MOE_SEED),
        ),
        ("qwen35-f32", TinySpec::qwen35(GgmlType::F32, QWEN35_SEED)),
        (
            "qwen35moe-f32",
            TinySpec::qwen35moe(GgmlType::F32, QWEN35MOE_SEED),
        ),
        (
            "qwen3next-f32",
            TinySpec::qwen3next(GgmlType::F32, QWEN35MOE_SEED),
        ),
        (
            "gpt-oss-f32",
            TinySpec::gpt_oss(GgmlType::F32, GPT_OSS_SEED),
        ),
        (
            "gpt-oss-mxfp4",
            TinySpec::gpt_oss(GgmlType::Mxfp4, GPT_OSS_SEED),
        ),
    ]
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

/// Layer `il` of a hybrid (`qwen35`) model: a Gated DeltaNet or a gated full-attention
/// mixer, `attn_norm`, `post_attention_norm` and a SwiGLU FFN. The decay factors `ssm_a`
/// are `-(0.5 + x^2 / 2)` (negative, as `-exp(A_log)` is), computed with correctly rounded
/// operations only; the convolution weight is F32 whatever the matrices' type.
fn hybrid_layer(
    w: &mut GgufWriter,
    rng: &mut SplitMix64,
    spec: &TinySpec,
    ssm: &TinySsm,
    il: usize,
) -> Result<(), GgufError> {
    let (ne, nq, nkv, nf) = (
        spec.n_embd,
        spec.n_head * spec.head_dim,
        spec.n_head_kv * spec.head_dim,
        spec.n_ff,
    );
    let mat = |w: &mut GgufWriter, rng: &mut SplitMix64, name: &str, i: usize, o: usize| {
        let v = rng.normal_vec(i * o, 1.0 / (i as f64).sqrt());
        w.add_tensor_f32(name, &[i as u64, o as u64], spec.wtype, &v)
            .map(|_| ())
    };
    let vec = |w: &mut GgufWriter, rng: &mut SplitMix64, name: &str, n: usize, center: f64| {
        let v: Vec<f32> = rng
            .normal_vec(n, 0.1)
            .into_iter()
            .map(|x| (center + f64::from(x)) as f32)
            .collect();
        w.add_tensor_f32(name, &[n as u64], GgmlType::F32, &v)
            .map(|_| ())
    };
    if ssm.recurrent(il) {
        let (c, vd) = (ssm.channels(), ssm.h_v * ssm.s);
        mat(w, rng, &blk(il, "attn_qkv"), ne, c)?;
        mat(w, rng, &blk(il, "attn_gate"), ne, vd)?;
        let conv = rng.normal_vec(ssm.d_conv * c, 1.0 / (ssm.d_conv as f64).sqrt());
        w.add_tensor_f32(
            &blk(il, "ssm_conv1d"),
            &[ssm.d_conv as u64, c as u64],
            GgmlType::F32,
            &conv,
        )?;
        vec(w, rng, &blk_bias(il, "ssm_dt"), ssm.h_v, 0.0)?;
        let a: Vec<f32> = rng
            .normal_vec(ssm.h_v, 1.0)
            .into_iter()
            .map(|x| (-(0.5 + f64::from(x) * f64::from(x) * 0.5)) as f32)
            .collect();
        w.add_tensor_f32(
            &format!("blk.{il}.ssm_a"),
            &[ssm.h_v as u64],
            GgmlType::F32,
            &a,
        )?;
        if spec.arch == "qwen3next" {
            mat(w, rng, &blk(il, "ssm_ba"), ne, 2 * ssm.h_v)?;
        } else {
            mat(w, rng, &blk(il, "ssm_beta"), ne, ssm.h_v)?;
            mat(w, rng, &blk(il, "ssm_alpha"), ne, ssm.h_v)?;
        }
        vec(w, rng, &blk(il, "ssm_norm"), ssm.s, 1.0)?;
        mat(w, rng, &blk(il, "ssm_out"), vd, ne)?;
    } else {
        mat(w, rng, &blk(il, "attn_q"), ne, 2 * nq)?;
        mat(w, rng, &blk(il, "attn_k"), ne, nkv)?;
        mat(w, rng, &blk(il, "attn_v"), ne, nkv)?;
        mat(w, rng, &blk(il, "attn_output"), nq, ne)?;
        vec(w, rng, &blk(il, "attn_q_norm"), spec.head_dim, 1.0)?;
        vec(w, rng, &blk(il, "attn_k_norm"), spec.head_dim, 1.0)?;
    }
    match &spec.moe {
        None => {
            mat(w, rng, &blk(il, "ffn_gate"), ne, nf)?;
            mat(w, rng, &blk(il, "ffn_up"), ne, nf)?;
            mat(w, rng, &blk(il, "ffn_down"), nf, ne)?;
        }
        Some(m) => moe_tensors(w, rng, spec, m, il)?,
    }
    vec(w, rng, &blk(il, "attn_norm"), ne, 1.0)?;
    vec(w, rng, &blk(il, "post_attention_norm"), ne, 1.0)?;
    Ok(())
}

/// Layer `il` of a gpt-oss model: biased q/k/v/output, attention sinks of std 1 (the
/// scores' order, so each takes a visible share of its softmax), `attn_norm`,
/// `post_attention_norm`, a biased router and biased experts. The experts' gate and up
/// weights have std `4/sqrt(n_embd)`, so some of their products pass the clamped
/// SwiGLU's limit of 7.
fn gpt_oss_layer(
    w: &mut GgufWriter,
    rng: &mut SplitMix64,
    spec: &TinySpec,
    il: usize,
) -> Result<(), GgufError> {
    let (ne, nq, nkv) = (
        spec.n_embd,
        spec.n_head * spec.head_dim,
        spec.n_head_kv * spec.head_dim,
    );
    let Some(m) = &spec.moe else {
        return Err(GgufError::InvalidMeta {
            key: "gpt-oss.expert_count".into(),
            reason: "a gpt-oss model needs experts".into(),
        });
    };
    let (nf, nx) = (m.n_ff_exp, m.n_expert);
    let mat = |w: &mut GgufWriter, rng: &mut SplitMix64, name: &str, dims: &[usize], std: f64| {
        let n = dims.iter().product();
        let v = rng.normal_vec(n, std);
        let d: Vec<u64> = dims.iter().map(|&x| x as u64).collect();
        // Stacked experts take the spec's type, the other matrices its dense one.
        let ty = if dims.len() == 3 {
            spec.wtype
        } else {
            spec.dense_wtype()
        };
        w.add_tensor_f32(name, &d, ty, &v).map(|_| ())
    };
    let vec = |w: &mut GgufWriter,
               rng: &mut SplitMix64,
               name: &str,
               dims: &[usize],
               center: f64,
               std: f64| {
        let n = dims.iter().product();
        let v: Vec<f32> = rng
            .normal_vec(n, std)
            .into_iter()
            .map(|x| (center + f64::from(x)) as f32)
            .collect();
        let d: Vec<u64> = dims.iter().map(|&x| x as u64).collect();
        w.add_tensor_f32(name, &d, GgmlType::F32, &v).map(|_| ())
    };
    let inv = |i: usize| 1.0 / (i as f64).sqrt();
    mat(w, rng, &blk(il, "attn_q"), &[ne, nq], inv(ne))?;
    mat(w, rng, &blk(il, "attn_k"), &[ne, nkv], inv(ne))?;
    mat(w, rng, &blk(il, "attn_v"), &[ne, nkv], inv(ne))?;
    mat(w, rng, &blk(il, "attn_output"), &[nq, ne], inv(nq))?;
    vec(w, rng, &blk_bias(il, "attn_q"), &[nq], 0.0, 0.1)?;
    vec(w, rng, &blk_bias(il, "attn_k"), &[nkv], 0.0, 0.1)?;
    vec(w, rng, &blk_bias(il, "attn_v"), &[nkv], 0.0, 0.1)?;
    vec(w, rng, &blk_bias(il, "attn_output"), &[ne], 0.0, 0.1)?;
    vec(w, rng, &blk(il, "attn_sinks"), &[spec.n_head], 0.0, 1.0)?;
    vec(w, rng, &blk(il, "attn_norm"), &[ne], 1.0, 0.1)?;
    vec(w, rng, &blk(il, "post_attention_norm"), &[ne], 1.0, 0.1)?;
    // The router stays F32, as llama.cpp's quantizer keeps it.
    let router = rng.normal_vec(ne * nx, 2.0 * inv(ne));
    w.add_tensor_f32(
        &blk(il, "ffn_gate_inp"),
        &[ne as u64, nx as u64],
        GgmlType::F32,
        &router,
    )?;
    vec(w, rng, &blk_bias(il, "ffn_gate_inp"), &[nx], 0.0, 0.5)?;
    mat(
        w,
        rng,
        &blk(il, "ffn_gate_exps"),
        &[ne, nf, nx],
        4.0 * inv(ne),
    )?;
    mat(
        w,
        rng,
        &blk(il, "ffn_up_exps"),
        &[ne, nf, nx],
        4.0 * inv(ne),
    )?;
    mat(w, rng, &blk(il, "ffn_down_exps"), &[nf, ne, nx], inv(nf))?;
    vec(w, rng, &blk_bias(il, "ffn_gate_exps"), &[nf, nx], 0.0, 0.5)?;
    vec(w, rng, &blk_bias(il, "ffn_up_exps"), &[nf, nx], 0.0, 0.5)?;
    vec(w, rng, &blk_bias(il, "ffn_down_exps"), &[ne, nx], 0.0, 0.1)?;
    Ok(())
}

/// Layer `il`'s router, stacked experts and (`qwen2moe`) shared expert. The router is
/// F32 whatever the matrices' type (llama.cpp's quantizer keeps it so), with std
/// `2/sqrt(n_embd)`: logits of std about 2, so the choice changes across tokens and the
/// chosen experts' gate values differ enough for their renormalisation to matter.
fn moe_tensors(
    w: &mut GgufWriter,
    rng: &mut SplitMix64,
    spec: &TinySpec,
    m: &TinyMoe,
    il: usize,
) -> Result<(), GgufError> {
    let (ne, nf, nx) = (spec.n_embd as u64, m.n_ff_exp as u64, m.n_expert as u64);
    let router = rng.normal_vec(spec.n_embd * m.n_expert, 2.0 / (ne as f64).sqrt());
    w.add_tensor_f32(&blk(il, "ffn_gate_inp"), &[ne, nx], GgmlType::F32, &router)?;
    for (name, i, o) in [
        ("ffn_gate_exps", ne, nf),
        ("ffn_up_exps", ne, nf),
        ("ffn_down_exps", nf, ne),
    ] {
        let v = rng.normal_vec((i * o * nx) as usize, 1.0 / (i as f64).sqrt());
        w.add_tensor_f32(&blk(il, name), &[i, o, nx], spec.wtype, &v)?;
    }
    if matches!(spec.arch, "qwen2moe" | "qwen35moe" | "qwen3next") {
        let ns = m.n_ff_shexp as u64;
        let g = rng.normal_vec(spec.n_embd, 1.0 / (ne as f64).sqrt());
        w.add_tensor_f32(&blk(il, "ffn_gate_inp_shexp"), &[ne], GgmlType::F32, &g)?;
        for (name, i, o) in [
            ("ffn_gate_shexp", ne, ns),
            ("ffn_up_shexp", ne, ns),
            ("ffn_down_shexp", ns, ne),
        ] {
            let v = rng.normal_vec((i * o) as usize, 1.0 / (i as f64).sqrt());
            w.add_tensor_f32(&blk(il, name), &[i, o], spec.wtype, &v)?;
        }
    }
    Ok(())
}

fn metadata(w: &mut GgufWriter, spec: &TinySpec) -> Result<(), GgufError> {
    let a = spec.arch;
    let u32_of = |key: &str, v: usize| {
        u32::try_from(v)
            .map(MetaValue::U32)
            .map_err(|_| GgufError::InvalidMeta {
                key: key.to_string(),
                reason: format!("{v} does not fit in u32"),
            })
    };
    w.add_meta("general.architecture", MetaValue::String(a.into()))
        .add_meta(
            "general.name",
            MetaValue::String(format!("minfer tiny {a} {}", spec.wtype)),
        );
    for (name, v) in [
        ("context_length", spec.n_ctx),
        ("embedding_length", spec.n_embd),
        ("block_count", spec.n_layer),
        ("feed_forward_length", spec.n_ff),
        ("attention.head_count", spec.n_head),
        ("attention.head_count_kv", spec.n_head_kv),
    ] {
        let key = format!("{a}.{name}");
        let v = u32_of(&key, v)?;
        w.add_meta(&key, v);
    }
    if a == "llama" {
        let key = format!("{a}.rope.dimension_count");
        let v = u32_of(&key, spec.head_dim)?;
        w.add_meta(&key, v);
    }
    if let Some(m) = &spec.moe {
        let mut keys = vec![
            ("expert_count", m.n_expert),
            ("expert_used_count", m.n_expert_used),
            ("expert_feed_forward_length", m.n_ff_exp),
        ];
        if matches!(a, "qwen2moe" | "qwen35moe" | "qwen3next") {
            keys.push(("expert_shared_feed_forward_length", m.n_ff_shexp));
        }
        for (name, v) in keys {
            let key = format!("{a}.{name}");
            let v = u32_of(&key, v)?;
            w.add_meta(&key, v);
        }
    }
    if let Some(ssm) = &spec.ssm {
        for (name, v) in [
            ("ssm.conv_kernel", ssm.d_conv),
            ("ssm.state_size", ssm.s),
            ("ssm.group_count", ssm.h_k),
            ("ssm.time_step_rank", ssm.h_v),
            ("ssm.inner_size", ssm.h_v * ssm.s),
            ("full_attention_interval", ssm.interval),
            ("rope.dimension_count", ssm.n_rot),
        ] {
            let key = format!("{a}.{name}");
            let v = u32_of(&key, v)?;
            w.add_meta(&key, v);
        }
        if a != "qwen3next" {
            w.add_meta(
                &format!("{a}.rope.dimension_sections"),
                MetaValue::Array(
                    MetaType::I32,
                    ssm.sections.iter().map(|&x| MetaValue::I32(x)).collect(),
                ),
            );
        }
    }
    if matches!(
        a,
        "qwen3" | "qwen3moe" | "qwen35" | "qwen35moe" | "qwen3next" | "gpt-oss"
    ) || a.starts_with("gemma")
    {
        for name in ["attention.key_length", "attention.value_length"] {
            let key = format!("{a}.{name}");
            let v = u32_of(&key, spec.head_dim)?;
            w.add_meta(&key, v);
        }
    }
    if let Some(win) = spec.sliding_window {
        let key = format!("{a}.attention.sliding_window");
        let v = u32_of(&key, win)?;
        w.add_meta(&key, v);
    }
    let rope_base = if a == "gemma3" {
        // Global layers: their own theta and a linear scaling the local ones ignore.
        w.add_meta(
            &format!("{a}.rope.scaling.type"),
            MetaValue::String("linear".into()),
        )
        .add_meta(
            &format!("{a}.rope.scaling.factor"),
            MetaValue::F32(TINY_GEMMA3_ROPE_FACTOR),
        );
        TINY_GEMMA3_ROPE_BASE
    } else if a == "gpt-oss" {
        let (factor, orig) = TINY_GPT_OSS_YARN;
        w.add_meta(
            &format!("{a}.rope.scaling.type"),
            MetaValue::String("yarn".into()),
        )
        .add_meta(&format!("{a}.rope.scaling.factor"), MetaValue::F32(factor))
        .add_meta(
            &format!("{a}.rope.scaling.original_context_length"),
            MetaValue::U32(orig),
        );
        TINY_GPT_OSS_ROPE_BASE
    } else {
        TINY_ROPE_FREQ_BASE
    };
    if a == "gemma2" {
        w.add_meta(
            &format!("{a}.attn_logit_softcapping"),
            MetaValue::F32(TINY_GEMMA2_ATTN_CAP),
        )
        .add_meta(
            &format!("{a}.final_logit_softcapping"),
            MetaValue::F32(TINY_GEMMA2_FINAL_CAP),
        );
    }
    w.add_meta(
        &format!("{a}.attention.layer_norm_rms_epsilon"),
        MetaValue::F32(TINY_RMS_EPS),
    )
    .add_meta(&format!("{a}.rope.freq_base"), MetaValue::F32(rope_base));
    Ok(())
}

/// GPT-2's byte-to-symbol map: printable bytes stand for themselves, the others are
/// shifted to code points 256.. in byte order.
fn byte_symbol(b: u8) -> char {
    let printable = |c: u8| (b'!'..=b'~').contains(&c) || (0xA1..=0xAC).contains(&c) || c >= 0xAE;
    if printable(b) {
        return char::from(b);
    }
    let shifted = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + shifted).unwrap_or('?')
}

fn tokenizer(w: &mut GgufWriter, n_vocab: usize, pre: &str) -> Result<(), GgufError> {
    let n_fill = n_vocab
        .checked_sub(256 + CONTROL_TOKENS.len())
        .ok_or_else(|| GgufError::InvalidMeta {
            key: "tokenizer.ggml.tokens".into(),
            reason: format!("n_vocab {n_vocab} is below the 259 byte and control tokens"),
        })?;
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_symbol(b).to_string()).collect();
    let mut merges = Vec::new();
    let letters: Vec<char> = ('a'..='z').collect();
    for i in 0..n_fill {
        // Two-letter tokens reachable through their merge; past 26*26 the fillers are
        // unreachable but still valid vocabulary entries.
        if i < letters.len() * letters.len() {
            let (x, y) = (letters[i / letters.len()], letters[i % letters.len()]);
            tokens.push(format!("{x}{y}"));
            merges.push(format!("{x} {y}"));
        } else {
            tokens.push(format!("[fill{i}]"));
        }
    }
    let mut types = vec![1i32; tokens.len()];
    tokens.extend(CONTROL_TOKENS.iter().map(|s| s.to_string()));
    types.extend([3i32; CONTROL_TOKENS.len()]);
    let id = |k: usize| (n_vocab - CONTROL_TOKENS.len() + k) as u32;
    let strings = |v: Vec<String>| {
        MetaValue::Array(
            MetaType::String,
            v.into_iter().map(MetaValue::String).collect(),
        )
    };
    w.add_meta("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .add_meta("tokenizer.ggml.pre", MetaValue::String(pre.into()))
        .add_meta("tokenizer.ggml.tokens", strings(tokens))
        .add_meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(
                MetaType::I32,
                types.into_iter().map(MetaValue::I32).collect(),
            ),
        )
        .add_meta("tokenizer.ggml.merges", strings(merges))
        .add_meta("tokenizer.ggml.bos_token_id", MetaValue::U32(id(0)))
        .add_meta("tokenizer.ggml.eos_token_id", MetaValue::U32(id(2)))
        .add_meta("tokenizer.ggml.padding_token_id", MetaValue::U32(id(0)))
        .add_meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_symbols_are_the_gpt2_map() {
        assert_eq!(byte_symbol(b'a'), 'a');
        assert_eq!(byte_symbol(b' '), 'Ġ');
        assert_eq!(byte_symbol(b'\n'), 'Ċ');
        assert_eq!(byte_symbol(0), 'Ā');
        assert_eq!(byte_symbol(0xAD), 'Ń');
        let distinct: std::collections::BTreeSet<char> = (0..=255u8).map(byte_symbol).collect();
        assert_eq!(distinct.len(), 256);
    }

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
