//! Ops as small graphs on `CpuBackend` against the graph crate's reference backend, where
//! the shared op-case table (`minfer_graph::testing::cases`, run by `op_cases.rs`) does not
//! reach: ops no model emits, aliasing, fused FFN, partial-window spans, tighter bounds.

mod common;

use common::*;
use minfer_gguf::GgmlType;
use minfer_graph::*;

/// Runs `g` on both backends with the same inputs and weights; asserts closeness and
/// returns the CPU outputs.
fn check(g: ComputeGraph, ws: &[TestWeight], inputs: &[(&str, Fill)], tol: f32) -> Vec<Vec<f32>> {
    let got = Runner::cpu(cpu_f32(ws, 2)).step(g.clone(), inputs).unwrap();
    let want = Runner::reference(ws).step(g, inputs).unwrap();
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_close(a, b, tol, &format!("output {i}"));
    }
    got
}

fn f32_in(r: &mut Rng, n: usize) -> Fill {
    Fill::F32(r.vec(n, 2.0))
}

#[test]
fn elementwise_ops_match() {
    let mut r = Rng::new(1);
    let mut b = GraphBuilder::new();
    let x = b.input("x", [8, 3, 1, 1], DType::F32);
    let y = b.input("y", [8, 3, 1, 1], DType::F32);
    let row = b.input("row", [8, 1, 1, 1], DType::F32);
    // add, mul and swiglu (plain and broadcast) are in the op-case table; the broadcast
    // add stays for its exactness check below.
    let outs = [b.add(x, row), b.scale(x, -0.75), b.silu(x), b.softmax(y, 0)];
    // An aliased (in-place) silu: the add's only consumer is the silu.
    let s = b.add(x, y);
    let s = b.silu(s);
    for o in outs.into_iter().chain([s]) {
        b.output(o);
    }
    let ins = [
        ("x", f32_in(&mut r, 24)),
        ("y", f32_in(&mut r, 24)),
        ("row", f32_in(&mut r, 8)),
    ];
    let got = check(b.build(), &[], &ins, 1e-6);
    let (Fill::F32(xv), Fill::F32(rv)) = (&ins[0].1, &ins[2].1) else {
        unreachable!()
    };
    assert_eq!(got[0][9], xv[9] + rv[1], "broadcast add is exact");
}

#[test]
fn matmul_bias_and_wide_inputs_match() {
    let mut r = Rng::new(3);
    let (e, nf, o) = (64, 96, 40);
    let ws = vec![
        TestWeight::new("w", [e, o], GgmlType::F32, r.vec(e * o, 0.2)),
        TestWeight::new("bias", [o, 1], GgmlType::F32, r.vec(o, 1.0)),
        TestWeight::new("gate", [e, nf], GgmlType::F32, r.vec(e * nf, 0.2)),
        TestWeight::new("up", [e, nf], GgmlType::F32, r.vec(e * nf, 0.2)),
        TestWeight::new("down", [nf, e], GgmlType::F32, r.vec(e * nf, 0.2)),
    ];
    let mut b = GraphBuilder::new();
    let x = b.input("x", [e, 3, 1, 1], DType::F32);
    let y = b.matmul(x, &ws[0].wref(), Some(&ws[1].wref()));
    let ffn = b.fused_ffn(
        x,
        FusedFfnMeta {
            gate_weight: "gate".into(),
            up_weight: "up".into(),
            concat_weight: "gate_up".into(),
            wtype: WeightType::F32,
            n_embd: e,
            nf,
        },
    );
    // The down projection reads rows 0..nf of the wider [2nf, nt] fused buffer.
    let d = b.matmul(ffn, &ws[4].wref(), None);
    for o in [y, ffn, d] {
        b.output(o);
    }
    check(b.build(), &ws, &[("x", f32_in(&mut r, 3 * e))], 1e-5);
}

#[test]
fn quantized_matmul_stays_within_activation_rounding() {
    let mut r = Rng::new(4);
    let (e, o, nt) = (256, 48, 3);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
    ] {
        let ws = vec![TestWeight::new("w", [e, o], ty, r.vec(e * o, 0.1))];
        let mut b = GraphBuilder::new();
        let x = b.input("x", [e, nt, 1, 1], DType::F32);
        let y = b.matmul(x, &ws[0].wref(), None);
        b.output(y);
        let g = b.build();
        let ins = [("x", f32_in(&mut r, e * nt))];
        let got = Runner::cpu(cpu_gguf(&ws, 2)).step(g.clone(), &ins).unwrap();
        let want = Runner::reference(&ws).step(g, &ins).unwrap();
        // Q8 activations carry about 1/254 of each block's range per value.
        let (d, m) = max_diff(&got[0], &want[0]);
        assert!(d <= 1e-2 * m, "{ty}: max diff {d} vs max |ref| {m}");
    }
}

