//! Node metadata (§3.1): a concrete enum rather than a type-erased box, so it is
//! `PartialEq` for the structural check, cannot fail a downcast and keeps `CNode: Clone`.
//!
//! The metas carry everything a backend needs beyond the op payload: weight names
//! (invariant 3 — weights are referenced by name and resolved by the backend),
//! dimensions, and the rope / attention parameters of the fused decode nodes.

use serde::{Deserialize, Serialize};

use crate::kv_ring::KvRing;
use crate::types::{RopeStyle, WeightType};

/// Per-node metadata; `None` for ops whose payload says everything.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NodeMeta {
    /// No metadata.
    #[default]
    None,
    /// A matmul's weight (and optional bias) by name.
    MatMul(MatMulMeta),
    /// A norm's optional scale weight.
    Norm(NormMeta),
    /// Rotary embedding parameters.
    Rope(RoPEMeta),
    /// Attention geometry and the KV layer it reads.
    Attn(AttnMeta),
    /// A KV store/load's region geometry.
    Kvcache(KvcacheMeta),
    /// The embedding table of a token-lookup `GetRows`.
    Embed(EmbedMeta),
    /// Decode QKV concat matmul + bias/rope/store.
    FusedQkv(FusedQkvMeta),
    /// Decode mixed-quant bias/rope/store epilogue.
    QkvBiasRopeStore(QkvBiasRopeStoreMeta),
    /// Decode gate|up concat matmul + in-place SwiGLU.
    FusedFfn(FusedFfnMeta),
    /// Decode Qwen3 concat matmul + per-head norm + rope/store.
    FusedQkvNorm(FusedQkvNormMeta),
    /// An expert-routed matmul's stacked weight(s).
    MatMulId(MatMulIdMeta),
    /// A recurrent layer's geometry and weights ([`crate::Op::SsmConv`],
    /// [`crate::Op::DeltaNet`]).
    Recurrent(RecurrentMeta),
}

/// The geometry of a Gated DeltaNet layer's recurrent state and the weights its ops
/// read. The layer's region (see `GraphAllocator::ensure_state`) holds `slots` f32
/// conv windows of [`Self::conv_slot`] values (per channel its `d_conv - 1` earlier
/// inputs, oldest first) and `slots` state blocks of [`Self::ssm_slot`]
/// values (per value head an `s_v x s_k` matrix, row `j` the value dimension). A token's
/// slot arrives as data (the `slots` input); a token at position 0 starts from zero
/// state, so a new sequence needs no host-side clear.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecurrentMeta {
    /// Layer index (the region's key).
    pub layer: usize,
    /// State slots in the region (sequences that may run at once).
    pub slots: usize,
    /// Convolution kernel width (ggml `ssm.conv_kernel`).
    pub d_conv: usize,
    /// Convolved channels: `2 * h_k * s_k + h_v * s_v` (q, k, v in that order).
    pub channels: usize,
    /// Key head size.
    pub s_k: usize,
    /// Key heads (value head `h` reads key head `h % h_k`, as ggml's repeat, or
    /// `h / (h_v / h_k)` with [`Self::grouped`]).
    pub h_k: usize,
    /// Value head size (equal to `s_k`).
    pub s_v: usize,
    /// Value heads.
    pub h_v: usize,
    /// The `[d_conv, channels]` convolution weight (SsmConv).
    pub conv_weight: String,
    /// The per-value-head decay factor `a` (`-exp(A_log)`, ggml's `ssm_a`; DeltaNet).
    pub a_weight: String,
    /// A per-value-head bias DeltaNet adds to `alpha` before the softplus (`ssm_dt`,
    /// where the projection cannot carry it: Qwen3-Next's joint beta/alpha); `None`
    /// when `alpha` arrives biased.
    #[serde(default)]
    pub dt_bias: Option<String>,
    /// Value heads share key heads in consecutive groups (`h / (h_v / h_k)`, Qwen3-Next's
    /// repeat-interleave) rather than in turn (`h % h_k`).
    #[serde(default)]
    pub grouped: bool,
    /// Epsilon of the q/k L2 normalisation (`x / sqrt(sum x^2 + eps)`).
    pub eps: f32,
    /// Tokens per chunk of DeltaNet's chunked form (0: token by token). A backend that
    /// has the form runs, as one block, each whole chunk of a sequence's positions (from
    /// `j * chunk` to `(j + 1) * chunk`) that one step holds: the same recurrence
    /// regrouped, equal to the token-by-token values up to rounding, not bit for bit.
    #[serde(default)]
    pub chunk: usize,
}

