//! One encoder block of the BERT family: its tensors (separate or fused Q/K/V, a GELU or
//! a SwiGLU FFN, the two post-norms) and its part of the graph, the same for `bert` and
//! `nomic-bert` but for the switches [`Variant`] names.

use minfer_gguf::GgufFile;
use minfer_graph::{AttnMeta, AttnMode, GraphBuilder, GraphParams, NodeId, RoPEMeta, WeightRef};

use super::{affine, norm, Affine, Variant};
use crate::common::Inputs;
use crate::error::ModelError;
use crate::hparams::HParams;
use crate::tensors::{blk, blk_bias, matrix};

/// The attention's input projections.
enum Qkv {
    /// `attn_q`, `attn_k`, `attn_v`, each with its optional bias.
    Split { q: Affine, k: Affine, v: Affine },
    /// `attn_qkv` (`[n_embd, 3 n_embd]`, rows q|k|v) and its optional bias.
    Fused(Affine),
}

/// The feed-forward block.
enum Ffn {
    /// BERT's: `down(gelu(up(x)))`, each matrix with its optional bias.
    Gelu { up: Affine, down: Affine },
    /// nomic-bert's: `down(silu(gate(x)) * up(x))`, no biases.
    SwiGlu {
        gate: WeightRef,
        up: WeightRef,
        down: WeightRef,
    },
}

/// One block's weights.
pub(super) struct Layer {
    qkv: Qkv,
    out: Affine,
    attn_norm: [WeightRef; 2],
    ffn: Ffn,
    out_norm: [WeightRef; 2],
}

/// Refuses the tensor `name` when the file has it, saying `why`: a tensor this variant's
/// graph has no term for (running without it would compute another model).
fn refuse(file: &GgufFile, name: String, why: &str) -> Result<(), ModelError> {
    match file.tensor(&name) {
        Some(_) => Err(ModelError::UnsupportedTensor {
            name,
            reason: why.to_string(),
        }),
        None => Ok(()),
    }
}

impl Layer {
    /// Layer `il` of a `variant` file of width `d` and FFN width `f`.
    pub(super) fn load(
        file: &GgufFile,
        variant: Variant,
        il: usize,
        d: usize,
        f: usize,
    ) -> Result<Layer, ModelError> {
        let arch = variant.arch();
        // jina-bert's extra norms: no term for them in either variant's graph.
        for name in ["attn_q_norm", "attn_k_norm", "attn_norm_2"] {
            refuse(
                file,
                blk(il, name),
                &format!("a BERT variant's tensor; the {arch} graph has no term for it"),
            )?;
        }
        let a = |name: &str, i, o| affine(file, &blk(il, name), &blk_bias(il, name), i, o);
        let qkv = if file.tensor(&blk(il, "attn_qkv")).is_some() {
            let fused = blk(il, "attn_qkv");
            for name in ["attn_q", "attn_k", "attn_v"] {
                let why = format!("a separate projection beside the fused {fused}");
                refuse(file, blk(il, name), &why)?;
                // llama.cpp would add these to the fused rows; the graph has no term
                // for a bias split from its matrix.
                refuse(
                    file,
                    blk_bias(il, name),
                    "a separate bias of a fused attn_qkv",
                )?;
            }
            Qkv::Fused(a("attn_qkv", d, 3 * d)?)
        } else {
            Qkv::Split {
                q: a("attn_q", d, d)?,
                k: a("attn_k", d, d)?,
                v: a("attn_v", d, d)?,
            }
        };
        let ffn = match variant {
            Variant::Bert => {
                refuse(
                    file,
                    blk(il, "ffn_gate"),
                    "a gated FFN's tensor; the bert graph has no term for it",
                )?;
                Ffn::Gelu {
                    up: a("ffn_up", d, f)?,
                    down: a("ffn_down", f, d)?,
                }
            }
            Variant::Nomic => {
                // llama.cpp loads these biases but its nomic-bert graph never adds them:
                // a file with them would not compute the model it was converted from.
                for name in ["ffn_up", "ffn_gate", "ffn_down"] {
                    refuse(
                        file,
                        blk_bias(il, name),
                        "an FFN bias; the nomic-bert FFN has none",
                    )?;
                }
                Ffn::SwiGlu {
                    gate: matrix(file, &blk(il, "ffn_gate"), d, f)?,
                    up: matrix(file, &blk(il, "ffn_up"), d, f)?,
                    down: matrix(file, &blk(il, "ffn_down"), f, d)?,
                }
            }
        };
        Ok(Layer {
            qkv,
            out: a("attn_output", d, d)?,
            attn_norm: norm(file, &format!("blk.{il}.attn_output_norm"), d)?,
            ffn,
            out_norm: norm(file, &format!("blk.{il}.layer_output_norm"), d)?,
        })
    }

