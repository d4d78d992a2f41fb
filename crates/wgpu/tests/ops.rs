//! The wgpu backend against the CPU backend where the shared op-case table
//! (`minfer_graph::testing::cases`, run by `op_cases.rs`) does not reach: sizes past a
//! workgroup, aliased and in-place buffers, tile boundaries, exact activation rounding,
//! the 64-key attention chunks, fused chains and the backend's refusals. Each case states
//! its bound: max absolute error relative to the output's scale.

mod common;

use common::{check, gpu, ints, node, pair, run, Src, W};
use minfer_gguf::quant::{dequantize_to_vec, quantize_to_vec};
use minfer_gguf::GgmlType;
use minfer_graph::{
    AttnMeta, AttnMode, BackendImpl, EmbedMeta, KvcacheMeta, MatMulMeta, NodeMeta, NormMeta, Op,
    RoPEMeta, RopeStyle, WeightType,
};
use minfer_testkit::Rng;

/// f32 kernels that only reorder a sum or use the GPU's exp.
const F32_BOUND: f32 = 1e-5;

#[test]
fn elementwise_ops_match_the_cpu_at_large_sizes_and_in_place() {
    let Some((mut g, mut c)) = pair(&[]) else {
        return;
    };
    let mut r = Rng::new(1);
    for n in [1usize, 7, 1000, 70_001] {
        let a = r.vec(n, 1.0);
        let b = r.vec(n, 1.0);
        let sh = [n, 1, 1, 1];
        // Small sizes and broadcast of the binary ops are cases of the op-case table.
        let binary: &[Op] = if n < 1000 {
            &[]
        } else {
            &[Op::Add, Op::Mul, Op::SwiGLU]
        };
        for op in binary {
            let nd = node(op.clone(), 2, sh, NodeMeta::None);
            let srcs = [Src::Data(a.clone()), Src::Data(b.clone())];
            check(
                &mut g,
                &mut c,
                &nd,
                &srcs,
                None,
                F32_BOUND,
                &format!("{op:?} n={n}"),
            );
        }
        let nd = node(Op::Silu, 1, sh, NodeMeta::None);
        check(
            &mut g,
            &mut c,
            &nd,
            &[Src::Data(a.clone())],
            None,
            F32_BOUND,
            "silu",
        );
        check(
            &mut g,
            &mut c,
            &nd,
            &[Src::Output(a.clone())],
            None,
            F32_BOUND,
            "silu in place",
        );
    }
    let a = r.vec(35, 1.0);
    // An input that is the output buffer reads the values from before the node.
    let nd = node(Op::Add, 2, [35, 1, 1, 1], NodeMeta::None);
    let srcs = [Src::Output(a.clone()), Src::Data(a.clone())];
    check(&mut g, &mut c, &nd, &srcs, None, F32_BOUND, "aliased add");
}

#[test]
fn a_broadcast_that_does_not_divide_is_an_error() {
    let Some(mut g) = gpu() else { return };
    let nd = node(Op::Add, 2, [10, 1, 1, 1], NodeMeta::None);
    let e = run(
        &mut g,
        &nd,
        &[Src::Data(vec![0.0; 10]), Src::Data(vec![0.0; 3])],
        None,
    )
    .unwrap_err();
    assert!(e.contains("broadcast"), "{e}");
}

/// Wide and odd widths; qk_norm and rms_norm at d=192 are cases of the op-case table.
#[test]
fn rms_norm_matches_the_cpu_at_wide_and_odd_widths() {
    let mut r = Rng::new(2);
    let ws = [
        W {
            name: "n896".into(),
            ty: GgmlType::F32,
            dims: vec![896],
            values: r.vec(896, 1.0),
        },
        W {
            name: "n37".into(),
            ty: GgmlType::F32,
            dims: vec![37],
            values: r.vec(37, 1.0),
        },
    ];
    let Some((mut g, mut c)) = pair(&ws) else {
        return;
    };
    for (d, name, nt) in [
        (896, Some("n896"), 1),
        (896, Some("n896"), 5),
        (37, Some("n37"), 3),
        (37, None, 2),
    ] {
        let meta = NodeMeta::Norm(NormMeta {
            weight_name: name.map(str::to_string),
            bias_name: None,
        });
        let nd = node(Op::RmsNorm { eps: 1e-6 }, 1, [d, nt, 1, 1], meta);
        let x = r.vec(d * nt, 1.0);
        check(
            &mut g,
            &mut c,
            &nd,
            &[Src::Data(x)],
            None,
            F32_BOUND,
            &format!("rms d={d} nt={nt}"),
        );
    }
}