impl RecurrentMeta {
    /// Values of one slot's conv window.
    pub fn conv_slot(&self) -> usize {
        self.d_conv.saturating_sub(1) * self.channels
    }

    /// The key head value head `h` reads.
    pub fn key_head(&self, h: usize) -> usize {
        if self.grouped {
            h / (self.h_v / self.h_k).max(1)
        } else {
            h % self.h_k.max(1)
        }
    }

    /// Values of one slot's state matrices.
    pub fn ssm_slot(&self) -> usize {
        self.h_v * self.s_v * self.s_k
    }
}

/// A matmul against a named weight of GGUF shape `[in_dim, out_dim]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatMulMeta {
    /// Weight name, resolved by the executing backend.
    pub weight_name: String,
    /// Input features (GGUF `shape[0]`).
    pub in_dim: usize,
    /// Output features (GGUF `shape[1]`).
    pub out_dim: usize,
    /// Storage type of the weight.
    pub wtype: WeightType,
    /// Optional bias vector of length `out_dim`, by name.
    pub bias_name: Option<String>,
}

/// The stacked expert weight of an expert-routed matmul (GGUF `[in_dim, out_dim,
/// n_expert]`: expert `e` is rows `e * out_dim .. (e + 1) * out_dim` of the `[out][in]`
/// memory), and for [`crate::Op::MulMatIdSwiGLU`] the gate weight of the same shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatMulIdMeta {
    /// Stacked weight name (the up projection of a SwiGLU node).
    pub weight_name: String,
    /// Stacked gate weight of a SwiGLU node; `None` for a plain one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_name: Option<String>,
    /// Input features (GGUF `shape[0]`).
    pub in_dim: usize,
    /// Output features of one expert (GGUF `shape[1]`).
    pub out_dim: usize,
    /// Experts stacked (GGUF `shape[2]`).
    pub n_expert: usize,
    /// Storage type of the weight(s).
    pub wtype: WeightType,
    /// Stacked F32 bias of the (up) product, GGUF `[out_dim, n_expert]`: slot `(j, t)`
    /// adds row `ids[j, t]` (ggml's `add_id`); `None`: no bias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bias_name: Option<String>,
    /// Stacked F32 bias of the gate product of a gated node, as [`Self::bias_name`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_bias_name: Option<String>,
    /// The gated node's activation of `(gate, up)`.
    #[serde(default, skip_serializing_if = "Glu::is_silu")]
    pub glu: Glu,
}

/// The activation a gated expert node applies to its gate and up products.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Glu {
    /// `silu(gate) * up`.
    #[default]
    Silu,
    /// gpt-oss's clamped form (ggml's `swiglu_oai`): `x = min(gate, limit)`, `y =
    /// clamp(up, -limit, limit)`, output `x * sigmoid(alpha * x) * (y + 1)`.
    Oai {
        /// Slope inside the sigmoid (1.702 in gpt-oss).
        alpha: f32,
        /// Clamp bound (7 in gpt-oss).
        limit: f32,
    },
}

impl Glu {
    /// Whether this is the plain SiLU gate (what a serialized meta omits).
    pub fn is_silu(&self) -> bool {
        *self == Glu::Silu
    }

    /// The activation of one `(gate, up)` pair, the scalar reference of every kernel.
    #[inline]
    pub fn apply(&self, gate: f32, up: f32) -> f32 {
        match *self {
            Glu::Silu => gate / (1.0 + (-gate).exp()) * up,
            Glu::Oai { alpha, limit } => {
                let x = gate.min(limit);
                let y = up.clamp(-limit, limit);
                x / (1.0 + (alpha * -x).exp()) * (y + 1.0)
            }
        }
    }
}

/// A norm's scale weight (RMSNorm, QkNorm, LayerNorm) and, for LayerNorm only, its bias.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NormMeta {
    /// Scale vector name; `None` for an unscaled norm.
    pub weight_name: Option<String>,
    /// Bias vector name, added after the scale ([`crate::Op::LayerNorm`] only); `None`:
    /// no bias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bias_name: Option<String>,
}

