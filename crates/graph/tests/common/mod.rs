//! A tiny one-layer transformer block built through the public API, with
//! deterministic f32 weights, shared by the integration tests.

#![allow(dead_code)]

use std::sync::Arc;

use minfer_graph::testing::cases::values;
use minfer_graph::testing::{RefBackend, WeightStore};
use minfer_graph::*;

pub const N_EMBD: usize = 8;
pub const N_HEAD: usize = 2;
pub const N_HEAD_KV: usize = 1;
pub const HD: usize = 4;
pub const NKT: usize = N_HEAD_KV * HD;
pub const NF: usize = 12;
pub const VOCAB: usize = 10;
pub const N_CTX: usize = 16;
pub const EPS: f32 = 1e-5;

/// Ops the "test" device claims: enough to cut the block into many splits.
pub const DEVICE_OPS: &[&str] = &["matmul", "add", "silu", "mul", "swiglu", "rope"];

pub fn weights() -> Arc<WeightStore> {
    let mut w = WeightStore::new();
    w.insert("tok_embd", N_EMBD, VOCAB, values(1, N_EMBD * VOCAB));
    w.insert_vec(
        "attn_norm",
        values(2, N_EMBD).iter().map(|v| v + 1.0).collect(),
    );
    w.insert("wq", N_EMBD, N_HEAD * HD, values(3, N_EMBD * N_HEAD * HD));
    w.insert_vec("bq", values(4, N_HEAD * HD));
    w.insert("wk", N_EMBD, NKT, values(5, N_EMBD * NKT));
    w.insert("wv", N_EMBD, NKT, values(6, N_EMBD * NKT));
    w.insert("wo", N_HEAD * HD, N_EMBD, values(7, N_HEAD * HD * N_EMBD));
    w.insert_vec(
        "ffn_norm",
        values(8, N_EMBD).iter().map(|v| v + 1.0).collect(),
    );
    w.insert("ffn_gate", N_EMBD, NF, values(9, N_EMBD * NF));
    w.insert("ffn_up", N_EMBD, NF, values(10, N_EMBD * NF));
    w.insert("ffn_down", NF, N_EMBD, values(11, NF * N_EMBD));
    w.insert_vec(
        "output_norm",
        values(12, N_EMBD).iter().map(|v| v + 1.0).collect(),
    );
    w.insert("output", N_EMBD, VOCAB, values(13, N_EMBD * VOCAB));
    Arc::new(w)
}

fn wr(name: &str, shape: [usize; 2]) -> WeightRef {
    WeightRef::new(name, WeightType::F32, shape)
}

pub fn params(nt: usize, fuse_ffn: bool) -> GraphParams {
    GraphParams {
        n_tokens: nt,
        n_out: nt,
        gtype: if nt == 1 {
            GraphType::Decode
        } else {
            GraphType::Prefill
        },
        cparams: CParams {
            n_ctx: N_CTX,
            flash_attn: false,
            gpu: true,
            fuse_qkv: false,
            fuse_ffn,
            explicit_span: false,
            ring: None,
            embeddings: false,
            rank: false,
            state_slots: 1,
            delta_chunk: 0,
        },
        weights_version: 1,
    }
}

pub fn rope_meta(n_head: usize) -> RoPEMeta {
    RoPEMeta {
        n_dims: HD,
        freq_base: 10000.0,
        freq_scale: 1.0,
        n_head,
        hd: HD,
        style: RopeStyle::NonInterleaved,
        freq_factors: None,
        yarn: None,
    }
}