fn wtype(ty: GgmlType) -> WeightType {
    WeightType(ty.id())
}

/// Weight types with the bound of their case against the CPU backend. Both round the
/// activations of a quantized matmul to the same Q8 levels (Q8_0 beside Q8_0, Q5_0 and
/// IQ4_NL, Q8_K beside the K-quants and IQ4_XS), so every case differs only in float summation
/// order; each is also held to 1e-5 against the exact product of the dequantized
/// weight and the activations rounded by the reference quantizer.
fn matmul_cases() -> Vec<(GgmlType, usize, f32)> {
    vec![
        (GgmlType::F32, 37, 1e-5),
        (GgmlType::F32, 256, 1e-5),
        (GgmlType::F16, 96, 1e-5),
        (GgmlType::Q8_0, 512, 1e-5),
        (GgmlType::Q5_0, 256, 1e-5),
        (GgmlType::Q4K, 512, 1e-5),
        (GgmlType::Q6K, 256, 1e-5),
        (GgmlType::Iq4Nl, 160, 1e-5),
        (GgmlType::Iq4Xs, 512, 1e-5),
    ]
}

/// The activations as the CPU rounds them before a matmul against `ty`: dequantized
/// Q8_0 or Q8_K levels of each row of `k`, unchanged for float weights.
fn rounded_activations(ty: GgmlType, x: &[f32], k: usize) -> Vec<f32> {
    let act = match ty {
        GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Iq4Nl => GgmlType::Q8_0,
        GgmlType::Q4K | GgmlType::Q6K | GgmlType::Iq4Xs => GgmlType::Q8K,
        _ => return x.to_vec(),
    };
    x.chunks(k)
        .flat_map(|row| {
            let q = quantize_to_vec(act, row).expect("quantize activations");
            dequantize_to_vec(act, &q, k).expect("dequantize activations")
        })
        .collect()
}

#[test]
fn matmul_matches_the_cpu_for_every_weight_type_nt_and_bias() {
    let mut r = Rng::new(3);
    let mut ws = Vec::new();
    let n_out = 37;
    for (ty, k, _) in matmul_cases() {
        ws.push(W {
            name: format!("w.{ty}.{k}"),
            ty,
            dims: vec![k as u64, n_out as u64],
            values: r.vec(k * n_out, 1.0),
        });
    }
    ws.push(W {
        name: "bias".into(),
        ty: GgmlType::F32,
        dims: vec![n_out as u64],
        values: r.vec(n_out, 1.0),
    });
    let Some((mut g, mut c)) = pair(&ws) else {
        return;
    };
    for (ty, k, bound) in matmul_cases() {
        for nt in [1usize, 3, 8, 9, 17] {
            for bias in [None, Some("bias".to_string())] {
                let meta = NodeMeta::MatMul(MatMulMeta {
                    weight_name: format!("w.{ty}.{k}"),
                    in_dim: k,
                    out_dim: n_out,
                    wtype: wtype(ty),
                    bias_name: bias.clone(),
                });
                let nd = node(Op::MatMul { transpose_b: true }, 1, [n_out, nt, 1, 1], meta);
                let x = r.vec(k * nt, 1.0);
                let what = format!("matmul {ty} k={k} nt={nt} bias={}", bias.is_some());
                check(
                    &mut g,
                    &mut c,
                    &nd,
                    &[Src::Data(x.clone())],
                    None,
                    bound,
                    &what,
                );
                // Against the exact product of the dequantized weight and the
                // activations rounded as the CPU rounds them.
                let xr = rounded_activations(ty, &x, k);
                let wv = &ws
                    .iter()
                    .find(|w| w.name == format!("w.{ty}.{k}"))
                    .unwrap()
                    .values;
                let wq =
                    dequantize_to_vec(ty, &quantize_to_vec(ty, wv).unwrap(), k * n_out).unwrap();
                let bv = &ws.last().unwrap().values;
                let exact: Vec<f32> = (0..nt * n_out)
                    .map(|i| {
                        let (t, o) = (i / n_out, i % n_out);
                        let d: f64 = (0..k)
                            .map(|j| wq[o * k + j] as f64 * xr[t * k + j] as f64)
                            .sum();
                        (d + bias.as_ref().map_or(0.0, |_| bv[o] as f64)) as f32
                    })
                    .collect();
                let got = run(&mut g, &nd, &[Src::Data(x)], None).unwrap().out;
                let e = common::rel_err(&got, &exact);
                assert!(e <= 1e-5, "{what}: error {e:e} against the exact product");
            }
        }
    }
}