/// Rotary embedding parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoPEMeta {
    /// Rotated dimensions per head (≤ `hd`).
    pub n_dims: usize,
    /// Frequency base (theta).
    pub freq_base: f32,
    /// Linear position scale.
    pub freq_scale: f32,
    /// Heads in the rotated tensor.
    pub n_head: usize,
    /// Head dimension.
    pub hd: usize,
    /// Pairing of rotated dimensions.
    pub style: RopeStyle,
    /// F32 weight of `n_dims / 2` per-pair frequency divisors (`rope_freqs.weight`, as
    /// ggml's `rope_ext` applies them: pair `i` turns by `theta_i / factor_i`); `None`
    /// for plain rope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freq_factors: Option<String>,
    /// YaRN context extension (ggml's `rope_ext` with a non-zero `ext_factor`); `None`:
    /// plain (linearly scaled) rope. A backend without the term declines the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yarn: Option<Yarn>,
}

/// The YaRN terms of a rope, as ggml's `rope_ext` takes them. Pair `i` turns by
/// `theta_interp * (1 - r) + theta_extrap * r`, where `theta_extrap` is the unscaled
/// angle, `theta_interp = freq_scale * theta_extrap` and `r = ext_factor * ramp(i)`,
/// `ramp` falling from 1 to 0 between the correction dims of `beta_fast` and
/// `beta_slow` ([`Yarn::corr_dims`]); cos and sin are multiplied by `attn_factor * (1 +
/// 0.1 ln(1 / freq_scale))`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Yarn {
    /// Weight of the extrapolated angle (1 for YaRN files).
    pub ext_factor: f32,
    /// Magnitude factor before the `1 + 0.1 ln(1 / freq_scale)` term.
    pub attn_factor: f32,
    /// Rotations per context where the ramp starts (32 by default).
    pub beta_fast: f32,
    /// Rotations per context where the ramp ends (1 by default).
    pub beta_slow: f32,
    /// Context the model was trained at before extension.
    pub n_ctx_orig: usize,
}

