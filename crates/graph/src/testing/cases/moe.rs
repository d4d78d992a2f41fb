//! The mixture-of-experts cases: the router's top-k, the expert-routed matmuls (one
//! activation row per token and one per slot, plain and SwiGLU, over the model weight
//! types), the weighted sum with and without renormalisation, and the sigmoid gate.

use std::sync::Arc;

use minfer_gguf::GgmlType;

use super::{f32_input, gguf, ids_input, values, wref, OpCase, MATMUL_TYPES, TOKENS};
use crate::builder::GraphBuilder;
use crate::ir::DType;
use crate::meta::Glu;

/// Experts stacked in the case weights, and experts chosen per token.
const N_EXPERT: usize = 4;
const K: usize = 2;

/// Token `t`'s choice: two distinct experts that change from token to token.
fn choice(nt: usize) -> Vec<u32> {
    (0..nt)
        .flat_map(|t| [(t % N_EXPERT) as u32, ((t + 3) % N_EXPERT) as u32])
        .collect()
}

pub(super) fn moe_cases(out: &mut Vec<OpCase>) {
    mul_mat_id_cases(out);
    expert_terms_cases(out);
    routing_cases(out);
}

/// gpt-oss's experts: stacked biases on the gate, up and down products and the clamped
/// SwiGLU ([`Glu::Oai`]), over F32, Q8_0 and the MXFP4 its files store experts in. The
/// activations are scaled so that some gate and up values pass the clamp.
fn expert_terms_cases(out: &mut Vec<OpCase>) {
    let oai = Glu::Oai {
        alpha: 1.702,
        limit: 7.0,
    };
    for ty in [GgmlType::F32, GgmlType::Q8_0, GgmlType::Mxfp4] {
        let bound = MATMUL_TYPES
            .iter()
            .find(|(t, _)| *t == ty)
            .map_or(2e-2, |&(_, b)| b);
        let (in_dim, out_dim) = (96usize, 36usize);
        let dims = vec![in_dim as u64, out_dim as u64, N_EXPERT as u64];
        let bdims = vec![out_dim as u64, N_EXPERT as u64];
        let n = in_dim * out_dim * N_EXPERT;
        let bias = |seed: u64| -> Vec<f32> {
            values(seed, out_dim * N_EXPERT)
                .iter()
                .map(|v| v * 4.0)
                .collect()
        };
        let weights = gguf(&[
            ("up", dims.clone(), ty, values(61, n)),
            ("gate", dims, ty, values(71, n)),
            ("up_b", bdims.clone(), GgmlType::F32, bias(62)),
            ("gate_b", bdims, GgmlType::F32, bias(72)),
        ]);
        let folded = [in_dim, out_dim * N_EXPERT];
        let (up, gate) = (wref("up", ty, folded), wref("gate", ty, folded));
        let (up_b, gate_b) = (
            wref("up_b", GgmlType::F32, [out_dim, N_EXPERT]),
            wref("gate_b", GgmlType::F32, [out_dim, N_EXPERT]),
        );
        for nt in TOKENS {
            for form in ["bias", "oai bias"] {
                let mut b = GraphBuilder::new();
                let x = b.input("x", [in_dim, nt, 1, 1], DType::F32);
                let ids = b.input("ids", [K, nt, 1, 1], DType::I32);
                let (op, y) = if form == "bias" {
                    let y = b.mul_mat_id(x, ids, &up, N_EXPERT);
                    b.set_expert_terms(y, Some(&up_b), None, Glu::Silu);
                    ("mul_mat_id", y)
                } else {
                    let y = b.mul_mat_id_swiglu(x, ids, &gate, &up, N_EXPERT);
                    b.set_expert_terms(y, Some(&up_b), Some(&gate_b), oai);
                    ("mul_mat_id_swiglu", y)
                };
                b.output(y);
                let xs = values(81 + nt as u64, in_dim * nt);
                out.push(OpCase {
                    name: format!(
                        "{op} {} [{in_dim}x{out_dim}x{N_EXPERT}] {form} nt={nt}",
                        ty.name()
                    ),
                    op,
                    graph: b.build(),
                    inputs: vec![
                        f32_input("x", xs.iter().map(|v| v * 6.0).collect()),
                        ids_input("ids", choice(nt)),
                    ],
                    weights: Arc::clone(&weights),
                    bound,
                });
            }
        }
    }
}