/// A token's output row does not depend on which other tokens share its dispatch: the
/// same row alone (decode), in a short batch (the narrow tile) and at several places
/// of a prompt (the wide tile, its last tile partly filled) is bitwise the same, for
/// every weight type. A batched request's bitwise identity with the request alone
/// rests on this.
#[test]
fn a_token_row_is_bitwise_the_same_alone_batched_and_in_a_prompt() {
    let mut r = Rng::new(11);
    let n_out = 41;
    let ws: Vec<W> = matmul_cases()
        .into_iter()
        .map(|(ty, k, _)| W {
            name: format!("w.{ty}.{k}"),
            ty,
            dims: vec![k as u64, n_out as u64],
            values: r.vec(k * n_out, 1.0),
        })
        .collect();
    let Some(mut g) = gpu() else {
        return;
    };
    g.register_gguf(&common::gguf(&ws), "").expect("weights");
    let nt = 37;
    for (ty, k, _) in matmul_cases() {
        let x = r.vec(k * nt, 1.0);
        let mut mm = |rows: std::ops::Range<usize>| {
            let meta = NodeMeta::MatMul(MatMulMeta {
                weight_name: format!("w.{ty}.{k}"),
                in_dim: k,
                out_dim: n_out,
                wtype: wtype(ty),
                bias_name: None,
            });
            let nd = node(
                Op::MatMul { transpose_b: true },
                1,
                [n_out, rows.len(), 1, 1],
                meta,
            );
            let xs = x[rows.start * k..rows.end * k].to_vec();
            let out = run(&mut g, &nd, &[Src::Data(xs)], None)
                .expect("matmul")
                .out;
            out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        let prompt = mm(0..nt);
        let row = |t: usize| prompt[t * n_out..(t + 1) * n_out].to_vec();
        for t in [0, 5, 16, 36] {
            assert_eq!(mm(t..t + 1), row(t), "{ty}: token {t} alone");
        }
        let batch = mm(30..35);
        for t in 30..35 {
            let i = t - 30;
            assert_eq!(
                batch[i * n_out..(i + 1) * n_out],
                row(t),
                "{ty}: token {t} in a batch"
            );
        }
        let tail = mm(13..37);
        for t in 13..37 {
            let i = t - 13;
            assert_eq!(
                tail[i * n_out..(i + 1) * n_out],
                row(t),
                "{ty}: token {t} shifted"
            );
        }
    }
}

/// One-hot weights read the rounded activations out one by one: row r of W holds a
/// single nonzero at column r, so `y[t, r]` is that weight times the activation the
/// kernel multiplied, bit for bit. They must be the levels of the CPU's quantizers
/// (`quantize_row_q8_0`: f16 scale, ties away from zero; `quantize_row_q8_K`: signed
/// maximum, f32 scale, ties to even), exact ties included.
#[test]
fn quantized_matmuls_round_activations_exactly_as_the_cpu() {
    let cases = [
        (GgmlType::Q8_0, 64usize),
        (GgmlType::Q5_0, 64),
        (GgmlType::Q4K, 512),
        (GgmlType::Q6K, 512),
    ];
    let one_hot = |k: usize| -> Vec<f32> {
        let mut w = vec![0.0; k * k];
        for r in 0..k {
            w[r * k + r] = 1.0;
        }
        w
    };
    let ws: Vec<W> = cases
        .iter()
        .map(|&(ty, k)| W {
            name: format!("eye.{ty}"),
            ty,
            dims: vec![k as u64, k as u64],
            values: one_hot(k),
        })
        .collect();
    let Some(mut g) = gpu() else { return };
    g.register_gguf(&common::gguf(&ws), "").expect("weights");
    let mut r = Rng::new(21);
    for &(ty, k) in &cases {
        let wq = dequantize_to_vec(ty, &quantize_to_vec(ty, &one_hot(k)).unwrap(), k * k).unwrap();
        for (i, v) in wq.iter().enumerate() {
            assert!(
                (*v != 0.0) == (i / k == i % k),
                "{ty}: the one-hot weight does not dequantize to one nonzero per row"
            );
        }
        let nt = 3;
        // Token 0: random; token 1: wide magnitudes; token 2: exact half levels (the
        // block's largest value 127, so the scale is 1 and x.5 is a tie).
        let mut x = r.vec(k, 1.0);
        x.extend((0..k).map(|i| r.f32() * (1u32 << (i % 16)) as f32));
        x.extend((0..k).map(|i| {
            if i % 32 == 0 {
                127.0
            } else {
                (i % 64) as f32 - 32.5
            }
        }));
        let want = rounded_activations(ty, &x, k);
        let meta = NodeMeta::MatMul(MatMulMeta {
            weight_name: format!("eye.{ty}"),
            in_dim: k,
            out_dim: k,
            wtype: wtype(ty),
            bias_name: None,
        });
        let nd = node(Op::MatMul { transpose_b: true }, 1, [k, nt, 1, 1], meta);
        let got = run(&mut g, &nd, &[Src::Data(x.clone())], None).unwrap().out;
        let mut wrong = 0;
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            let e = wq[(i % k) * k + i % k] * b;
            if *a != e {
                if wrong < 5 {
                    eprintln!(
                        "{ty}: token {} value {}: x {} got {a}, want {e}",
                        i / k,
                        i % k,
                        x[i]
                    );
                }
                wrong += 1;
            }
        }
        assert_eq!(
            wrong,
            0,
            "{ty}: {wrong} of {} activations rounded unlike the CPU",
            nt * k
        );
    }
}

