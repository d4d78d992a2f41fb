//! The graph of the hybrid models (design §4.1's inputs at the head, then per layer a
//! gated full-attention or a Gated DeltaNet mixer, each followed by the residual, the
//! post-attention norm and the FFN), from the weights `super` loaded.

use minfer_graph::{
    AttnMeta, AttnMode, ComputeGraph, DType, GraphBuilder, GraphParams, NodeId, RecurrentMeta,
    RoPEMeta, RopeStyle, WeightRef,
};

use super::{AttnW, BetaAlpha, LinearW, Mixer, Qwen35};
use crate::common::{inputs, Inputs, INPUT_STATE_SLOTS};
use crate::weights::Ffn;

/// What every layer's block reads.
struct Cx<'a> {
    il: usize,
    pos: NodeId,
    cells: NodeId,
    span: Option<NodeId>,
    slots: NodeId,
    p: &'a GraphParams,
}

impl Cx<'_> {
    fn name(&self, n: &str) -> String {
        format!("{n}-{}", self.il)
    }
}

impl Qwen35 {
    fn matmul(
        &self,
        b: &mut GraphBuilder,
        cx: &Cx<'_>,
        name: &str,
        x: NodeId,
        w: &WeightRef,
    ) -> NodeId {
        let id = b.matmul(x, w, None);
        b.set_name(id, &cx.name(name));
        id
    }

    fn rope_meta(&self, n_head: usize) -> RoPEMeta {
        RoPEMeta {
            n_dims: self.n_rot,
            freq_base: self.hp.rope_freq_base,
            freq_scale: self.hp.rope_freq_scale,
            n_head,
            hd: self.hp.head_dim,
            style: RopeStyle::NonInterleaved,
            freq_factors: None,
            yarn: self.hp.rope_yarn,
        }
    }

    /// The gated full-attention block, from the normed input to `attn_output`.
    fn attn_block(&self, b: &mut GraphBuilder, cx: &Cx<'_>, x: NodeId, w: &AttnW) -> NodeId {
        let hp = &self.hp;
        let hd = hp.head_dim;
        let n_ctx = cx.p.cparams.n_ctx;
        let qg = self.matmul(b, cx, "Qcur_full", x, &w.wq);
        let q = b.slice(qg, 2 * hd, 0, hd);
        b.set_name(q, &cx.name("Qcur"));
        let gate = b.slice(qg, 2 * hd, hd, hd);
        b.set_name(gate, &cx.name("gate"));
        let k = self.matmul(b, cx, "Kcur", x, &w.wk);
        let v = self.matmul(b, cx, "Vcur", x, &w.wv);
        let q = b.qk_norm(q, Some(&w.q_norm), hd, hp.n_head, hp.rms_eps);
        b.set_name(q, &cx.name("Qcur_normed"));
        let k = b.qk_norm(k, Some(&w.k_norm), hd, hp.n_head_kv, hp.rms_eps);
        b.set_name(k, &cx.name("Kcur_normed"));
        let q = b.rope(
            q,
            cx.pos,
            RopeStyle::NonInterleaved,
            self.rope_meta(hp.n_head),
        );
        b.set_name(q, &cx.name("Qcur_rope"));
        let k = b.rope(
            k,
            cx.pos,
            RopeStyle::NonInterleaved,
            self.rope_meta(hp.n_head_kv),
        );
        b.set_name(k, &cx.name("Kcur_rope"));
        let st = b.kvcache_store(cx.il, k, v, cx.cells, n_ctx, None);
        b.set_name(st, &cx.name("kv_store"));
        let kv = b.kvcache_load(cx.il, hp.n_kv_embd(), n_ctx, hp.n_head_kv, None);
        b.set_name(kv, &cx.name("kv_load"));
        let meta = AttnMeta {
            layer: cx.il,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            hd,
            scale: 1.0 / (hd as f32).sqrt(),
            n_ctx,
            window: None,
            softcap: None,
            ring: None,
            sinks: None,
            causal: true,
        };
        let mode = if cx.p.cparams.flash_attn {
            AttnMode::Flash
        } else {
            AttnMode::Gqa
        };
        let a = b.attn(q, kv, cx.pos, cx.span, mode, meta);
        b.set_name(a, &cx.name("attn_pregate"));
        let a = b.sigmoid_gate(a, gate);
        b.set_name(a, &cx.name("attn_gated"));
        self.matmul(b, cx, "attn_output", a, &w.wo)
    }

