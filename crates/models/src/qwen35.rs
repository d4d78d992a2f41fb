//! Qwen3.5 (`qwen35`): a hybrid of Gated DeltaNet layers, which carry a fixed-size
//! recurrent state per sequence, and gated full-attention layers (every
//! `full_attention_interval`-th layer, or as `attention.recurrent_layers` lists).
//!
//! A recurrent layer: `attn_qkv` projects the normed input to q|k|v channels, which a
//! causal depthwise convolution (`ssm_conv1d`, width `ssm.conv_kernel`) over the slot's
//! window of earlier inputs and a SiLU turn into the delta rule's q, k (L2-normalised)
//! and v; `ssm_alpha` (+ `ssm_dt.bias`) and `ssm_beta` give each value head's decay
//! `exp(softplus(alpha) * ssm_a)` and write strength `sigmoid(beta)`; the heads' outputs
//! are RMS-normed per head (`ssm_norm`), gated by `silu(attn_gate x)` and projected by
//! `ssm_out`. A full layer: `attn_q` yields each head's query and output gate
//! interleaved, q and k are RMS-normed per head and roped, and the attention output is
//! multiplied by `sigmoid(gate)` before `attn_output`. Every layer then adds its residual,
//! normalises with `post_attention_norm` and runs a SwiGLU FFN with its own residual.
//!
//! The multi-section rope (`rope.dimension_sections`, llama.cpp's interleaved M-RoPE) gives
//! text tokens the same position in every section, so each rotated pair turns by
//! `p * base^(-2i / n_rot)` exactly as the normal-layout rope over `rope.dimension_count`
//! dims does; pairs no section covers would use the fourth (always 0 for text) position
//! and stay unrotated, which this loader refuses rather than approximates.

use minfer_gguf::{GgmlType, GgufFile, MetaValue};
use minfer_graph::{ComputeGraph, GraphParams, RopeStyle, WeightRef};

use crate::error::ModelError;
use crate::ffn::DenseFfn;
use crate::hparams::{HParams, MoeParams};
use crate::model::ModelDef;
use crate::moe::MoeFfn;
use crate::weights::{blk, blk_bias, matrix, vector, Ffn, Weights};

/// The `general.architecture` value.
pub const ARCH: &str = "qwen35";

mod graph;

/// The recurrent layers' geometry, from the `ssm.*` keys.
#[derive(Debug, Clone, PartialEq)]
pub struct SsmParams {
    /// Convolution width (`ssm.conv_kernel`).
    pub d_conv: usize,
    /// Head size of keys and values (`ssm.state_size`).
    pub s: usize,
    /// Key heads (`ssm.group_count`).
    pub h_k: usize,
    /// Value heads (`ssm.time_step_rank`); `ssm.inner_size` is `h_v * s`.
    pub h_v: usize,
}

impl SsmParams {
    /// Convolved channels: q and k heads, then v heads.
    pub fn channels(&self) -> usize {
        2 * self.h_k * self.s + self.h_v * self.s
    }

    /// Width of the value heads together.
    pub fn value_dim(&self) -> usize {
        self.h_v * self.s
    }
}

/// A gated full-attention layer's tensors.
#[derive(Debug, Clone, PartialEq)]
struct AttnW {
    /// Query and gate, interleaved per head: `[n_embd, 2 * n_head * head_dim]`.
    wq: WeightRef,
    wk: WeightRef,
    wv: WeightRef,
    wo: WeightRef,
    q_norm: WeightRef,
    k_norm: WeightRef,
}

/// A Gated DeltaNet layer's tensors.
#[derive(Debug, Clone, PartialEq)]
struct LinearW {
    qkv: WeightRef,
    gate: WeightRef,
    conv: WeightRef,
    dt_bias: WeightRef,
    a: WeightRef,
    ba: BetaAlpha,
    norm: WeightRef,
    out: WeightRef,
}

/// The write-strength and decay projections of a recurrent layer.
#[derive(Debug, Clone, PartialEq)]
enum BetaAlpha {
    /// Qwen3.5: `ssm_beta` and `ssm_alpha`, `[n_embd, h_v]` each.
    Separate { beta: WeightRef, alpha: WeightRef },
    /// Qwen3-Next: `ssm_ba`, `[n_embd, 2 * h_v]`, per key head its value heads'
    /// betas then their alphas.
    Joint(WeightRef),
}

#[derive(Debug, Clone, PartialEq)]
enum Mixer {
    Attn(AttnW),
    Linear(LinearW),
}

