//! The kernel table: every WGSL entry point the backend dispatches, with the shape of
//! its bind group. Pipelines are compiled once per kernel and cached by the backend.

use minfer_gguf::quant::KVALUES_IQ4NL;
use minfer_gguf::GgmlType;

mod matmul;

pub(crate) use matmul::Tile;

/// How a kernel binds one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bind {
    /// Read-only storage buffer.
    Ro,
    /// Read-write storage buffer.
    Rw,
    /// Uniform parameter block (always the last binding).
    Uniform,
}

/// One compute entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    Add,
    Mul,
    /// `y = a * s`.
    Scale,
    Silu,
    SwiGlu,
    /// `y = x * sigmoid(g)`, one gate per row.
    MulSigmoid,
    /// Tanh-approximated GELU.
    Gelu,
    /// `gelu(gate) * up`.
    GeGlu,
    /// `c * tanh(x / c)`.
    SoftCap,
    /// The fused FFN's in-place SwiGLU over `[gate | up]` rows.
    SwiGluRows,
    RmsNorm,
    Gather,
    /// Matrix product against a weight of this storage type, in tiles of this width.
    Matmul(GgmlType, Tile),
    /// Token embedding lookup from a table of this storage type.
    Embed(GgmlType),
    /// Activations rounded to this activation format's levels (the CPU's Q8_0 or Q8_K).
    QuantAct(ActFormat),
    Rope,
    KvStore,
    Attn,
}

const ELEMENTWISE: &str = include_str!("elementwise.wgsl");
const TANH_ACT: &str = include_str!("tanh_act.wgsl");
const SWIGLU_ROWS: &str = include_str!("swiglu_rows.wgsl");
const NORM: &str = include_str!("norm.wgsl");
const GET_ROWS: &str = include_str!("get_rows.wgsl");
const QUANT_COMMON: &str = include_str!("quant_common.wgsl");
const IQ4: &str = include_str!("iq4.wgsl");
const X_F32: &str = include_str!("xs_f32.wgsl");
const X_Q8: &str = include_str!("xs_q8.wgsl");
const EMBED: &str = include_str!("embed.wgsl");
const ROPE: &str = include_str!("rope.wgsl");
const KV_STORE: &str = include_str!("kv_store.wgsl");
const ATTN: &str = include_str!("attn.wgsl");
const QUANT_ACT: &str = include_str!("quant_act.wgsl");

/// How the CPU backend quantizes a matmul's activations for a weight type, which the
/// wgpu matmul reproduces so both backends multiply the same rounded values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ActFormat {
    /// Blocks of 32 with an f16 scale (beside Q8_0 and the legacy 32-blocks).
    Q8_0,
    /// Blocks of 256 with an f32 scale (beside the K-quants).
    Q8K,
}

impl ActFormat {
    /// The activation format of a weight type, `None` for float weights (no rounding).
    pub(crate) fn of(ty: GgmlType) -> Option<ActFormat> {
        match ty {
            GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Iq4Nl => Some(ActFormat::Q8_0),
            GgmlType::Q4K | GgmlType::Q6K | GgmlType::Iq4Xs => Some(ActFormat::Q8K),
            _ => None,
        }
    }

    /// Values per block.
    pub(crate) fn block(self) -> usize {
        match self {
            ActFormat::Q8_0 => 32,
            ActFormat::Q8K => 256,
        }
    }
}

/// The weight types whose blocks the shaders can dequantize.
pub(crate) const WEIGHT_TYPES: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::Iq4Nl,
    GgmlType::Iq4Xs,
];

/// The matmul's `chunk_at` and `group` of a weight type (values four at a time), or
/// `None` for a type no shader decodes.
fn group_source(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => include_str!("dg_f32.wgsl"),
        GgmlType::F16 => include_str!("dg_f16.wgsl"),
        GgmlType::Q8_0 => include_str!("dg_q8_0.wgsl"),
        GgmlType::Q5_0 => include_str!("dg_q5_0.wgsl"),
        GgmlType::Q4K => include_str!("dg_q4_k.wgsl"),
        GgmlType::Q6K => include_str!("dg_q6_k.wgsl"),
        GgmlType::Iq4Nl => include_str!("dg_iq4_nl.wgsl"),
        GgmlType::Iq4Xs => include_str!("dg_iq4_xs.wgsl"),
        _ => return None,
    })
}

/// The `load_chunk` of a weight type, or `None` for a type no shader decodes.
fn dequant_source(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => include_str!("dq_f32.wgsl"),
        GgmlType::F16 => include_str!("dq_f16.wgsl"),
        GgmlType::Q8_0 => include_str!("dq_q8_0.wgsl"),
        GgmlType::Q5_0 => include_str!("dq_q5_0.wgsl"),
        GgmlType::Q4K => include_str!("dq_q4_k.wgsl"),
        GgmlType::Q6K => include_str!("dq_q6_k.wgsl"),
        GgmlType::Iq4Nl => include_str!("dq_iq4_nl.wgsl"),
        GgmlType::Iq4Xs => include_str!("dq_iq4_xs.wgsl"),
        _ => return None,
    })
}