fn mul_mat_id_cases(out: &mut Vec<OpCase>) {
    let types = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
    ];
    for ty in types {
        let bound = MATMUL_TYPES
            .iter()
            .find(|(t, _)| *t == ty)
            .map_or(2e-2, |&(_, b)| b);
        let in_dim = if ty.block_size() == 256 { 256 } else { 96 };
        let out_dim = 37usize;
        let dims = vec![in_dim as u64, out_dim as u64, N_EXPERT as u64];
        let n = in_dim * out_dim * N_EXPERT;
        let weights = gguf(&[
            ("up", dims.clone(), ty, values(60 + ty.id() as u64, n)),
            ("gate", dims, ty, values(70 + ty.id() as u64, n)),
        ]);
        let folded = [in_dim, out_dim * N_EXPERT];
        let (up, gate) = (wref("up", ty, folded), wref("gate", ty, folded));
        for nt in TOKENS {
            for (form, x_rows) in [("shared", nt), ("per-slot", K * nt), ("swiglu", nt)] {
                let mut b = GraphBuilder::new();
                let x = b.input("x", [in_dim, x_rows, 1, 1], DType::F32);
                let ids = b.input("ids", [K, nt, 1, 1], DType::I32);
                let (op, y) = if form == "swiglu" {
                    let y = b.mul_mat_id_swiglu(x, ids, &gate, &up, N_EXPERT);
                    ("mul_mat_id_swiglu", y)
                } else {
                    ("mul_mat_id", b.mul_mat_id(x, ids, &up, N_EXPERT))
                };
                b.output(y);
                out.push(OpCase {
                    name: format!(
                        "{op} {} [{in_dim}x{out_dim}x{N_EXPERT}] {form} nt={nt}",
                        ty.name()
                    ),
                    op,
                    graph: b.build(),
                    inputs: vec![
                        f32_input("x", values(80 + nt as u64, in_dim * x_rows)),
                        ids_input("ids", choice(nt)),
                    ],
                    weights: Arc::clone(&weights),
                    bound,
                });
            }
        }
    }
}

fn routing_cases(out: &mut Vec<OpCase>) {
    let n_expert = 8usize;
    for nt in TOKENS {
        // Top-k over rows with a tie (the lower index must come first).
        let mut xs = values(90 + nt as u64, n_expert * nt);
        for row in xs.chunks_mut(n_expert) {
            row[5] = row[2];
        }
        for k in [1usize, 3] {
            let mut b = GraphBuilder::new();
            let x = b.input("x", [n_expert, nt, 1, 1], DType::F32);
            let y = b.top_k(x, k);
            b.output(y);
            out.push(OpCase {
                name: format!("top_k {k} of {n_expert} nt={nt}"),
                op: "top_k",
                graph: b.build(),
                inputs: vec![f32_input("x", xs.clone())],
                weights: gguf(&[]),
                bound: 0.0,
            });
        }
        // The router's gate values.
        let mut b = GraphBuilder::new();
        let x = b.input("x", [n_expert, nt, 1, 1], DType::F32);
        let y = b.softmax(x, 0);
        b.output(y);
        out.push(OpCase {
            name: format!("softmax router [{n_expert}] nt={nt}"),
            op: "softmax",
            graph: b.build(),
            inputs: vec![f32_input("x", xs.iter().map(|v| v * 8.0).collect())],
            weights: gguf(&[]),
            bound: 1e-6,
        });
        let d = 33usize;
        for norm in [false, true] {
            let mut b = GraphBuilder::new();
            let h = b.input("h", [d, K * nt, 1, 1], DType::F32);
            let probs = b.input("probs", [N_EXPERT, nt, 1, 1], DType::F32);
            let ids = b.input("ids", [K, nt, 1, 1], DType::I32);
            let y = b.moe_sum(h, probs, ids, norm);
            b.output(y);
            let p = values(95, N_EXPERT * nt).iter().map(|v| v + 0.6).collect();
            out.push(OpCase {
                name: format!("moe_sum [{d}] k={K} nt={nt} norm={norm}"),
                op: "moe_sum",
                graph: b.build(),
                inputs: vec![
                    f32_input("h", values(96, d * K * nt)),
                    f32_input("probs", p),
                    ids_input("ids", choice(nt)),
                ],
                weights: gguf(&[]),
                bound: 1e-6,
            });
        }
        let mut b = GraphBuilder::new();
        let x = b.input("x", [67, nt, 1, 1], DType::F32);
        let g = b.input("g", [1, nt, 1, 1], DType::F32);
        let y = b.mul_sigmoid(x, g);
        b.output(y);
        let gs = values(98, nt).iter().map(|v| v * 8.0).collect();
        out.push(OpCase {
            name: format!("mul_sigmoid [67] nt={nt}"),
            op: "mul_sigmoid",
            graph: b.build(),
            inputs: vec![f32_input("x", values(97, 67 * nt)), f32_input("g", gs)],
            weights: gguf(&[]),
            bound: 1e-6,
        });
    }
}