#[test]
fn rope_matches_for_both_styles_and_partial_dims() {
    let mut r = Rng::new(6);
    for style in [RopeStyle::Interleaved, RopeStyle::NonInterleaved] {
        for n_dims in [16, 8] {
            let mut b = GraphBuilder::new();
            let x = b.input("x", [48, 4, 1, 1], DType::F32);
            let pos = b.input("pos", [4, 1, 1, 1], DType::I32);
            let meta = RoPEMeta {
                n_dims,
                freq_base: 10000.0,
                freq_scale: 0.5,
                n_head: 3,
                hd: 16,
                style,
                freq_factors: None,
                yarn: None,
            };
            // Rope of an input (copy) and of a computed value (in place).
            let a = b.rope(x, pos, style, meta.clone());
            let s = b.scale(x, 2.0);
            let c = b.rope(s, pos, style, meta);
            b.output(a);
            b.output(c);
            let ins = [
                ("x", f32_in(&mut r, 192)),
                ("pos", Fill::I32(vec![0, 1, 9, 30])),
            ];
            check(b.build(), &[], &ins, 1e-5);
        }
    }
}

#[test]
fn attention_with_store_and_span_matches() {
    let mut r = Rng::new(7);
    let (nh, nkv, hd, n_ctx, nt) = (4, 1, 32, 16, 5);
    let nkt = nkv * hd;
    let meta = AttnMeta {
        layer: 0,
        n_head: nh,
        n_head_kv: nkv,
        hd,
        scale: 0.2,
        n_ctx,
        window: None,
        softcap: None,
        ring: None,
        sinks: None,
        causal: true,
    };
    for span in [false, true] {
        let mut b = GraphBuilder::new();
        let q = b.input("q", [nh * hd, nt, 1, 1], DType::F32);
        let k = b.input("k", [nkt, nt, 1, 1], DType::F32);
        let v = b.input("v", [nkt, nt, 1, 1], DType::F32);
        let pos = b.input("pos", [nt, 1, 1, 1], DType::I32);
        let sp = span.then(|| b.input("span", [2, nt, 1, 1], DType::I32));
        b.kvcache_store(0, k, v, pos, n_ctx, None);
        let kv = b.kvcache_load(0, nkt, n_ctx, nkv, None);
        let a = b.attn(q, kv, pos, sp, AttnMode::Gqa, meta.clone());
        b.output(a);
        let mut ins = vec![
            ("q", f32_in(&mut r, nh * hd * nt)),
            ("k", f32_in(&mut r, nkt * nt)),
            ("v", f32_in(&mut r, nkt * nt)),
            ("pos", Fill::I32(vec![2, 3, 4, 5, 6])),
        ];
        if span {
            ins.push(("span", Fill::I32(vec![2, 3, 2, 4, 3, 5, 0, 6, 6, 7])));
        }
        check(b.build(), &[], &ins, 1e-5);
    }
}

#[test]
fn layout_ops_match() {
    let mut r = Rng::new(8);
    let mut b = GraphBuilder::new();
    let x = b.input("x", [6, 4, 1, 1], DType::F32);
    let v = b.node(
        "",
        Op::View {
            offset: 5,
            shape: [10, 1, 1, 1],
        },
        &[x],
        [10, 1, 1, 1],
        DType::F32,
        NodeMeta::None,
    );
    let s = b.node(
        "",
        Op::Reshape {
            shape: [4, 6, 1, 1],
        },
        &[x],
        [4, 6, 1, 1],
        DType::F32,
        NodeMeta::None,
    );
    let p = b.node(
        "",
        Op::Permute { dims: [1, 0, 2, 3] },
        &[x],
        [4, 6, 1, 1],
        DType::F32,
        NodeMeta::None,
    );
    for o in [v, s, p] {
        b.output(o);
    }
    check(b.build(), &[], &[("x", f32_in(&mut r, 24))], 0.0);
}

#[test]
fn a_split_across_two_backends_matches_the_all_cpu_run() {
    // The test device takes the norms and rope; staging copies cross both ways.
    let cfg = Cfg::small(false);
    let ws = make_weights(&cfg, 13, &|_| GgmlType::F32);
    let device = minfer_graph::testing::RefBackend::test_device()
        .claiming(&["rms_norm", "rope", "add"])
        .with_weights(ref_store(&ws));
    let mut split = Runner::new(vec![Box::new(cpu_f32(&ws, 2)), Box::new(device)]);
    let mut alone = Runner::cpu(cpu_f32(&ws, 2));
    let (a, _) = run_model(&mut split, &cfg, &ws, &[1, 2, 3], &[4]);
    let (b, _) = run_model(&mut alone, &cfg, &ws, &[1, 2, 3], &[4]);
    for (x, y) in a.iter().zip(&b) {
        assert_close(x, y, 1e-5, "split vs cpu logits");
    }
}
