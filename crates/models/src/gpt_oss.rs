//! gpt-oss (OpenAI's gpt-oss-20b and -120b; llama.cpp's `LLM_ARCH_OPENAI_MOE`): the shared
//! skeleton with NEOX rope, biases on q, k, v and the attention output, attention sinks
//! (one learned logit per query head in the softmax's normaliser, `AttnMeta::sinks`),
//! sliding-window layers alternating with full ones, and a routed-expert FFN in every
//! layer ([`crate::moe`]) whose router and experts carry biases and whose experts are
//! gated by the clamped SwiGLU (`Glu::Oai`, alpha 1.702, limit 7). The FFN's norm is
//! `post_attention_norm` (there is no `ffn_norm`). Gate values are the softmax over the
//! chosen experts' logits (llama.cpp's `SOFTMAX_WEIGHT` gating), built as the full softmax
//! renormalised over the chosen experts, equal up to rounding.
//!
//! Hyperparameters beyond the shared ones, as llama.cpp reads them:
//!
//! * `attention.sliding_window` (required) and `attention.sliding_window_pattern` (a
//!   per-layer array, or a period: 2 when absent, so even layers are local and odd ones
//!   global);
//! * `rope.freq_base_swa`: the local layers' theta (the global one when absent); both
//!   kinds share the model's rope scaling, YaRN in the published files
//!   (`rope.scaling.type` `yarn`, factor 32 over `original_context_length` 4096);
//! * `expert_feed_forward_length` and the expert counts ([`MoeParams`]).
//!
//! Per layer `il`: `attn_norm`, `attn_{q,k,v,output}` with their `.bias`, `attn_sinks
//! [n_head]`, `post_attention_norm`, `ffn_gate_inp` with its bias `[n_expert]`, and the
//! stacked `ffn_{gate,up,down}_exps` with biases `[n_ff_exp or n_embd, n_expert]`.

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::{Glu, RopeStyle, WeightRef};

use crate::common::{qkv_block, LayerAttn, Terms};
use crate::error::ModelError;
use crate::gemma::local_layers;
use crate::hparams::{HParams, MoeParams};
use crate::model::Decoder;
use crate::moe::MoeFfn;
use crate::weights::{blk, blk_bias, matrix, vector, Ffn, LayerWeights, Weights};
use crate::ModelDef;

/// The `general.architecture` value.
pub const ARCH: &str = "gpt-oss";

/// The clamped SwiGLU of gpt-oss's experts (llama.cpp's `LLM_FFN_SWIGLU_OAI_MOE`).
pub const GPT_OSS_GLU: Glu = Glu::Oai {
    alpha: 1.702,
    limit: 7.0,
};

