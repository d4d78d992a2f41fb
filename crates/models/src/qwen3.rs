//! Qwen3: the Qwen2 skeleton without attention biases, with a per-head RMSNorm on q and
//! k (`attn_q_norm`, `attn_k_norm`, `[head_dim]` each), and a head dimension
//! (`attention.key_length`) decoupled from `n_embd / n_head` — it drives the Q/K/V/wo
//! widths, the rope dims, the attention scale and the KV row stride (design §4.4).

use minfer_gguf::GgufFile;
use minfer_graph::{FusedQkvNormMeta, GraphBuilder, NodeId, RopeStyle};

use crate::common::{named_matmul, qkv_concat_name, rope_and_store, LayerCx};
use crate::error::ModelError;
use crate::hparams::HParams;
use crate::model::Decoder;
use crate::weights::{blk, matrix, vector, LayerWeights, Weights};
use crate::ModelDef;

/// The `general.architecture` value.
pub const ARCH: &str = "qwen3";

/// Reads and validates a Qwen3 model's hyperparameters and tensors.
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    let hp = HParams::read(file, ARCH, RopeStyle::NonInterleaved)?;
    let (tok_embd, output_norm, output, tied) = Weights::globals(file, hp.n_embd, hp.n_vocab)?;
    let (nq, nkv, ne, hd) = (hp.n_q_embd(), hp.n_kv_embd(), hp.n_embd, hp.head_dim);
    let layers = (0..hp.n_layer)
        .map(|il| {
            Ok(LayerWeights {
                attn_norm: vector(file, &blk(il, "attn_norm"), ne)?,
                wq: matrix(file, &blk(il, "attn_q"), ne, nq)?,
                wk: matrix(file, &blk(il, "attn_k"), ne, nkv)?,
                wv: matrix(file, &blk(il, "attn_v"), ne, nkv)?,
                wo: matrix(file, &blk(il, "attn_output"), nq, ne)?,
                bias: None,
                qk_norm: Some([
                    vector(file, &blk(il, "attn_q_norm"), hd)?,
                    vector(file, &blk(il, "attn_k_norm"), hd)?,
                ]),
                ffn_norm: vector(file, &blk(il, "ffn_norm"), ne)?,
                gate: matrix(file, &blk(il, "ffn_gate"), ne, hp.n_ff)?,
                up: matrix(file, &blk(il, "ffn_up"), ne, hp.n_ff)?,
                down: matrix(file, &blk(il, "ffn_down"), hp.n_ff, ne)?,
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
    Ok(Box::new(Decoder::new(ARCH, hp, weights, qkv_block)))
}

/// Q/K/V for one layer. Decode with QKV fusion allowed and a concatenable q|k|v becomes
/// one `fused_qkv_norm` (concat matmul, per-head q/k norm, rope, KV store); otherwise
/// three bias-less matmuls, `qk_norm` on q and k, rope, and the KV store.
fn qkv_block(b: &mut GraphBuilder, cx: &LayerCx<'_>, normed: NodeId) -> NodeId {
    let lw = cx.lw;
    let hp = cx.hp;
    let norms = lw.qk_norm.as_ref();
    if let Some([qn, kn]) = norms.filter(|_| cx.fuse_qkv && lw.qkv_concat_feasible()) {
        let meta = FusedQkvNormMeta {
            qkv_weight: qkv_concat_name(cx.il),
            wtype: lw.wq.wtype,
            n_embd: hp.n_embd,
            nqt: hp.n_q_embd(),
            nkt: hp.n_kv_embd(),
            q_norm: qn.name.clone(),
            k_norm: kn.name.clone(),
            eps: hp.rms_eps,
            rope: cx.rope_meta(hp.n_head),
            n_ctx: cx.n_ctx,
            kv_elems: cx.kv_elems(),
        };
        let f = b.fused_qkv_norm(normed, cx.pos, cx.il, meta);
        b.set_name(f, &cx.name("qkv_fused"));
        return f;
    }
    let mut q = named_matmul(b, cx, "Qcur", normed, &lw.wq, None);
    let mut k = named_matmul(b, cx, "Kcur", normed, &lw.wk, None);
    let v = named_matmul(b, cx, "Vcur", normed, &lw.wv, None);
    // The loader always sets the norms; the graph follows the weights it was given.
    if let Some([qn, kn]) = norms {
        q = b.qk_norm(q, Some(qn), hp.head_dim, hp.n_head, hp.rms_eps);
        b.set_name(q, &cx.name("Qcur_normed"));
        k = b.qk_norm(k, Some(kn), hp.head_dim, hp.n_head_kv, hp.rms_eps);
        b.set_name(k, &cx.name("Kcur_normed"));
    }
    rope_and_store(b, cx, q, k, v)
}
