//! The tensors of the tiny models' layers that are not a plain attention-and-FFN block:
//! the hybrid (Qwen3.5) layers, gpt-oss's layers, and the stacked experts of the MoE
//! families.

use minfer_gguf::{GgmlType, GgufError, GgufWriter};
use minfer_testkit::SplitMix64;

use super::{TinyMoe, TinySpec, TinySsm};
use crate::weights::{blk, blk_bias};

/// Layer `il` of a hybrid (`qwen35`) model: a Gated DeltaNet or a gated full-attention
/// mixer, `attn_norm`, `post_attention_norm` and a SwiGLU FFN. The decay factors `ssm_a`
/// are `-(0.5 + x^2 / 2)` (negative, as `-exp(A_log)` is), computed with correctly rounded
/// operations only; the convolution weight is F32 whatever the matrices' type.
pub(super) fn hybrid_layer(
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
pub(super) fn gpt_oss_layer(
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
pub(super) fn moe_tensors(
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