impl Yarn {
    /// The ramp's start and end pair dims for `n_dims` rotated dims and theta `base`
    /// (ggml's `rope_yarn_corr_dims`, in f32 as there).
    pub fn corr_dims(&self, n_dims: usize, base: f32) -> [f32; 2] {
        let dim = |rot: f32| {
            n_dims as f32 * (self.n_ctx_orig as f32 / (rot * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let start = dim(self.beta_fast).floor();
        let end = dim(self.beta_slow).ceil();
        [start.max(0.0), end.min(n_dims as f32 - 1.0)]
    }

    /// The cos/sin magnitude for a rope of linear scale `freq_scale`.
    pub fn mscale(&self, freq_scale: f32) -> f32 {
        if self.ext_factor == 0.0 {
            self.attn_factor
        } else {
            self.attn_factor * (1.0 + 0.1 * (1.0 / freq_scale).ln())
        }
    }

    /// Pair `i`'s angle from its unscaled angle `theta_extrap` (ggml's `rope_yarn`).
    #[inline]
    pub fn angle(&self, theta_extrap: f32, freq_scale: f32, corr: [f32; 2], i: usize) -> f32 {
        let interp = freq_scale * theta_extrap;
        if self.ext_factor == 0.0 {
            return interp;
        }
        let y = (i as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
        let ramp = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
        interp * (1.0 - ramp) + theta_extrap * ramp
    }
}

/// Attention geometry; `layer` selects the KV pair through `KvProvider::kv_pair`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttnMeta {
    /// Layer index whose KV regions are read.
    pub layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads (GQA groups = `n_head / n_head_kv`).
    pub n_head_kv: usize,
    /// Head dimension.
    pub hd: usize,
    /// Softmax scale, usually `1/sqrt(hd)`.
    pub scale: f32,
    /// KV region length in rows.
    pub n_ctx: usize,
    /// Sliding window (a sliding-window layer): each token attends only the last
    /// `window` rows of its key range, its own row included, as llama.cpp masks keys
    /// `window` or more positions back. The rows of a sequence hold consecutive
    /// positions, so rows and positions count alike. `None`: the whole range. A backend
    /// whose kernel does not honour it declines the node by capability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// Score soft-cap (Gemma 2's `attn_logit_softcapping`): each scaled score `s`
    /// becomes `c * tanh(s / c)` before masking and softmax. `None`: plain scores. A
    /// backend whose kernel has no such term declines the node by capability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub softcap: Option<f32>,
    /// The layer's KV ring (a sliding-window layer keeping only the rows its window can
    /// read, [`KvRing`]): spans and positions name virtual rows, mapped onto the `n_ctx`
    /// physical rows. `None`: rows are physical. A backend whose kernel does not map rows
    /// declines the node by capability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<KvRing>,
    /// Attention sinks (gpt-oss): an F32 weight of `n_head` logits, head `h`'s taking
    /// part in its softmax's normaliser (unscaled, as ggml's `soft_max_add_sinks`) with
    /// no value row, so a row's weights sum to less than one. `None`: plain softmax. A
    /// backend whose kernel has no such term declines the node by capability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sinks: Option<String>,
    /// Whether a token attends only to keys up to its own position (decoders), or to
    /// every key row of its sequence in the step (`false`: an encoder's bidirectional
    /// attention, BERT): a token's key range ends where the step's last row of its
    /// sequence ends instead of at its own row. Windows and rings are causal only. A
    /// backend whose kernel has no such mode declines the node by capability.
    #[serde(default = "causal_default", skip_serializing_if = "is_causal")]
    pub causal: bool,
}

fn causal_default() -> bool {
    true
}

fn is_causal(c: &bool) -> bool {
    *c
}

impl AttnMeta {
    /// Width of one K (or V) row: `n_head_kv * hd`.
    pub fn nkt(&self) -> usize {
        self.n_head_kv * self.hd
    }

    /// Widens causal key ranges to an encoder's when the node is not causal: each
    /// token's range `[lo, hi)` ends where the longest range starting at the same `lo`
    /// (the step's last row of the token's sequence) ends, so every token of a sequence
    /// sees all of the sequence's rows in the step. A causal node's ranges stay as given.
    pub fn widen_non_causal(&self, ranges: &mut [(usize, usize)]) {
        if self.causal {
            return;
        }
        // (sequence start, its last row + 1); a step holds few sequences.
        let mut ends: Vec<(usize, usize)> = Vec::new();
        for &(lo, hi) in ranges.iter() {
            match ends.iter_mut().find(|e| e.0 == lo) {
                Some(e) => e.1 = e.1.max(hi),
                None => ends.push((lo, hi)),
            }
        }
        for r in ranges.iter_mut() {
            if let Some(e) = ends.iter().find(|e| e.0 == r.0) {
                r.1 = e.1;
            }
        }
    }

    /// Virtual rows the spans and positions may name: `n_ctx`, or what the ring serves.
    pub fn virtual_rows(&self) -> usize {
        self.ring.map_or(self.n_ctx, |r| r.virtual_rows(self.n_ctx))
    }

    /// Checks a device backend's attention inputs for a step of `nt` tokens: the q source
    /// (`q_len` values) holds `nt` rows of `n_head * hd`, and the K and V regions (`k_len`,
    /// `v_len` values) hold `n_ctx` rows each. Returns q's per-token stride; an error names
    /// the shortfall.
    pub fn check_q_and_kv(
        &self,
        nt: usize,
        q_len: usize,
        k_len: usize,
        v_len: usize,
    ) -> Result<usize, String> {
        let qrow = self.n_head * self.hd;
        let q_stride = q_len / nt;
        if q_stride < qrow {
            return Err(format!(
                "attention: q holds {q_len} values, {nt} tokens of {qrow} needed"
            ));
        }
        let region = self.nkt() * self.n_ctx;
        if k_len < region || v_len < region {
            return Err(format!(
                "attention: layer {} K/V regions hold {k_len}/{v_len} values, {region} needed",
                self.layer
            ));
        }
        Ok(q_stride)
    }

    /// Checks explicit key ranges (`[lo, hi)` pairs, one per token) lie inside the KV
    /// region and are not empty; an error names the token and its range.
    pub fn check_spans(&self, pairs: &[i32]) -> Result<(), String> {
        for (t, pair) in pairs.chunks_exact(2).enumerate() {
            let (lo, hi) = (pair[0] as i64, pair[1] as i64);
            if lo < 0 || lo >= hi || hi > self.virtual_rows() as i64 {
                return Err(format!(
                    "token {t}: key range [{lo}, {hi}) invalid for the {}-row KV region of layer {}",
                    self.virtual_rows(), self.layer
                ));
            }
        }
        Ok(())
    }

    /// Checks every token's position lies inside the KV region; an error names the token.
    pub fn check_positions(&self, pos: &[i32]) -> Result<(), String> {
        match pos
            .iter()
            .enumerate()
            .find(|&(_, &p)| p < 0 || p as usize >= self.virtual_rows())
        {
            Some((t, p)) => Err(format!(
                "token {t}: position {p} outside the {}-row KV region of layer {}",
                self.virtual_rows(),
                self.layer
            )),
            None => Ok(()),
        }
    }
}

/// KV region geometry of a store or load node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvcacheMeta {
    /// Layer index.
    pub layer: usize,
    /// Row width (`n_head_kv * hd`).
    pub n_embd: usize,
    /// Region length in rows.
    pub n_ctx: usize,
    /// KV heads when the builder knows them (loads record it; stores do not).
    pub n_head_kv: Option<usize>,
    /// The layer's KV ring: `n_ctx` counts physical rows and a store maps its virtual
    /// `cells` onto them ([`KvRing::row`]). `None`: cells are physical rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<KvRing>,
}

/// Token-embedding table of a lookup `GetRows` node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedMeta {
    /// Table name (GGUF shape `[n_embd, n_vocab]`).
    pub weight_name: String,
    /// Storage type of the table.
    pub wtype: WeightType,
    /// Row width.
    pub n_embd: usize,
}

/// Decode QKV fusion: one concat matmul plus bias, rope and KV store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FusedQkvMeta {
    /// Concatenated q|k|v weight name.
    pub qkv_weight: String,
    /// Storage type of the concat weight.
    pub wtype: WeightType,
    /// Input features.
    pub n_embd: usize,
    /// Q rows (`n_head * hd`).
    pub nqt: usize,
    /// K (and V) rows (`n_head_kv * hd`).
    pub nkt: usize,
    /// Optional q/k/v bias names.
    pub q_bias: Option<String>,
    /// K bias name.
    pub k_bias: Option<String>,
    /// V bias name.
    pub v_bias: Option<String>,
    /// Rope applied to q and k.
    pub rope: RoPEMeta,
    /// KV region length in rows.
    pub n_ctx: usize,
    /// Elements of each KV region (`nkt * n_ctx`).
    pub kv_elems: usize,
}