#[test]
fn matmul_reads_rows_of_a_wider_producer() {
    let mut r = Rng::new(4);
    let ws = [W {
        name: "w".into(),
        ty: GgmlType::Q8_0,
        dims: vec![64, 40],
        values: r.vec(64 * 40, 1.0),
    }];
    let Some((mut g, mut c)) = pair(&ws) else {
        return;
    };
    let meta = NodeMeta::MatMul(MatMulMeta {
        weight_name: "w".into(),
        in_dim: 64,
        out_dim: 40,
        wtype: WeightType::Q8_0,
        bias_name: None,
    });
    let nd = node(Op::MatMul { transpose_b: true }, 1, [40, 3, 1, 1], meta);
    // Rows of 128 (a fused gate|up buffer): the matmul reads the first 64 of each.
    check(
        &mut g,
        &mut c,
        &nd,
        &[Src::Data(r.vec(128 * 3, 1.0))],
        None,
        1e-2,
        "strided matmul",
    );
}

#[test]
fn matmul_refuses_a_missing_or_mismatched_weight() {
    let mut r = Rng::new(5);
    let ws = [W {
        name: "w".into(),
        ty: GgmlType::F32,
        dims: vec![32, 4],
        values: r.vec(128, 1.0),
    }];
    let Some((mut g, _)) = pair(&ws) else { return };
    for (name, in_dim, want) in [("nope", 32, "not registered"), ("w", 64, "expects")] {
        let meta = NodeMeta::MatMul(MatMulMeta {
            weight_name: name.into(),
            in_dim,
            out_dim: 4,
            wtype: WeightType::F32,
            bias_name: None,
        });
        let nd = node(Op::MatMul { transpose_b: true }, 1, [4, 1, 1, 1], meta);
        let e = run(&mut g, &nd, &[Src::Data(vec![0.0; in_dim])], None).unwrap_err();
        assert!(e.contains(want), "{e}");
    }
}

/// The lookup itself, for every model weight type, is a case of the op-case table.
#[test]
fn embedding_lookup_refuses_an_id_past_the_table() {
    let (d, rows) = (256, 11);
    let ws = [W {
        name: "tok".into(),
        ty: GgmlType::Q8_0,
        dims: vec![d as u64, rows as u64],
        values: Rng::new(6).vec(d * rows, 1.0),
    }];
    let Some((mut g, _)) = pair(&ws) else {
        return;
    };
    let meta = NodeMeta::Embed(EmbedMeta {
        weight_name: "tok".into(),
        wtype: WeightType::Q8_0,
        n_embd: d,
    });
    let nd = node(Op::GetRows, 1, [d, 2, 1, 1], meta);
    let e = run(&mut g, &nd, &[Src::Data(ints(&[1, 11]))], None).unwrap_err();
    assert!(e.contains("id 11") && e.contains("11 rows"), "{e}");
}

/// The gather itself is a case of the op-case table ("get_rows tail rows").
#[test]
fn row_gather_refuses_an_id_past_the_rows() {
    let Some(mut g) = gpu() else { return };
    let x = Rng::new(7).vec(13 * 6, 1.0);
    let nd = node(Op::GetRows, 2, [13, 3, 1, 1], NodeMeta::None);
    let e = run(
        &mut g,
        &nd,
        &[Src::Data(x), Src::Data(ints(&[0, 6, 1]))],
        None,
    )
    .unwrap_err();
    assert!(e.contains("id 6"), "{e}");
}