/// The shared decoding a weight type's file builds on: quant_common.wgsl, and for the
/// IQ4 types iq4.wgsl with the level table written out from the CPU's.
fn common_source(ty: GgmlType) -> String {
    match ty {
        GgmlType::Iq4Nl | GgmlType::Iq4Xs => {
            format!(
                "{QUANT_COMMON}\n{}",
                IQ4.replace("{{IQ4_LEVELS}}", &iq4_levels())
            )
        }
        _ => QUANT_COMMON.to_string(),
    }
}

/// The IQ4 table's 16 signed levels as four WGSL u32 literals, four bytes each, level
/// 4i + b in byte b of word i.
fn iq4_levels() -> String {
    KVALUES_IQ4NL
        .chunks(4)
        .map(|c| {
            let word = c
                .iter()
                .enumerate()
                .fold(0u32, |w, (b, &l)| w | (u32::from(l as u8) << (8 * b)));
            format!("{word:#010x}u")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

use Bind::{Ro, Rw, Uniform};

impl Kernel {
    /// WGSL module text, entry point and bindings in binding order.
    pub(crate) fn spec(self) -> Result<(String, &'static str, &'static [Bind]), String> {
        let quant = |body: &str, ty: GgmlType| {
            dequant_source(ty)
                .map(|dq| format!("{}\n{dq}\n{body}", common_source(ty)))
                .ok_or_else(|| format!("no wgpu kernel decodes {ty} weights"))
        };
        // A quantized weight's activations come packed by the rounding pass.
        let grouped = |body: &str, ty: GgmlType| {
            let xs = match ActFormat::of(ty) {
                Some(_) => X_Q8,
                None => X_F32,
            };
            group_source(ty)
                .map(|dq| format!("{}\n{dq}\n{xs}\n{body}", common_source(ty)))
                .ok_or_else(|| format!("no wgpu kernel decodes {ty} weights"))
        };
        Ok(match self {
            Kernel::Add => (ELEMENTWISE.into(), "add", &[Ro, Ro, Rw, Uniform]),
            Kernel::Mul => (ELEMENTWISE.into(), "mul", &[Ro, Ro, Rw, Uniform]),
            Kernel::Silu => (ELEMENTWISE.into(), "silu", &[Ro, Ro, Rw, Uniform]),
            Kernel::SwiGlu => (ELEMENTWISE.into(), "swiglu", &[Ro, Ro, Rw, Uniform]),
            Kernel::Scale => (ELEMENTWISE.into(), "scale", &[Ro, Ro, Rw, Uniform]),
            Kernel::MulSigmoid => (ELEMENTWISE.into(), "mul_sigmoid", &[Ro, Ro, Rw, Uniform]),
            Kernel::Gelu => (TANH_ACT.into(), "gelu", &[Ro, Ro, Rw, Uniform]),
            Kernel::GeGlu => (TANH_ACT.into(), "geglu", &[Ro, Ro, Rw, Uniform]),
            Kernel::SoftCap => (TANH_ACT.into(), "softcap", &[Ro, Ro, Rw, Uniform]),
            Kernel::SwiGluRows => (SWIGLU_ROWS.into(), "swiglu_rows", &[Rw, Uniform]),
            Kernel::RmsNorm => (NORM.into(), "rms_norm", &[Ro, Ro, Rw, Uniform]),
            Kernel::Gather => (GET_ROWS.into(), "gather", &[Ro, Ro, Rw, Uniform]),
            Kernel::Matmul(ty, tile) => (
                grouped(&matmul::source(tile), ty)?,
                "matmul",
                &[Ro, Ro, Ro, Rw, Uniform],
            ),
            Kernel::Embed(ty) => (quant(EMBED, ty)?, "embed", &[Ro, Ro, Rw, Uniform]),
            Kernel::QuantAct(ActFormat::Q8_0) => (QUANT_ACT.into(), "q8_0", &[Ro, Rw, Uniform]),
            Kernel::QuantAct(ActFormat::Q8K) => (QUANT_ACT.into(), "q8_k", &[Ro, Rw, Uniform]),
            Kernel::Rope => (ROPE.into(), "rope", &[Ro, Rw, Uniform]),
            Kernel::KvStore => (KV_STORE.into(), "kv_store", &[Ro, Ro, Ro, Rw, Rw, Uniform]),
            Kernel::Attn => (ATTN.into(), "attn", &[Ro, Ro, Ro, Ro, Ro, Rw, Uniform]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_iq4_levels_are_the_cpu_table_packed_four_to_a_word() {
        // ggml's kvalues_iq4nl: -127, -104, -83, -65 | -49, -35, -22, -10 | 1, 13, 25, 38 |
        // 53, 69, 89, 113, as bytes 0x81 0x98 0xad 0xbf and so on, little end first.
        assert_eq!(
            iq4_levels(),
            "0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u"
        );
        let src = common_source(GgmlType::Iq4Xs);
        assert!(src.contains("vec4<u32>(0xbfad9881u") && !src.contains("{{"));
        assert!(!common_source(GgmlType::Q4K).contains("iq4_level"));
    }

    #[test]
    fn every_weight_type_has_both_decoders() {
        for ty in WEIGHT_TYPES {
            assert!(
                group_source(ty).is_some() && dequant_source(ty).is_some(),
                "{ty}"
            );
        }
        assert_eq!(ActFormat::of(GgmlType::Iq4Nl), Some(ActFormat::Q8_0));
        assert_eq!(ActFormat::of(GgmlType::Iq4Xs), Some(ActFormat::Q8K));
    }
}