/// One block: embed, attention with KV store/load, FFN (fused when asked), lm head.
pub fn build_block(p: &GraphParams) -> ComputeGraph {
    let nt = p.n_tokens;
    let mut b = GraphBuilder::new();
    let ids = b.input("token_ids", [nt, 1, 1, 1], DType::I32);
    let pos = b.input("positions", [nt, 1, 1, 1], DType::I32);
    let x = b.embedding(ids, &wr("tok_embd", [N_EMBD, VOCAB]));
    let h = b.rms_norm(x, Some(&wr("attn_norm", [N_EMBD, 1])), EPS);
    let q = b.matmul(
        h,
        &wr("wq", [N_EMBD, N_HEAD * HD]),
        Some(&wr("bq", [N_HEAD * HD, 1])),
    );
    let k = b.matmul(h, &wr("wk", [N_EMBD, NKT]), None);
    let v = b.matmul(h, &wr("wv", [N_EMBD, NKT]), None);
    let q = b.rope(q, pos, RopeStyle::NonInterleaved, rope_meta(N_HEAD));
    let k = b.rope(k, pos, RopeStyle::NonInterleaved, rope_meta(N_HEAD_KV));
    b.kvcache_store(0, k, v, pos, p.cparams.n_ctx, None);
    let kv = b.kvcache_load(0, NKT, p.cparams.n_ctx, N_HEAD_KV, None);
    let meta = AttnMeta {
        layer: 0,
        n_head: N_HEAD,
        n_head_kv: N_HEAD_KV,
        hd: HD,
        scale: 1.0 / (HD as f32).sqrt(),
        n_ctx: p.cparams.n_ctx,
        window: None,
        softcap: None,
        ring: None,
        sinks: None,
        causal: true,
    };
    let a = b.attn(q, kv, pos, None, AttnMode::Gqa, meta);
    let o = b.matmul(a, &wr("wo", [N_HEAD * HD, N_EMBD]), None);
    let x2 = b.add(x, o);
    let h2 = b.rms_norm(x2, Some(&wr("ffn_norm", [N_EMBD, 1])), EPS);
    let ff = if p.cparams.fuse_ffn {
        let f = b.fused_ffn(
            h2,
            FusedFfnMeta {
                gate_weight: "ffn_gate".into(),
                up_weight: "ffn_up".into(),
                concat_weight: "ffn_gate_up".into(),
                wtype: WeightType::F32,
                n_embd: N_EMBD,
                nf: NF,
            },
        );
        b.matmul_by_name(f, "ffn_down", WeightType::F32, N_EMBD, NF)
    } else {
        let g = b.matmul(h2, &wr("ffn_gate", [N_EMBD, NF]), None);
        let u = b.matmul(h2, &wr("ffn_up", [N_EMBD, NF]), None);
        let s = b.silu(g);
        let m = b.mul(s, u);
        b.matmul(m, &wr("ffn_down", [NF, N_EMBD]), None)
    };
    let x3 = b.add(x2, ff);
    let on = b.rms_norm(x3, Some(&wr("output_norm", [N_EMBD, 1])), EPS);
    let logits = b.matmul(on, &wr("output", [N_EMBD, VOCAB]), None);
    b.set_name(logits, "logits");
    b.output(logits);
    b.build()
}

pub fn cpu_only() -> GraphAllocator {
    GraphAllocator::new(vec![Box::new(RefBackend::cpu().with_weights(weights()))]).unwrap()
}

pub fn split_alloc() -> GraphAllocator {
    split_alloc_with(RefBackend::test_device().claiming(DEVICE_OPS))
}

pub fn split_alloc_with(device: RefBackend) -> GraphAllocator {
    let w = weights();
    GraphAllocator::new(vec![
        Box::new(RefBackend::cpu().with_weights(Arc::clone(&w))),
        Box::new(device.with_weights(w)),
    ])
    .unwrap()
}

/// Fills tokens/positions and runs the cached graph; returns the logits.
pub fn run(
    cache: &mut GraphCache,
    sched: &BackendScheduler,
    tokens: &[u32],
    positions: &[i32],
) -> Result<Vec<f32>, GraphError> {
    let (g, alloc) = cache.current().expect("a cached graph");
    alloc.fill_input_u32(g, "token_ids", tokens)?;
    alloc.fill_input_i32(g, "positions", positions)?;
    sched.execute(g, alloc)?;
    let out = g.outputs[0];
    Ok(alloc.copy_to_cpu(out).expect("logits buffer"))
}

/// Builds (or reuses) the block for `p` in `cache`.
pub fn ensure(cache: &mut GraphCache, sched: &mut BackendScheduler, p: &GraphParams) -> usize {
    if cache.try_reuse(p) {
        return 0;
    }
    cache
        .install(build_block(p), p.clone(), sched, &FusionPass::new())
        .unwrap()
}
