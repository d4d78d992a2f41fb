//! The tiny models' shapes: one constructor per architecture family, the golden set the
//! reference outputs were made for (with the seeds chosen for it) and the set for
//! quantization-mix checks.

use minfer_gguf::GgmlType;

use super::{TinyMoe, TinySpec, TinySsm};

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
