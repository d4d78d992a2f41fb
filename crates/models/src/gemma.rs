//! Gemma 2 and Gemma 3: the shared skeleton with NEOX rope, the token embeddings scaled
//! by `sqrt(n_embd)`, a sandwich of RMS norms around attention and FFN (`attn_norm`,
//! `post_attention_norm`, `ffn_norm`, `post_ffw_norm`; the converter stores Gemma's `1 + w`
//! norm scales already shifted, so they are plain RMSNorm weights here), a GELU-gated FFN,
//! and local (sliding-window) layers interleaved with global ones. Gemma 2 soft-caps the
//! attention scores and the logits; Gemma 3 has a per-head q/k norm instead, a separate
//! rope base for its local layers, and an optional final cap.
//!
//! Hyperparameters beyond the shared ones, as llama.cpp reads them:
//!
//! * `attention.sliding_window`: the local window (Gemma 2: 4096 when absent; Gemma 3:
//!   absent or 0 means every layer is global);
//! * `attention.sliding_window_pattern`: a per-layer array (true = local), or a period
//!   `n` (Gemma 2: 2, Gemma 3: 6 when absent) making layer `il` local unless
//!   `il % n == n - 1` (`n = 0`: every layer local);
//! * `rope.freq_base_swa`: the local layers' rope theta (Gemma 2: the global theta when
//!   absent, with the global linear scale; Gemma 3: 10000, unscaled); global layers use
//!   `rope.freq_base` and `rope.scaling.*`;
//! * `attn_logit_softcapping` (Gemma 2, 50 when absent) and `final_logit_softcapping`
//!   (Gemma 2: 30 when absent; Gemma 3: no cap when absent or 0);
//! * the score scale is `1/sqrt(head_dim)`, except for the 27B models (46 layers for
//!   Gemma 2, 62 for Gemma 3) whose queries are scaled by `1/sqrt(n_embd / n_head)`.
//!
//! The lm head is the token embedding; Gemma 3 files may carry an `output.weight`, which
//! is then used, and a Gemma 2 file with one is refused (llama.cpp would not load it).

use minfer_gguf::{GgufFile, MetaValue};
use minfer_graph::RopeStyle;

use crate::common::{qkv_block, qkv_norm_block, LayerAttn, QkvBlock, Terms};
use crate::error::ModelError;
use crate::hparams::HParams;
use crate::model::Decoder;
use crate::weights::{blk, vector, LayerWeights, Weights, OUTPUT};
use crate::ModelDef;

/// The `general.architecture` value of Gemma 2.
pub const ARCH_GEMMA2: &str = "gemma2";
/// The `general.architecture` value of Gemma 3.
pub const ARCH_GEMMA3: &str = "gemma3";

/// Reads and validates a Gemma 2 model's hyperparameters and tensors.
pub fn load_gemma2(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    load(file, Gen::Two)
}

/// Reads and validates a Gemma 3 model's hyperparameters and tensors.
pub fn load_gemma3(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    load(file, Gen::Three)
}

/// The generation, which fixes the defaults and the optional parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gen {
    Two,
    Three,
}

impl Gen {
    fn arch(self) -> &'static str {
        match self {
            Gen::Two => ARCH_GEMMA2,
            Gen::Three => ARCH_GEMMA3,
        }
    }

    /// Layer count of the 27B model, whose query scale follows `n_embd / n_head`.
    fn layers_27b(self) -> usize {
        match self {
            Gen::Two => 46,
            Gen::Three => 62,
        }
    }
}