fn rope_meta(style: RopeStyle, n_dims: usize) -> RoPEMeta {
    RoPEMeta {
        n_dims,
        freq_base: 1_000_000.0,
        freq_scale: 1.0,
        n_head: 3,
        hd: 16,
        style,
        freq_factors: None,
        yarn: None,
    }
}

#[test]
fn rope_matches_the_cpu_in_both_styles_and_in_place() {
    let Some((mut g, mut c)) = pair(&[]) else {
        return;
    };
    let mut r = Rng::new(8);
    for style in [RopeStyle::Interleaved, RopeStyle::NonInterleaved] {
        for (n_dims, positions) in [(16, vec![0]), (10, vec![0, 1, 5, 37, 200])] {
            let nt = positions.len();
            let nd = node(
                Op::RoPE {
                    style,
                    freq_factors: false,
                },
                2,
                [48, nt, 1, 1],
                NodeMeta::Rope(rope_meta(style, n_dims)),
            );
            let x = r.vec(48 * nt, 1.0);
            let what = format!("rope {style:?} n_dims={n_dims} nt={nt}");
            // GPU cos/sin differ from the host's by a few ulp of the angle.
            let bound = 1e-5;
            let srcs = [Src::Data(x.clone()), Src::Data(ints(&positions))];
            check(&mut g, &mut c, &nd, &srcs, None, bound, &what);
            let srcs = [Src::Output(x), Src::Data(ints(&positions))];
            check(
                &mut g,
                &mut c,
                &nd,
                &srcs,
                None,
                bound,
                &format!("{what} in place"),
            );
        }
    }
    let nd = node(
        Op::RoPE {
            style: RopeStyle::Interleaved,
            freq_factors: false,
        },
        2,
        [48, 1, 1, 1],
        NodeMeta::Rope(rope_meta(RopeStyle::Interleaved, 7)),
    );
    let e = run(
        &mut g,
        &nd,
        &[Src::Data(vec![0.0; 48]), Src::Data(ints(&[0]))],
        None,
    )
    .unwrap_err();
    assert!(e.contains("n_dims 7"), "{e}");
}

fn kv_meta(layer: usize, n_embd: usize, n_ctx: usize) -> NodeMeta {
    NodeMeta::Kvcache(KvcacheMeta {
        layer,
        n_embd,
        n_ctx,
        n_head_kv: None,
        ring: None,
    })
}

#[test]
fn kv_store_writes_rows_at_their_cells_and_refuses_a_bad_cell() {
    let Some((mut g, mut c)) = pair(&[]) else {
        return;
    };
    let mut r = Rng::new(9);
    let (n_embd, n_ctx) = (24, 10);
    let (k0, v0) = (r.vec(n_embd * n_ctx, 1.0), r.vec(n_embd * n_ctx, 1.0));
    for cells in [vec![4], vec![9, 0, 3]] {
        let nt = cells.len();
        let nd = node(
            Op::KvcacheStore { layer: 2 },
            3,
            [n_embd, nt, 1, 1],
            kv_meta(2, n_embd, n_ctx),
        );
        let srcs = [
            Src::Data(r.vec(n_embd * nt, 1.0)),
            Src::Data(r.vec(n_embd * nt, 1.0)),
            Src::Data(ints(&cells)),
        ];
        check(
            &mut g,
            &mut c,
            &nd,
            &srcs,
            Some((&k0, &v0)),
            0.0,
            "kv store",
        );
    }
    let nd = node(
        Op::KvcacheStore { layer: 2 },
        3,
        [n_embd, 2, 1, 1],
        kv_meta(2, n_embd, n_ctx),
    );
    let srcs = [
        Src::Data(vec![1.0; 48]),
        Src::Data(vec![1.0; 48]),
        Src::Data(ints(&[1, 10])),
    ];
    let e = run(&mut g, &nd, &srcs, Some((&k0, &v0))).unwrap_err();
    assert!(e.contains("row 10") && e.contains("layer 2"), "{e}");
}

fn attn_meta(n_head: usize, n_head_kv: usize, hd: usize, n_ctx: usize) -> AttnMeta {
    AttnMeta {
        layer: 0,
        n_head,
        n_head_kv,
        hd,
        scale: 1.0 / (hd as f32).sqrt(),
        n_ctx,
        window: None,
        softcap: None,
        ring: None,
        sinks: None,
        causal: true,
    }
}