/// Reads and validates a gpt-oss model's hyperparameters and tensors.
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    let mut hp = HParams::read(file, ARCH, RopeStyle::NonInterleaved)?;
    let moe = MoeParams::read(file, ARCH, &hp)?;
    refuse_keys(file, &hp)?;
    let (tok_embd, output_norm, output, tied) = Weights::globals(file, hp.n_embd, hp.n_vocab)?;
    let (ne, nq, nkv) = (hp.n_embd, hp.n_q_embd(), hp.n_kv_embd());
    let (nf, nx) = (moe.n_ff_exp, moe.n_expert);
    let layers = (0..hp.n_layer)
        .map(|il| {
            let mut ffn = MoeFfn::read(file, il, &hp, &moe, true, false)?;
            ffn.router_bias = Some(vector(file, &blk_bias(il, "ffn_gate_inp"), nx)?);
            ffn.expert_biases = Some([
                expert_bias(file, &blk_bias(il, "ffn_gate_exps"), nf, nx)?,
                expert_bias(file, &blk_bias(il, "ffn_up_exps"), nf, nx)?,
                expert_bias(file, &blk_bias(il, "ffn_down_exps"), ne, nx)?,
            ]);
            ffn.glu = GPT_OSS_GLU;
            Ok(LayerWeights {
                attn_norm: vector(file, &blk(il, "attn_norm"), ne)?,
                wq: matrix(file, &blk(il, "attn_q"), ne, nq)?,
                wk: matrix(file, &blk(il, "attn_k"), ne, nkv)?,
                wv: matrix(file, &blk(il, "attn_v"), ne, nkv)?,
                wo: matrix(file, &blk(il, "attn_output"), nq, ne)?,
                bias: Some([
                    vector(file, &blk_bias(il, "attn_q"), nq)?,
                    vector(file, &blk_bias(il, "attn_k"), nkv)?,
                    vector(file, &blk_bias(il, "attn_v"), nkv)?,
                ]),
                wo_bias: Some(vector(file, &blk_bias(il, "attn_output"), ne)?),
                sinks: Some(vector(file, &blk(il, "attn_sinks"), hp.n_head)?),
                qk_norm: None,
                ffn_norm: vector(file, &blk(il, "post_attention_norm"), ne)?,
                ffn: Ffn::Moe(Box::new(ffn)),
                post_norms: None,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let terms = read_terms(file, &hp)?;
    hp.moe = Some(moe);
    let weights = Weights {
        tok_embd,
        output_norm,
        output,
        tied,
        rope_freqs: None,
        layers,
    };
    Ok(Box::new(
        Decoder::new(ARCH, hp, weights, qkv_block).with_terms(terms),
    ))
}

/// A stacked F32 expert bias `name` of GGUF shape `[out, n_expert]`.
fn expert_bias(
    file: &GgufFile,
    name: &str,
    out: usize,
    n_expert: usize,
) -> Result<WeightRef, ModelError> {
    let w = matrix(file, name, out, n_expert)?;
    match file.tensor(name).map(|t| t.ggml_type) {
        Some(ty) if ty != GgmlType::F32 => Err(ModelError::TensorType {
            name: name.to_string(),
            ty,
            reason: "norm scales and biases must be F32",
        }),
        _ => Ok(w),
    }
}

/// Keys whose values the graph has no term for are refused by name: a rope over part
/// of the head, and a scale of the expert weights.
fn refuse_keys(file: &GgufFile, hp: &HParams) -> Result<(), ModelError> {
    let k = format!("{ARCH}.rope.dimension_count");
    if file.get(&k).is_some() {
        let n_rot = file.get_u32(&k)? as usize;
        if n_rot != hp.head_dim {
            return Err(bad(
                &k,
                n_rot,
                &format!("must equal the head dimension {}", hp.head_dim),
            ));
        }
    }
    let k = format!("{ARCH}.expert_weights_scale");
    if file.get(&k).is_some() {
        let s = file.get_f32(&k)?;
        if s != 0.0 && s != 1.0 {
            return Err(bad(&k, s, "scaled expert weights are not supported"));
        }
    }
    Ok(())
}

/// Each layer's window and rope: local layers (the pattern's) read the last
/// `sliding_window` rows with `rope.freq_base_swa`, global ones everything with
/// `rope.freq_base`; scores are scaled by `1/sqrt(head_dim)`.
fn read_terms(file: &GgufFile, hp: &HParams) -> Result<Terms, ModelError> {
    let wk = format!("{ARCH}.attention.sliding_window");
    let window = file.get_u32(&wk)? as usize;
    if window == 0 {
        return Err(bad(
            &wk,
            window,
            "a window must hold at least the token's own row",
        ));
    }
    let local = local_layers(file, ARCH, 2, hp.n_layer)?;
    let bk = format!("{ARCH}.rope.freq_base_swa");
    let local_base = match file.get(&bk) {
        None => hp.rope_freq_base,
        Some(_) => {
            let b = file.get_f32(&bk)?;
            if !(b.is_finite() && b > 0.0) {
                return Err(bad(&bk, b, "must be a positive number"));
            }
            b
        }
    };
    let layers = local
        .iter()
        .map(|&is_local| LayerAttn {
            window: is_local.then_some(window),
            rope_base: if is_local {
                local_base
            } else {
                hp.rope_freq_base
            },
            ..LayerAttn::plain(hp)
        })
        .collect();
    Ok(Terms {
        layers,
        ..Terms::default()
    })
}

fn bad(key: &str, value: impl std::fmt::Display, reason: &str) -> ModelError {
    ModelError::BadHparam {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{cpu_cparams, graph_params};
    use crate::testing::{tiny_model_bytes, tiny_model_writer, TinySpec};
    use minfer_gguf::{GgufWriter, MetaValue};
    use minfer_graph::{NodeMeta, Op};

    fn file_of(edit: impl FnOnce(&mut GgufWriter)) -> GgufFile {
        let mut w = tiny_model_writer(&TinySpec::gpt_oss(GgmlType::F32, 1)).unwrap();
        edit(&mut w);
        GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
    }

    /// Every term of the architecture reaches the graph: sinks on every attention, the
    /// window on even layers only, YaRN on every rope, biases on q/k/v/o, the router and
    /// the experts, and the clamped SwiGLU.
    #[test]
    fn the_graph_carries_every_term() {
        let spec = TinySpec::gpt_oss(GgmlType::F32, 1);
        let file = GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap();
        let m = load(&file).unwrap();
        let g = m.build_graph(&graph_params(5, 1, cpu_cparams(64)).unwrap());
        let attn: Vec<_> = g
            .nodes
            .iter()
            .filter_map(|n| match &n.meta {
                NodeMeta::Attn(a) => Some(a),
                _ => None,
            })
            .collect();
        assert_eq!(attn.len(), spec.n_layer);
        for (il, a) in attn.iter().enumerate() {
            assert_eq!(a.sinks, Some(blk(il, "attn_sinks")));
            assert_eq!(a.window, (il % 2 == 0).then_some(4), "layer {il}");
            assert_eq!(a.scale, 1.0 / (spec.head_dim as f32).sqrt());
        }
        let ropes = g.nodes.iter().filter_map(|n| match &n.meta {
            NodeMeta::Rope(r) => Some(r),
            _ => None,
        });
        for r in ropes {
            let y = r.yarn.expect("yarn");
            assert_eq!((y.n_ctx_orig, y.attn_factor), (4096, 1.0));
            assert_eq!(r.freq_scale, 1.0 / 32.0);
            assert_eq!(r.freq_base, crate::testing::TINY_GPT_OSS_ROPE_BASE);
        }
        let named = |name: &str| g.nodes.iter().find(|n| n.name == name).unwrap();
        for (node, il, bias) in [("Qcur-0", 0, "attn_q"), ("attn_out-1", 1, "attn_output")] {
            let NodeMeta::MatMul(mm) = &named(node).meta else {
                panic!("{node}");
            };
            assert_eq!(mm.bias_name, Some(blk_bias(il, bias)), "{node}");
        }
        let NodeMeta::MatMul(r) = &named("ffn_moe_logits-2").meta else {
            panic!("router");
        };
        assert_eq!(r.bias_name, Some(blk_bias(2, "ffn_gate_inp")));
        let par = named("ffn_moe_gate_par-2");
        assert_eq!(par.op, Op::MulMatIdSwiGLU);
        let NodeMeta::MatMulId(e) = &par.meta else {
            panic!("experts");
        };
        assert_eq!(e.glu, GPT_OSS_GLU);
        assert_eq!(e.gate_bias_name, Some(blk_bias(2, "ffn_gate_exps")));
        assert_eq!(e.bias_name, Some(blk_bias(2, "ffn_up_exps")));
        let NodeMeta::MatMulId(d) = &named("ffn_moe_down-2").meta else {
            panic!("down");
        };
        assert_eq!(d.bias_name, Some(blk_bias(2, "ffn_down_exps")));
        assert!(d.glu.is_silu());
        // Every weight the graph names is one the model lists.
        let names = m.weight_names();
        for n in [blk(0, "attn_sinks"), blk_bias(3, "ffn_down_exps")] {
            assert!(names.contains(&n), "{n}");
        }
    }

    #[test]
    fn missing_or_malformed_parts_are_named() {
        let e = |f: &GgufFile| load(f).err().map(|e| e.to_string()).unwrap_or_default();
        let f = file_of(|w| {
            w.add_meta("gpt-oss.attention.sliding_window", MetaValue::U32(0));
        });
        assert!(e(&f).contains("sliding_window"), "{}", e(&f));
        let f = file_of(|w| {
            w.add_meta("gpt-oss.rope.dimension_count", MetaValue::U32(16));
        });
        assert!(e(&f).contains("rope.dimension_count"), "{}", e(&f));
        let f = file_of(|w| {
            w.add_meta("gpt-oss.expert_weights_scale", MetaValue::F32(2.5));
        });
        assert!(e(&f).contains("expert_weights_scale"), "{}", e(&f));
        // The local layers' own theta.
        let f = file_of(|w| {
            w.add_meta("gpt-oss.rope.freq_base_swa", MetaValue::F32(5000.0));
        });
        let hp = HParams::read(&f, ARCH, RopeStyle::NonInterleaved).unwrap();
        let t = read_terms(&f, &hp).unwrap();
        assert_eq!(t.layers[0].rope_base, 5000.0);
        assert_eq!(
            t.layers[1].rope_base,
            crate::testing::TINY_GPT_OSS_ROPE_BASE
        );
    }
}