#[derive(Debug, Clone, PartialEq)]
struct Layer {
    attn_norm: WeightRef,
    post_norm: WeightRef,
    mixer: Mixer,
    ffn: Ffn,
}

/// A loaded Qwen3.5 (or Qwen3.5-MoE) model.
pub struct Qwen35 {
    arch: &'static str,
    hp: HParams,
    /// Rotated dims per head (`rope.dimension_count`).
    n_rot: usize,
    ssm: SsmParams,
    globals: Weights,
    layers: Vec<Layer>,
}

fn u32_key(file: &GgufFile, key: &str) -> Result<usize, ModelError> {
    let v = file.get_u32(key)? as usize;
    if v == 0 {
        return Err(ModelError::BadHparam {
            key: key.into(),
            value: "0".into(),
            reason: "must be positive".into(),
        });
    }
    Ok(v)
}

fn int_array(file: &GgufFile, key: &str) -> Result<Option<Vec<i64>>, ModelError> {
    let bad = |reason: &str| ModelError::BadHparam {
        key: key.into(),
        value: "array".into(),
        reason: reason.into(),
    };
    match file.get(key) {
        None => Ok(None),
        Some(MetaValue::Array(_, items)) => items
            .iter()
            .map(|v| match v {
                MetaValue::I32(x) => Ok(i64::from(*x)),
                MetaValue::U32(x) => Ok(i64::from(*x)),
                MetaValue::Bool(x) => Ok(i64::from(*x)),
                _ => Err(bad("expected integers")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(bad("expected an array")),
    }
}

/// Which layers are recurrent: `attention.recurrent_layers` when present, else every
/// layer but each `full_attention_interval`-th (default 4), as llama.cpp decides.
fn recurrent_layers(file: &GgufFile, arch: &str, n_layer: usize) -> Result<Vec<bool>, ModelError> {
    let key = format!("{arch}.attention.recurrent_layers");
    if let Some(v) = int_array(file, &key)? {
        if v.len() < n_layer {
            return Err(ModelError::BadHparam {
                key,
                value: format!("{} entries", v.len()),
                reason: format!("needs one per layer ({n_layer})"),
            });
        }
        return Ok(v[..n_layer].iter().map(|&x| x != 0).collect());
    }
    let ikey = format!("{arch}.full_attention_interval");
    let interval = match file.get(&ikey) {
        None => 4,
        Some(_) => u32_key(file, &ikey)?,
    };
    Ok((0..n_layer)
        .map(|i| !(i + 1).is_multiple_of(interval))
        .collect())
}

/// Checks that the interleaved multi-section rope covers every rotated pair with one of
/// its three text sections (then it equals the normal-layout rope over `n_rot` dims).
fn check_sections(file: &GgufFile, arch: &str, n_rot: usize) -> Result<(), ModelError> {
    let key = format!("{arch}.rope.dimension_sections");
    let Some(s) = int_array(file, &key)? else {
        return Ok(());
    };
    let bad = |reason: String| ModelError::BadHparam {
        key: key.clone(),
        value: format!("{s:?}"),
        reason,
    };
    if s.len() < 3 || s.iter().any(|&x| x < 0) {
        return Err(bad("expected at least three non-negative sections".into()));
    }
    let total: i64 = s.iter().take(4).sum();
    if total <= 0 {
        return Err(bad("the sections are empty".into()));
    }
    for i in 0..n_rot / 2 {
        let sector = (i as i64) % total;
        let covered = (0..3).any(|k| sector % 3 == k && sector < 3 * s[k as usize]);
        if !covered {
            return Err(bad(format!(
                "rotated pair {i} falls in no text section (its angle would come from the \
                 fourth position, which this graph has no term for)"
            )));
        }
    }
    Ok(())
}

/// Reads and validates a Qwen3.5 model's hyperparameters and tensors.
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    load_hybrid(file, ARCH, false, false)
}

/// The FFN of layer `il`: a SwiGLU FFN, or (`moe`) routed experts with renormalised
/// gate values and the shared expert (optional but for Qwen3-Next, `next`), as
/// llama.cpp builds Qwen3.5-MoE's and Qwen3-Next's.
fn read_ffn(
    file: &GgufFile,
    il: usize,
    hp: &HParams,
    moe: Option<&MoeParams>,
    next: bool,
) -> Result<Ffn, ModelError> {
    match moe {
        None => Ok(Ffn::Dense(DenseFfn::read(
            file, il, "", hp.n_embd, hp.n_ff,
        )?)),
        Some(m) => {
            let shared = next || file.tensor(&blk(il, "ffn_up_shexp")).is_some();
            let f = MoeFfn::read(file, il, hp, m, true, shared)?;
            Ok(Ffn::Moe(Box::new(f)))
        }
    }
}

/// Reads a hybrid model of `arch`: `qwen35`, with routed experts (`moe`) `qwen35moe`,
/// or (`next`) `qwen3next`, whose experts are always there and whose recurrent layers
/// project beta and alpha jointly.
pub(crate) fn load_hybrid(
    file: &GgufFile,
    arch: &'static str,
    moe: bool,
    next: bool,
) -> Result<Box<dyn ModelDef>, ModelError> {
    let mut hp = HParams::read(file, arch, RopeStyle::NonInterleaved)?;
    let moe = if moe {
        let scale_key = format!("{arch}.expert_weights_scale");
        if file.get(&scale_key).is_some() {
            let v = file.get_f32(&scale_key)?;
            if v != 1.0 && v != 0.0 {
                return Err(ModelError::BadHparam {
                    key: scale_key,
                    value: format!("{v:?}"),
                    reason: "the expert weights have no scale term in this graph".into(),
                });
            }
        }
        Some(MoeParams::read(file, arch, &hp)?)
    } else {
        None
    };
    let hd = hp.head_dim;
    let rot_key = format!("{arch}.rope.dimension_count");
    let n_rot = match file.get(&rot_key) {
        None => hd,
        Some(_) => u32_key(file, &rot_key)?,
    };
    if n_rot > hd || !n_rot.is_multiple_of(2) {
        return Err(ModelError::BadHparam {
            key: rot_key,
            value: n_rot.to_string(),
            reason: format!("must be even and at most the head dimension {hd}"),
        });
    }
    if !next {
        check_sections(file, arch, n_rot)?;
    }
    let key = |k: &str| format!("{arch}.ssm.{k}");
    let ssm = SsmParams {
        d_conv: u32_key(file, &key("conv_kernel"))?,
        s: u32_key(file, &key("state_size"))?,
        h_k: u32_key(file, &key("group_count"))?,
        h_v: u32_key(file, &key("time_step_rank"))?,
    };
    let inner = u32_key(file, &key("inner_size"))?;
    if inner != ssm.value_dim() || !ssm.h_v.is_multiple_of(ssm.h_k) {
        return Err(ModelError::BadHparam {
            key: key("inner_size"),
            value: inner.to_string(),
            reason: format!(
                "must be time_step_rank x state_size = {} with time_step_rank a multiple of \
                 group_count {}",
                ssm.value_dim(),
                ssm.h_k
            ),
        });
    }
    let recurrent = recurrent_layers(file, arch, hp.n_layer)?;
    let (tok_embd, output_norm, output, tied) = Weights::globals(file, hp.n_embd, hp.n_vocab)?;
    let ne = hp.n_embd;
    let mut layers = Vec::with_capacity(hp.n_layer);
    for (il, &rec) in recurrent.iter().enumerate() {
        let attn_norm = vector(file, &blk(il, "attn_norm"), ne)?;
        let mixer = if rec {
            let (c, vd) = (ssm.channels(), ssm.value_dim());
            let conv = matrix(file, &blk(il, "ssm_conv1d"), ssm.d_conv, c)?;
            let f32_only = |w: &WeightRef| {
                if w.wtype.0 != GgmlType::F32.id() {
                    return Err(ModelError::UnsupportedTensor {
                        name: w.name.clone(),
                        reason: "the convolution weight is read as plain floats and must be F32"
                            .into(),
                    });
                }
                Ok(())
            };
            f32_only(&conv)?;
            let a_name = format!("blk.{il}.ssm_a");
            if file.tensor(&blk(il, "attn_qkv")).is_none() {
                if let Some(name) = [blk(il, "ssm_in")]
                    .into_iter()
                    .find(|n| file.tensor(n).is_some())
                {
                    return Err(ModelError::UnsupportedTensor {
                        name,
                        reason: "the older fused q|k|v|z projection grouped by key head is not \
                                 supported; convert the model again (attn_qkv and attn_gate)"
                            .into(),
                    });
                }
            }
            let ba = if next {
                BetaAlpha::Joint(matrix(file, &blk(il, "ssm_ba"), ne, 2 * ssm.h_v)?)
            } else {
                BetaAlpha::Separate {
                    beta: matrix(file, &blk(il, "ssm_beta"), ne, ssm.h_v)?,
                    alpha: matrix(file, &blk(il, "ssm_alpha"), ne, ssm.h_v)?,
                }
            };
            Mixer::Linear(LinearW {
                qkv: matrix(file, &blk(il, "attn_qkv"), ne, c)?,
                gate: matrix(file, &blk(il, "attn_gate"), ne, vd)?,
                conv,
                dt_bias: vector(file, &blk_bias(il, "ssm_dt"), ssm.h_v)?,
                a: vector(file, &a_name, ssm.h_v)?,
                ba,
                norm: vector(file, &blk(il, "ssm_norm"), ssm.s)?,
                out: matrix(file, &blk(il, "ssm_out"), vd, ne)?,
            })
        } else {
            Mixer::Attn(AttnW {
                wq: matrix(file, &blk(il, "attn_q"), ne, 2 * hp.n_q_embd())?,
                wk: matrix(file, &blk(il, "attn_k"), ne, hp.n_kv_embd())?,
                wv: matrix(file, &blk(il, "attn_v"), ne, hp.n_kv_embd())?,
                wo: matrix(file, &blk(il, "attn_output"), hp.n_q_embd(), ne)?,
                q_norm: vector(file, &blk(il, "attn_q_norm"), hd)?,
                k_norm: vector(file, &blk(il, "attn_k_norm"), hd)?,
            })
        };
        layers.push(Layer {
            attn_norm,
            post_norm: vector(file, &blk(il, "post_attention_norm"), ne)?,
            mixer,
            ffn: read_ffn(file, il, &hp, moe.as_ref(), next)?,
        });
    }
    let globals = Weights {
        tok_embd,
        output_norm,
        output,
        tied,
        rope_freqs: None,
        layers: Vec::new(),
    };
    hp.moe = moe;
    Ok(Box::new(Qwen35 {
        arch,
        hp,
        n_rot,
        ssm,
        globals,
        layers,
    }))
}

impl ModelDef for Qwen35 {
    fn arch(&self) -> &'static str {
        self.arch
    }

    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build_graph(&self, p: &GraphParams) -> ComputeGraph {
        graph::build(self, p)
    }

    fn weights(&self) -> Vec<WeightRef> {
        let g = &self.globals;
        let mut v = vec![g.tok_embd.clone()];
        for l in &self.layers {
            v.push(l.attn_norm.clone());
            match &l.mixer {
                Mixer::Attn(w) => v.extend(
                    [&w.wq, &w.wk, &w.wv, &w.wo, &w.q_norm, &w.k_norm]
                        .into_iter()
                        .cloned(),
                ),
                Mixer::Linear(w) => v.extend(
                    [&w.qkv, &w.gate, &w.conv, &w.dt_bias, &w.a, &w.norm, &w.out]
                        .into_iter()
                        .cloned()
                        .chain(match &w.ba {
                            BetaAlpha::Separate { beta, alpha } => {
                                vec![beta.clone(), alpha.clone()]
                            }
                            BetaAlpha::Joint(ba) => vec![ba.clone()],
                        }),
                ),
            }
            v.push(l.post_norm.clone());
            v.extend(l.ffn.all().into_iter().cloned());
        }
        v.push(g.output_norm.clone());
        if !g.tied {
            v.push(g.output.clone());
        }
        v
    }

    fn tied_output(&self) -> bool {
        self.globals.tied
    }

    fn active_params(&self) -> u64 {
        let n = |w: &WeightRef| (w.shape[0] * w.shape[1]) as u64;
        let mut total: u64 = self.weights().iter().map(n).sum();
        for l in &self.layers {
            if let Ffn::Moe(m) = &l.ffn {
                total -= m.all().into_iter().map(n).sum::<u64>();
                total += m.active_params();
            }
        }
        total
    }

    fn recurrent_layers(&self) -> Vec<bool> {
        self.layers
            .iter()
            .map(|l| matches!(l.mixer, Mixer::Linear(_)))
            .collect()
    }

    fn recurrent_state_floats(&self) -> usize {
        // Per layer the graph's RecurrentMeta: (d_conv - 1) x channels conv values and
        // h_v matrices of s x s.
        let per_layer = self.ssm.d_conv.saturating_sub(1) * self.ssm.channels()
            + self.ssm.h_v * self.ssm.s * self.ssm.s;
        let layers = self.recurrent_layers().iter().filter(|&&r| r).count();
        layers * per_layer
    }
}