#[test]
fn attention_matches_the_cpu_over_causal_bounds_and_spans() {
    let Some((mut g, mut c)) = pair(&[]) else {
        return;
    };
    let mut r = Rng::new(10);
    // (n_head, n_head_kv, hd, n_ctx, positions): GQA groups 1, 2 and 7; key counts
    // across the 64-key chunk boundary.
    let cases: [(usize, usize, usize, usize, Vec<i32>); 4] = [
        (4, 2, 16, 40, vec![0]),
        (4, 2, 16, 40, vec![3, 4, 5, 39]),
        (14, 2, 64, 200, vec![63, 64, 65, 130, 199]),
        (2, 2, 32, 70, vec![69]),
    ];
    for (n_head, n_head_kv, hd, n_ctx, positions) in cases {
        let m = attn_meta(n_head, n_head_kv, hd, n_ctx);
        let nkt = n_head_kv * hd;
        let (k, v) = (r.vec(nkt * n_ctx, 1.0), r.vec(nkt * n_ctx, 1.0));
        let nt = positions.len();
        let q = r.vec(n_head * hd * nt, 1.0);
        let what = format!("attn {n_head}/{n_head_kv}x{hd} nt={nt}");
        let op = Op::Attn {
            mode: AttnMode::Gqa,
            explicit_span: false,
        };
        let nd = node(op, 3, [n_head * hd, nt, 1, 1], NodeMeta::Attn(m.clone()));
        let srcs = [
            Src::Data(q.clone()),
            Src::KvView,
            Src::Data(ints(&positions)),
        ];
        check(&mut g, &mut c, &nd, &srcs, Some((&k, &v)), 1e-5, &what);

        let spans: Vec<i32> = positions.iter().flat_map(|&p| [p / 2, p + 1]).collect();
        let op = Op::Attn {
            mode: AttnMode::Gqa,
            explicit_span: true,
        };
        let nd = node(op, 4, [n_head * hd, nt, 1, 1], NodeMeta::Attn(m));
        let srcs = [
            Src::Data(q),
            Src::KvView,
            Src::Data(ints(&positions)),
            Src::Data(ints(&spans)),
        ];
        check(
            &mut g,
            &mut c,
            &nd,
            &srcs,
            Some((&k, &v)),
            1e-5,
            &format!("{what} span"),
        );
    }
}

#[test]
fn attention_refuses_a_position_outside_the_region() {
    let Some(mut g) = gpu() else { return };
    let m = attn_meta(2, 1, 8, 10);
    let nd = node(
        Op::Attn {
            mode: AttnMode::Gqa,
            explicit_span: false,
        },
        3,
        [16, 1, 1, 1],
        NodeMeta::Attn(m),
    );
    let kv = vec![0.0; 80];
    let e = run(
        &mut g,
        &nd,
        &[
            Src::Data(vec![0.0; 16]),
            Src::KvView,
            Src::Data(ints(&[10])),
        ],
        Some((&kv, &kv)),
    )
    .unwrap_err();
    assert!(e.contains("position 10") && e.contains("10-row"), "{e}");
}

#[test]
fn indices_computed_on_the_device_are_refused_not_trusted() {
    let Some(mut g) = gpu() else { return };
    // Row ids produced by a kernel (here an add) cannot be range checked on the host.
    let add = node(Op::Add, 2, [2, 1, 1, 1], NodeMeta::None);
    let ids = run(
        &mut g,
        &add,
        &[Src::Data(ints(&[0, 1])), Src::Data(vec![0.0; 2])],
        None,
    )
    .unwrap();
    let a = g.alloc_buffer(2);
    g.write_host(a, &ints(&[0, 0])).unwrap();
    let sum = g.alloc_buffer(2);
    let me = g.id();
    let buf = |id| minfer_graph::BufRef { backend: me, id };
    g.execute_node(&add, &[buf(a), buf(a)], buf(sum), None)
        .unwrap();
    let x = g.alloc_buffer(8);
    let out = g.alloc_buffer(8);
    let gather = node(Op::GetRows, 2, [4, 2, 1, 1], NodeMeta::None);
    let e = g
        .execute_node(&gather, &[buf(x), buf(sum)], buf(out), None)
        .unwrap_err();
    assert!(e.contains("computed on the device"), "{e}");
    assert_eq!(ids.out.len(), 2);
}