fn load(file: &GgufFile, g: Gen) -> Result<Box<dyn ModelDef>, ModelError> {
    let arch = g.arch();
    let hp = HParams::read(file, arch, RopeStyle::NonInterleaved)?;
    if g == Gen::Two && file.tensor(OUTPUT).is_some() {
        return Err(ModelError::UnsupportedTensor {
            name: OUTPUT.into(),
            reason: format!("{arch} ties the lm head to the token embedding"),
        });
    }
    let (tok_embd, output_norm, output, tied) = Weights::globals(file, hp.n_embd, hp.n_vocab)?;
    let (ne, hd) = (hp.n_embd, hp.head_dim);
    let layers = (0..hp.n_layer)
        .map(|il| {
            // The shared tensors first, so a shape error names the first tensor in file order.
            let core = LayerWeights::read(file, il, &hp)?;
            let qk_norm = match g {
                Gen::Two => None,
                Gen::Three => Some([
                    vector(file, &blk(il, "attn_q_norm"), hd)?,
                    vector(file, &blk(il, "attn_k_norm"), hd)?,
                ]),
            };
            Ok(LayerWeights {
                qk_norm,
                post_norms: Some([
                    vector(file, &blk(il, "post_attention_norm"), ne)?,
                    vector(file, &blk(il, "post_ffw_norm"), ne)?,
                ]),
                ..core
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let weights = Weights {
        tok_embd,
        output_norm,
        output,
        tied,
        rope_freqs: None,
        layers,
    };
    let terms = read_terms(file, g, &hp)?;
    let qkv: QkvBlock = match g {
        Gen::Two => qkv_block,
        Gen::Three => qkv_norm_block,
    };
    Ok(Box::new(
        Decoder::new(arch, hp, weights, qkv).with_terms(terms),
    ))
}

/// The skeleton terms of a Gemma file: embedding scale, GeGLU, caps and the per-layer
/// attention (window, rope, score scale).
fn read_terms(file: &GgufFile, g: Gen, hp: &HParams) -> Result<Terms, ModelError> {
    let arch = g.arch();
    let key = |name: &str| format!("{arch}.{name}");
    let opt_u32 = |name: &str| -> Result<Option<u32>, ModelError> {
        let k = key(name);
        Ok(match file.get(&k) {
            Some(_) => Some(file.get_u32(&k)?),
            None => None,
        })
    };
    let opt_f32 = |name: &str| -> Result<Option<f32>, ModelError> {
        let k = key(name);
        Ok(match file.get(&k) {
            Some(_) => Some(file.get_f32(&k)?),
            None => None,
        })
    };
    let window = match (opt_u32("attention.sliding_window")?, g) {
        (Some(w), _) if w > 0 => Some(w as usize),
        (Some(w), Gen::Two) => {
            return Err(bad(
                &key("attention.sliding_window"),
                w,
                "a window must hold at least the token's own row",
            ))
        }
        (None, Gen::Two) => Some(4096),
        (_, Gen::Three) => None,
    };
    let local = match window {
        Some(_) => {
            let default = match g {
                Gen::Two => 2,
                Gen::Three => 6,
            };
            local_layers(file, arch, default, hp.n_layer)?
        }
        None => vec![false; hp.n_layer],
    };

    let (local_base, local_scale) = match g {
        Gen::Two => (hp.rope_freq_base, hp.rope_freq_scale),
        Gen::Three => (crate::hparams::DEFAULT_ROPE_FREQ_BASE, 1.0),
    };
    let base_key = "rope.freq_base_swa";
    let local_base = match opt_f32(base_key)? {
        Some(b) if b.is_finite() && b > 0.0 => b,
        Some(b) => return Err(bad(&key(base_key), b, "must be a positive number")),
        None => local_base,
    };

    let head_width = if hp.n_layer == g.layers_27b() {
        hp.n_embd / hp.n_head
    } else {
        hp.head_dim
    };
    let scale = 1.0 / (head_width as f32).sqrt();
    let (attn_cap, final_softcap) = soft_caps(
        g,
        opt_f32("attn_logit_softcapping")?,
        opt_f32("final_logit_softcapping")?,
    )?;

    let layers = local
        .iter()
        .map(|&is_local| LayerAttn {
            window: window.filter(|_| is_local),
            softcap: attn_cap,
            scale,
            rope_base: if is_local {
                local_base
            } else {
                hp.rope_freq_base
            },
            rope_scale: if is_local {
                local_scale
            } else {
                hp.rope_freq_scale
            },
        })
        .collect();
    Ok(Terms {
        embd_scale: Some((hp.n_embd as f32).sqrt()),
        gelu: true,
        final_softcap,
        layers,
    })
}

/// The attention-score and final-logit caps from their keys' values (`None`: absent):
/// Gemma 2 always has both (50 and 30 by default), Gemma 3 only a final cap it names
/// (0 meaning none).
fn soft_caps(
    g: Gen,
    attn: Option<f32>,
    fin: Option<f32>,
) -> Result<(Option<f32>, Option<f32>), ModelError> {
    let cap = |name: &str, v: f32| {
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            let key = format!("{}.{name}", g.arch());
            Err(bad(&key, v, "a soft-cap must be a positive number"))
        }
    };
    let (a, f) = ("attn_logit_softcapping", "final_logit_softcapping");
    Ok(match g {
        Gen::Two => (
            Some(cap(a, attn.unwrap_or(50.0))?),
            Some(cap(f, fin.unwrap_or(30.0))?),
        ),
        // llama.cpp has no score cap for Gemma 3 and ignores the key.
        Gen::Three => (
            None,
            fin.filter(|&v| v != 0.0).map(|v| cap(f, v)).transpose()?,
        ),
    })
}

/// Which layers are local (sliding-window): the per-layer array of `{arch}.attention.
/// sliding_window_pattern`, or its period (`default` when absent), layer `il` being local
/// unless `il % n == n - 1` (`n = 0`: every layer), as llama.cpp's `set_swa_pattern`.
pub(crate) fn local_layers(
    file: &GgufFile,
    arch: &str,
    default: usize,
    n_layer: usize,
) -> Result<Vec<bool>, ModelError> {
    let k = format!("{arch}.attention.sliding_window_pattern");
    let period = match file.get(&k) {
        Some(MetaValue::Array(_, items)) => {
            if items.len() != n_layer {
                return Err(bad(
                    &k,
                    format!("{} entries", items.len()),
                    &format!("the per-layer pattern must have one entry per layer ({n_layer})"),
                ));
            }
            return items
                .iter()
                .map(|v| match v {
                    MetaValue::Bool(b) => Ok(*b),
                    MetaValue::U32(x) => Ok(*x != 0),
                    MetaValue::I32(x) => Ok(*x != 0),
                    other => Err(bad(&k, format!("{other:?}"), "entries must be booleans")),
                })
                .collect();
        }
        Some(_) => file.get_u32(&k)? as usize,
        None => default,
    };
    Ok((0..n_layer)
        .map(|il| period == 0 || il % period < period - 1)
        .collect())
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
    use crate::testing::{tiny_model_bytes, TinySpec};
    use minfer_gguf::GgmlType;
    use minfer_graph::{AttnMeta, NodeMeta, Op};

    fn terms_of(g: Gen, edit: impl FnOnce(&mut minfer_gguf::GgufWriter)) -> Terms {
        let spec = match g {
            Gen::Two => TinySpec::gemma2(GgmlType::F32, 1),
            Gen::Three => TinySpec::gemma3(GgmlType::F32, 1),
        };
        let mut w = crate::testing::tiny_model_writer(&spec).unwrap();
        edit(&mut w);
        let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let hp = HParams::read(&file, g.arch(), RopeStyle::NonInterleaved).unwrap();
        read_terms(&file, g, &hp).unwrap()
    }

    #[test]
    fn the_layer_patterns_follow_llama_cpp() {
        // Gemma 2's period 2: even layers local. Gemma 3's period 6: every sixth global.
        let t = terms_of(Gen::Two, |_| {});
        let local: Vec<bool> = t.layers.iter().map(|l| l.window.is_some()).collect();
        assert_eq!(local, [true, false, true, false]);
        let t = terms_of(Gen::Three, |_| {});
        let local: Vec<bool> = t.layers.iter().map(|l| l.window.is_some()).collect();
        assert_eq!(local, [true, true, true, true, true, false, true]);
        // A per-layer array overrides the period.
        let t = terms_of(Gen::Three, |w| {
            let flags = [false, true, true, true, true, true, false];
            w.add_meta(
                "gemma3.attention.sliding_window_pattern",
                MetaValue::Array(
                    minfer_gguf::MetaType::Bool,
                    flags.iter().map(|&b| MetaValue::Bool(b)).collect(),
                ),
            );
        });
        assert_eq!(t.layers[0].window, None);
        assert_eq!(t.layers[1].window, Some(4));
    }

    #[test]
    fn local_and_global_rope_caps_and_scale_follow_the_generation() {
        let t = terms_of(Gen::Two, |_| {});
        assert_eq!(t.final_softcap, Some(crate::testing::TINY_GEMMA2_FINAL_CAP));
        assert!(t
            .layers
            .iter()
            .all(|l| l.softcap == Some(crate::testing::TINY_GEMMA2_ATTN_CAP)));
        // llama.cpp's defaults when the keys are absent; zero or negative caps refused.
        assert_eq!(
            soft_caps(Gen::Two, None, None).unwrap(),
            (Some(50.0), Some(30.0))
        );
        assert!(soft_caps(Gen::Two, Some(0.0), None).is_err());
        assert_eq!(
            soft_caps(Gen::Three, Some(50.0), Some(0.0)).unwrap(),
            (None, None)
        );
        assert_eq!(
            soft_caps(Gen::Three, None, Some(30.0)).unwrap(),
            (None, Some(30.0))
        );
        assert!(soft_caps(Gen::Three, None, Some(-1.0)).is_err());
        assert!(t
            .layers
            .iter()
            .all(|l| l.rope_base == t.layers[1].rope_base));
        let t = terms_of(Gen::Three, |_| {});
        assert_eq!(t.final_softcap, None);
        assert!(t.layers.iter().all(|l| l.softcap.is_none()));
        let (local, global) = (&t.layers[0], &t.layers[5]);
        assert_eq!((local.rope_base, local.rope_scale), (10000.0, 1.0));
        assert_eq!(global.rope_base, crate::testing::TINY_GEMMA3_ROPE_BASE);
        assert_eq!(global.rope_scale, 0.5);
        assert_eq!(local.scale, 1.0 / 32f32.sqrt());
        assert_eq!(t.embd_scale, Some(64f32.sqrt()));
        // Without a window every layer is global.
        let no_swa = terms_of(Gen::Three, |w| {
            w.add_meta("gemma3.attention.sliding_window", MetaValue::U32(0));
        });
        assert!(no_swa.layers.iter().all(|l| l.window.is_none()));
    }

    fn model(spec: &TinySpec) -> Box<dyn ModelDef> {
        let file = GgufFile::from_bytes(tiny_model_bytes(spec).unwrap()).unwrap();
        crate::load_model(&file).unwrap()
    }

    fn attn_metas(g: &minfer_graph::ComputeGraph) -> Vec<&AttnMeta> {
        g.nodes
            .iter()
            .filter_map(|n| match (&n.op, &n.meta) {
                (Op::Attn { .. }, NodeMeta::Attn(m)) => Some(m),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn gemma_graphs_carry_the_scale_sandwich_geglu_caps_and_windows() {
        let p = crate::params::prefill(8, 1, crate::params::cpu_cparams(64)).unwrap();
        let m3 = model(&TinySpec::gemma3(GgmlType::F32, 3));
        assert!(m3.tied_output());
        // 2 globals + 13 per layer (q/k norms and the two post norms included).
        assert_eq!(m3.weight_names().len(), 2 + 13 * 7);
        let g = m3.build_graph(&p);
        g.validate().unwrap();
        let count = |op: &dyn Fn(&Op) -> bool| g.nodes.iter().filter(|n| op(&n.op)).count();
        assert_eq!(
            count(&|o| *o == Op::Scale(8.0)),
            1,
            "sqrt(64) embedding scale"
        );
        assert_eq!(count(&|o| *o == Op::Gelu), 7);
        assert_eq!(count(&|o| matches!(o, Op::QkNorm { .. })), 14);
        assert_eq!(count(&|o| matches!(o, Op::SoftCap(_))), 0);
        let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
        for want in [
            "inp_scaled",
            "attn_post_norm-0",
            "ffn_post_norm-6",
            "result_output",
        ] {
            assert!(names.contains(&want), "no {want}");
        }
        let windows: Vec<Option<usize>> = attn_metas(&g).iter().map(|m| m.window).collect();
        let mut want = vec![Some(4); 7];
        want[5] = None;
        assert_eq!(windows, want);
        // No fused SwiGLU FFN for a GELU model, even where the flags allow it.
        let gpu = minfer_graph::CParams {
            gpu: true,
            fuse_qkv: true,
            fuse_ffn: true,
            ..crate::params::cpu_cparams(64)
        };
        let d = m3.build_graph(&crate::params::decode(gpu).unwrap());
        assert!(d.nodes.iter().all(|n| n.op != Op::FusedFFN));
        assert!(m3
            .concat_weights()
            .iter()
            .all(|c| !c.name.contains("gate_up")));

        let m2 = model(&TinySpec::gemma2(GgmlType::F32, 3));
        let g = m2.build_graph(&p);
        let last = g.nodes[g.outputs[0]].clone();
        assert_eq!(last.op, Op::SoftCap(crate::testing::TINY_GEMMA2_FINAL_CAP));
        let metas = attn_metas(&g);
        assert!(metas
            .iter()
            .all(|m| m.softcap == Some(crate::testing::TINY_GEMMA2_ATTN_CAP)));
        assert_eq!(
            metas.iter().map(|m| m.window).collect::<Vec<_>>(),
            [Some(4), None, Some(4), None]
        );
    }

    #[test]
    fn a_gemma2_file_with_an_lm_head_is_refused_by_name() {
        let spec = TinySpec::gemma2(GgmlType::F32, 1);
        let mut w = crate::testing::tiny_model_writer(&spec).unwrap();
        let head = vec![0.0f32; spec.n_embd * spec.n_vocab];
        let dims = [spec.n_embd as u64, spec.n_vocab as u64];
        w.add_tensor_f32(OUTPUT, &dims, GgmlType::F32, &head)
            .unwrap();
        let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let e = crate::load_model(&file).err().unwrap().to_string();
        assert!(e.contains("output.weight") && e.contains("ties"), "{e}");
    }
}