/// Mixed-quant decode epilogue: bias + rope + KV store over three matmul outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QkvBiasRopeStoreMeta {
    /// Q bias name.
    pub q_bias: String,
    /// K bias name.
    pub k_bias: String,
    /// V bias name.
    pub v_bias: String,
    /// Rope applied to q and k.
    pub rope: RoPEMeta,
    /// Q rows.
    pub nqt: usize,
    /// K/V rows.
    pub nkt: usize,
    /// KV region length in rows.
    pub n_ctx: usize,
    /// Elements of each KV region.
    pub kv_elems: usize,
}

/// Decode FFN fusion: gate|up concat matmul, then SwiGLU in place into rows `0..nf`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FusedFfnMeta {
    /// Gate weight name (`[n_embd, nf]`).
    pub gate_weight: String,
    /// Up weight name (`[n_embd, nf]`).
    pub up_weight: String,
    /// Name of the concatenated gate|up weight where a backend registered one.
    pub concat_weight: String,
    /// Storage type.
    pub wtype: WeightType,
    /// Input features.
    pub n_embd: usize,
    /// FFN width.
    pub nf: usize,
}

/// Decode Qwen3 fusion: concat matmul + per-head q/k norm + rope + KV store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FusedQkvNormMeta {
    /// Concatenated q|k|v weight name.
    pub qkv_weight: String,
    /// Storage type.
    pub wtype: WeightType,
    /// Input features.
    pub n_embd: usize,
    /// Q rows.
    pub nqt: usize,
    /// K/V rows.
    pub nkt: usize,
    /// Per-head q norm weight.
    pub q_norm: String,
    /// Per-head k norm weight.
    pub k_norm: String,
    /// Norm epsilon.
    pub eps: f32,
    /// Rope applied after the norm.
    pub rope: RoPEMeta,
    /// KV region length in rows.
    pub n_ctx: usize,
    /// Elements of each KV region.
    pub kv_elems: usize,
}