#[test]
fn a_repeated_node_reuses_its_pipeline_and_bind_group() {
    let Some(mut g) = gpu() else { return };
    let me = g.id();
    let buf = |id| minfer_graph::BufRef { backend: me, id };
    let (a, b, out) = (g.alloc_buffer(64), g.alloc_buffer(64), g.alloc_buffer(64));
    g.write_host(a, &[1.0; 64]).unwrap();
    g.write_host(b, &[2.0; 64]).unwrap();
    let nd = node(Op::Mul, 2, [64, 1, 1, 1], NodeMeta::None);
    g.execute_node(&nd, &[buf(a), buf(b)], buf(out), None)
        .unwrap();
    let first = g.cached_kernels();
    assert_eq!(first, (1, 1));
    g.execute_node(&nd, &[buf(a), buf(b)], buf(out), None)
        .unwrap();
    assert_eq!(g.cached_kernels(), first, "nothing new for a repeated node");
    g.synchronize();
    assert_eq!(g.copy_to_host(out).unwrap(), vec![2.0; 64]);
}

#[test]
fn fused_ffn_matches_the_cpu_and_is_bit_identical_to_the_unfused_chain() {
    use minfer_graph::FusedFfnMeta;
    let mut r = Rng::new(11);
    let (n_embd, nf) = (256, 96);
    let ws = [
        W {
            name: "gate".into(),
            ty: GgmlType::Q4K,
            dims: vec![n_embd as u64, nf as u64],
            values: r.vec(n_embd * nf, 1.0),
        },
        W {
            name: "up".into(),
            ty: GgmlType::Q4K,
            dims: vec![n_embd as u64, nf as u64],
            values: r.vec(n_embd * nf, 1.0),
        },
    ];
    let Some((mut g, mut c)) = pair(&ws) else {
        return;
    };
    let meta = FusedFfnMeta {
        gate_weight: "gate".into(),
        up_weight: "up".into(),
        concat_weight: "gate_up".into(),
        wtype: WeightType::Q4_K,
        n_embd,
        nf,
    };
    let mm = |name: &str, nt| {
        let meta = NodeMeta::MatMul(MatMulMeta {
            weight_name: name.into(),
            in_dim: n_embd,
            out_dim: nf,
            wtype: WeightType::Q4_K,
            bias_name: None,
        });
        node(Op::MatMul { transpose_b: true }, 1, [nf, nt, 1, 1], meta)
    };
    for nt in [1usize, 3] {
        let fused = node(
            Op::FusedFFN,
            1,
            [2 * nf, nt, 1, 1],
            NodeMeta::FusedFfn(meta.clone()),
        );
        let x = r.vec(n_embd * nt, 1.0);
        check(
            &mut g,
            &mut c,
            &fused,
            &[Src::Data(x.clone())],
            None,
            1e-2,
            &format!("fused ffn nt={nt}"),
        );
        let f = run(&mut g, &fused, &[Src::Data(x.clone())], None)
            .unwrap()
            .out;
        let gate = run(&mut g, &mm("gate", nt), &[Src::Data(x.clone())], None)
            .unwrap()
            .out;
        let up = run(&mut g, &mm("up", nt), &[Src::Data(x)], None)
            .unwrap()
            .out;
        let sw = node(Op::SwiGLU, 2, [nf, nt, 1, 1], NodeMeta::None);
        let s = run(&mut g, &sw, &[Src::Data(gate), Src::Data(up.clone())], None)
            .unwrap()
            .out;
        for t in 0..nt {
            let row = &f[t * 2 * nf..(t + 1) * 2 * nf];
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&row[..nf]),
                bits(&s[t * nf..(t + 1) * nf]),
                "swiglu half, token {t}"
            );
            assert_eq!(
                bits(&row[nf..]),
                bits(&up[t * nf..(t + 1) * nf]),
                "up half, token {t}"
            );
        }
    }
}

#[test]
fn an_op_the_backend_does_not_claim_is_an_error_not_a_fallback() {
    let Some(mut g) = gpu() else { return };
    for op in [Op::SigmoidGate, Op::Softmax { dim: 0 }, Op::BatchMatMul] {
        assert!(
            !g.supports_op(&op, minfer_graph::DType::F32),
            "{op:?} is not claimed"
        );
        let nd = node(op.clone(), 1, [4, 1, 1, 1], NodeMeta::None);
        let e = run(&mut g, &nd, &[Src::Data(vec![1.0; 4])], None).unwrap_err();
        assert!(
            e.contains("not implemented by the wgpu backend"),
            "{op:?}: {e}"
        );
    }
    assert!(!g.supports_op(&Op::Add, minfer_graph::DType::I32));
}