    /// The Gated DeltaNet block, from the normed input to `ssm_out`.
    fn linear_block(&self, b: &mut GraphBuilder, cx: &Cx<'_>, x: NodeId, w: &LinearW) -> NodeId {
        let ssm = &self.ssm;
        let meta = RecurrentMeta {
            layer: cx.il,
            slots: cx.p.cparams.state_slots.max(1),
            d_conv: ssm.d_conv,
            channels: ssm.channels(),
            s_k: ssm.s,
            h_k: ssm.h_k,
            s_v: ssm.s,
            h_v: ssm.h_v,
            conv_weight: w.conv.name.clone(),
            a_weight: w.a.name.clone(),
            dt_bias: None,
            grouped: false,
            eps: self.hp.rms_eps,
            chunk: cx.p.cparams.delta_chunk,
        };
        let qkv = self.matmul(b, cx, "linear_attn_qkv_mixed", x, &w.qkv);
        let z = self.matmul(b, cx, "z", x, &w.gate);
        let (beta, alpha, meta) = match &w.ba {
            BetaAlpha::Separate { beta, alpha } => {
                let be = self.matmul(b, cx, "beta", x, beta);
                let al = b.matmul(x, alpha, Some(&w.dt_bias));
                b.set_name(al, &cx.name("alpha_biased"));
                (be, al, meta)
            }
            BetaAlpha::Joint(ba) => {
                let m = self.matmul(b, cx, "linear_attn_mixed_ba", x, ba);
                let r = ssm.h_v / ssm.h_k;
                let be = b.slice(m, 2 * r, 0, r);
                b.set_name(be, &cx.name("b"));
                let al = b.slice(m, 2 * r, r, r);
                b.set_name(al, &cx.name("a"));
                // The bias is added inside the recurrence: the joint projection has none.
                // Qwen3-Next's value heads share key heads in consecutive groups.
                let meta = RecurrentMeta {
                    dt_bias: Some(w.dt_bias.name.clone()),
                    grouped: true,
                    ..meta
                };
                (be, al, meta)
            }
        };
        let conv = b.ssm_conv(qkv, cx.pos, cx.slots, meta.clone());
        b.set_name(conv, &cx.name("conv_output_raw"));
        let conv = b.silu(conv);
        b.set_name(conv, &cx.name("conv_output_silu"));
        let o = b.delta_net(conv, alpha, beta, cx.pos, cx.slots, meta);
        b.set_name(o, &cx.name("attn_output_delta"));
        let o = b.qk_norm(o, Some(&w.norm), ssm.s, ssm.h_v, self.hp.rms_eps);
        b.set_name(o, &cx.name("attn_out_norm"));
        // norm(o) * silu(z): the SwiGLU form with z as the gate.
        let g = b.swiglu(z, o);
        b.set_name(g, &cx.name("final_output"));
        self.matmul(b, cx, "linear_attn_out", g, &w.out)
    }
}

/// The whole graph for `p` (callers validate `p` with [`crate::params::check`]).
pub(super) fn build(m: &Qwen35, p: &GraphParams) -> ComputeGraph {
    debug_assert!(
        crate::params::check(p).is_ok(),
        "invalid graph params {p:?}"
    );
    let hp = &m.hp;
    let nt = p.n_tokens.max(1);
    let n_out = p.n_out.clamp(1, nt);
    let cp = &p.cparams;
    let mut b = GraphBuilder::new();
    let Inputs {
        ids,
        pos,
        tail,
        span,
        cells,
    } = inputs(&mut b, nt, n_out, cp.explicit_span);
    let slots = b.input(INPUT_STATE_SLOTS, [nt, 1, 1, 1], DType::I32);
    let mut h = b.embedding(ids, &m.globals.tok_embd);
    b.set_name(h, "inp_embd");
    for (il, lw) in m.layers.iter().enumerate() {
        let cx = Cx {
            il,
            pos,
            cells: cells.unwrap_or(pos),
            span,
            slots,
            p,
        };
        let normed = b.rms_norm(h, Some(&lw.attn_norm), hp.rms_eps);
        b.set_name(normed, &cx.name("attn_norm"));
        let mixed = match &lw.mixer {
            Mixer::Attn(w) => m.attn_block(&mut b, &cx, normed, w),
            Mixer::Linear(w) => m.linear_block(&mut b, &cx, normed, w),
        };
        // From the last layer's residual on, only the n_out tail rows are computed.
        let last = il + 1 == m.layers.len();
        let (res, cur) = match tail.filter(|_| last) {
            Some(t) => {
                let shape = [hp.n_embd, n_out, 1, 1];
                let cur = b.get_rows(mixed, t, shape);
                let res = b.get_rows(h, t, shape);
                (res, cur)
            }
            None => (h, mixed),
        };
        h = b.add(res, cur);
        b.set_name(h, &cx.name("attn_residual"));
        let normed = b.rms_norm(h, Some(&lw.post_norm), hp.rms_eps);
        b.set_name(normed, &cx.name("attn_post_norm"));
        let down = match &lw.ffn {
            Ffn::Dense(d) => {
                let g = m.matmul(&mut b, &cx, "ffn_gate", normed, &d.gate);
                let u = m.matmul(&mut b, &cx, "ffn_up", normed, &d.up);
                let s = b.silu(g);
                b.set_name(s, &cx.name("ffn_silu"));
                let par = b.mul(s, u);
                b.set_name(par, &cx.name("ffn_gate_par"));
                m.matmul(&mut b, &cx, "ffn_out", par, &d.down)
            }
            Ffn::Moe(e) => crate::moe::build_ffn(&mut b, il, normed, e),
        };
        h = b.add(h, down);
        b.set_name(h, &cx.name("l_out"));
    }
    let normed = b.rms_norm(h, Some(&m.globals.output_norm), hp.rms_eps);
    b.set_name(normed, "result_norm");
    if cp.embeddings {
        b.output(normed);
        return b.build();
    }
    let logits = b.matmul(normed, &m.globals.output, None);
    b.set_name(logits, "result_output");
    b.output(logits);
    b.build()
}