    /// The layer's weights, each once.
    pub(super) fn weights(&self) -> Vec<WeightRef> {
        let mut affines: Vec<&Affine> = match &self.qkv {
            Qkv::Split { q, k, v } => vec![q, k, v],
            Qkv::Fused(qkv) => vec![qkv],
        };
        affines.push(&self.out);
        let mut out = Vec::new();
        match &self.ffn {
            Ffn::Gelu { up, down } => affines.extend([up, down]),
            Ffn::SwiGlu { gate, up, down } => out.extend([gate, up, down].map(Clone::clone)),
        }
        for (w, bias) in affines {
            out.push(w.clone());
            out.extend(bias.iter().cloned());
        }
        out.extend(self.attn_norm.iter().chain(&self.out_norm).cloned());
        out
    }

    /// Layer `il` from its input `h` to its output; `rope` rotates q and k (nomic-bert),
    /// `None` leaves them as projected (BERT's positions are in its input rows).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn build(
        &self,
        b: &mut GraphBuilder,
        hp: &HParams,
        il: usize,
        h: NodeId,
        x: &Inputs,
        p: &GraphParams,
        rope: Option<&RoPEMeta>,
    ) -> NodeId {
        let n = |b: &mut GraphBuilder, id: NodeId, name: &str| {
            b.set_name(id, &format!("{name}-{il}"));
            id
        };
        let mm = |b: &mut GraphBuilder, x: NodeId, (w, bias): &Affine, name: &str| {
            let id = b.matmul(x, w, bias.as_ref());
            b.set_name(id, &format!("{name}-{il}"));
            id
        };
        let (mut q, mut k, v) = match &self.qkv {
            Qkv::Split { q, k, v } => (
                mm(b, h, q, "Qcur"),
                mm(b, h, k, "Kcur"),
                mm(b, h, v, "Vcur"),
            ),
            Qkv::Fused(w) => {
                let d = hp.n_embd;
                let qkv = mm(b, h, w, "wqkv");
                let q = b.slice(qkv, 3 * d, 0, d);
                let k = b.slice(qkv, 3 * d, d, d);
                let v = b.slice(qkv, 3 * d, 2 * d, d);
                (n(b, q, "Qcur"), n(b, k, "Kcur"), n(b, v, "Vcur"))
            }
        };
        if let Some(meta) = rope {
            q = b.rope(q, x.pos, meta.style, meta.clone());
            q = n(b, q, "Qrope");
            k = b.rope(k, x.pos, meta.style, meta.clone());
            k = n(b, k, "Krope");
        }
        let n_ctx = p.cparams.n_ctx;
        let st = b.kvcache_store(il, k, v, x.cells.unwrap_or(x.pos), n_ctx, None);
        n(b, st, "kv_store");
        let kv = b.kvcache_load(il, hp.n_kv_embd(), n_ctx, hp.n_head_kv, None);
        n(b, kv, "kv_load");
        let meta = AttnMeta {
            layer: il,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            hd: hp.head_dim,
            scale: 1.0 / (hp.head_dim as f32).sqrt(),
            n_ctx,
            window: None,
            softcap: None,
            ring: None,
            sinks: None,
            causal: false,
        };
        let attn = b.attn(q, kv, x.pos, x.span, AttnMode::Gqa, meta);
        let attn = n(b, attn, "kqv_out");
        let attn = mm(b, attn, &self.out, "attn_out");
        let cur = b.add(attn, h);
        let cur = n(b, cur, "attn_res");
        let [w, bias] = &self.attn_norm;
        let cur = b.layer_norm(cur, Some(w), Some(bias), hp.rms_eps);
        let ffn_inp = n(b, cur, "ffn_inp");
        let down = match &self.ffn {
            Ffn::Gelu { up, down } => {
                let up = mm(b, ffn_inp, up, "ffn_up");
                let act = b.gelu(up);
                let act = n(b, act, "ffn_gelu");
                mm(b, act, down, "ffn_out")
            }
            Ffn::SwiGlu { gate, up, down } => {
                let up = b.matmul(ffn_inp, up, None);
                let up = n(b, up, "ffn_up");
                let gate = b.matmul(ffn_inp, gate, None);
                let gate = n(b, gate, "ffn_gate");
                let act = b.swiglu(gate, up);
                let act = n(b, act, "ffn_swiglu");
                let down = b.matmul(act, down, None);
                n(b, down, "ffn_out")
            }
        };
        let cur = b.add(down, ffn_inp);
        let cur = n(b, cur, "ffn_res");
        let [w, bias] = &self.out_norm;
        let out = b.layer_norm(cur, Some(w), Some(bias), hp.rms_eps);
        n(b, out, "l_out")
    }
}
