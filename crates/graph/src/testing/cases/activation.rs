//! The one-value activations and constants of Gemma's graphs: tanh GELU and the
//! soft-cap over values reaching both tails of tanh, and the scale (the embedding's
//! `sqrt(n_embd)`), each also over an intermediate the allocator lets it overwrite.

use super::{f32_input, gguf, values, OpCase, TOKENS};
use crate::builder::GraphBuilder;
use crate::ir::{DType, NodeId};

/// The ops of this module with the spread their inputs are scaled by (wide enough to
/// reach the tails of tanh, so saturation and the linear middle are both checked).
const OPS: [(&str, f32); 3] = [("gelu", 16.0), ("softcap", 200.0), ("scale", 4.0)];

/// Gemma 3's embedding scale at 2048 features (not a power of two, so the product
/// rounds).
const SCALE: f32 = 45.254_833;

fn apply(b: &mut GraphBuilder, op: &str, x: NodeId) -> NodeId {
    match op {
        "gelu" => b.gelu(x),
        "softcap" => b.softcap(x, 30.0),
        _ => b.scale(x, SCALE),
    }
}

pub(super) fn activation_cases(out: &mut Vec<OpCase>) {
    let d = 67usize;
    for nt in TOKENS {
        for (op, spread) in OPS {
            let mut b = GraphBuilder::new();
            let x = b.input("x", [d, nt, 1, 1], DType::F32);
            let y = apply(&mut b, op, x);
            b.output(y);
            let xs = values(13, d * nt).iter().map(|v| v * spread).collect();
            out.push(OpCase {
                name: format!("{op} [{d}] nt={nt}"),
                op,
                graph: b.build(),
                inputs: vec![f32_input("x", xs)],
                weights: gguf(&[]),
                bound: 1e-6,
            });
        }
    }
    // Over an intermediate read by nothing else, which the allocator lets the op
    // overwrite in place.
    for (op, _) in OPS {
        let mut b = GraphBuilder::new();
        let x = b.input("x", [d, 3, 1, 1], DType::F32);
        let y = b.add(x, x);
        let z = apply(&mut b, op, y);
        b.output(z);
        let xs = values(14, d * 3).iter().map(|v| v * 60.0).collect();
        out.push(OpCase {
            name: format!("{op} in place [{d}] nt=3"),
            op,
            graph: b.build(),
            inputs: vec![f32_input("x", xs)],
            weights: gguf(&[]),
            bound: 1e-6,
        });
    }
}