/// `QkvBiasRopeStore` (the epilogue after three separate matmuls) against its unfused
/// chain on wgpu: q + q_bias then rope is the output, k + k_bias then rope and
/// v + v_bias are stored at the positions, all bit for bit.
#[test]
fn qkv_bias_rope_store_is_bit_identical_to_its_unfused_chain() {
    use minfer_graph::QkvBiasRopeStoreMeta;
    let (n_head, n_head_kv, hd, n_ctx) = (4usize, 2usize, 16usize, 8usize);
    let (nqt, nkt) = (n_head * hd, n_head_kv * hd);
    let mut r = Rng::new(31);
    let bias = |name: &str, n: usize, r: &mut Rng| W {
        name: name.into(),
        ty: GgmlType::F32,
        dims: vec![n as u64],
        values: r.vec(n, 1.0),
    };
    let ws = [
        bias("bq", nqt, &mut r),
        bias("bk", nkt, &mut r),
        bias("bv", nkt, &mut r),
    ];
    let Some(mut g) = gpu() else { return };
    g.register_gguf(&common::gguf(&ws), "").expect("biases");
    let rope = |n_head| RoPEMeta {
        n_dims: hd,
        freq_base: 1_000_000.0,
        freq_scale: 1.0,
        n_head,
        hd,
        style: RopeStyle::NonInterleaved,
        freq_factors: None,
        yarn: None,
    };
    let nt = 3;
    let positions = ints(&[2, 5, 7]);
    let (q, k, v) = (
        r.vec(nqt * nt, 1.0),
        r.vec(nkt * nt, 1.0),
        r.vec(nkt * nt, 1.0),
    );
    let (k0, v0) = (r.vec(nkt * n_ctx, 1.0), r.vec(nkt * n_ctx, 1.0));
    let meta = QkvBiasRopeStoreMeta {
        q_bias: "bq".into(),
        k_bias: "bk".into(),
        v_bias: "bv".into(),
        rope: rope(n_head),
        nqt,
        nkt,
        n_ctx,
        kv_elems: nkt * n_ctx,
    };
    let fused = node(
        Op::QkvBiasRopeStore { layer: 0 },
        4,
        [nqt, nt, 1, 1],
        NodeMeta::QkvBiasRopeStore(meta),
    );
    let srcs = [
        Src::Output(q.clone()),
        Src::Data(k.clone()),
        Src::Data(v.clone()),
        Src::Data(positions.clone()),
    ];
    let got = run(&mut g, &fused, &srcs, Some((&k0, &v0))).expect("fused");
    // The chain: bias adds, rope on q and k, then the store.
    let add = |g: &mut minfer_wgpu::WgpuBackend, x: &[f32], b: &str, n: usize| {
        let bv = &ws.iter().find(|w| w.name == b).unwrap().values;
        let nd = node(Op::Add, 2, [n, nt, 1, 1], NodeMeta::None);
        run(
            g,
            &nd,
            &[Src::Data(x.to_vec()), Src::Data(bv.clone())],
            None,
        )
        .unwrap()
        .out
    };
    let roped = |g: &mut minfer_wgpu::WgpuBackend, x: Vec<f32>, heads: usize| {
        let op = Op::RoPE {
            style: RopeStyle::NonInterleaved,
            freq_factors: false,
        };
        let nd = node(op, 2, [heads * hd, nt, 1, 1], NodeMeta::Rope(rope(heads)));
        run(g, &nd, &[Src::Data(x), Src::Data(positions.clone())], None)
            .unwrap()
            .out
    };
    let qa = add(&mut g, &q, "bq", nqt);
    let want_q = roped(&mut g, qa, n_head);
    let ka = add(&mut g, &k, "bk", nkt);
    let want_k = roped(&mut g, ka, n_head_kv);
    let want_v = add(&mut g, &v, "bv", nkt);
    let store = node(
        Op::KvcacheStore { layer: 0 },
        3,
        [nkt, nt, 1, 1],
        kv_meta(0, nkt, n_ctx),
    );
    let srcs = [
        Src::Data(want_k),
        Src::Data(want_v),
        Src::Data(positions.clone()),
    ];
    let chain = run(&mut g, &store, &srcs, Some((&k0, &v0))).expect("store");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got.out), bits(&want_q), "roped q");
    let (gk, gv) = got.kv.expect("fused KV");
    let (ck, cv) = chain.kv.expect("chain KV");
    assert_eq!(bits(&gk), bits(&ck), "stored K");
    assert_eq!(bits(&gv), bits(&cv), "stored V");
}
