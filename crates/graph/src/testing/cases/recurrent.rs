//! The recurrent-layer cases: the strided split and the element-wise sigmoid gate, the
//! causal convolution over the conv windows, and the gated delta rule, each over one
//! and several tokens of interleaved sequences (slots), some starting at position 0
//! and some continuing state written earlier in the same graph.

use std::sync::Arc;

use minfer_gguf::GgmlType;

use super::{f32_input, gguf, ids_input, values, OpCase, TOKENS};
use crate::builder::GraphBuilder;
use crate::ir::DType;
use crate::meta::RecurrentMeta;

/// Key heads, value heads, head size, conv width, slots of the cases' layer.
const HK: usize = 2;
const HV: usize = 4;
const S: usize = 16;
const D_CONV: usize = 4;
const SLOTS: usize = 3;

/// The cases' layer; `grouped` also takes the bias of `alpha` inside (Qwen3-Next's form).
fn meta(grouped: bool) -> RecurrentMeta {
    RecurrentMeta {
        layer: 1,
        slots: SLOTS,
        d_conv: D_CONV,
        channels: 2 * HK * S + HV * S,
        s_k: S,
        h_k: HK,
        s_v: S,
        h_v: HV,
        conv_weight: "conv".into(),
        a_weight: "a".into(),
        dt_bias: grouped.then(|| "dt".into()),
        grouped,
        eps: 1e-6,
        chunk: 0,
    }
}

/// Positions and slots of `nt` tokens: slot `t % 2` (slot 2 for a lone token), each
/// sequence counting from `first`.
fn layout(nt: usize, first: u32) -> (Vec<u32>, Vec<u32>) {
    if nt == 1 {
        return (vec![first], vec![2]);
    }
    let slots: Vec<u32> = (0..nt as u32).map(|t| t % 2).collect();
    let pos = (0..nt as u32).map(|t| first + t / 2).collect();
    (pos, slots)
}

pub(super) fn recurrent_cases(out: &mut Vec<OpCase>) {
    let c = meta(false).channels;
    let a: Vec<f32> = (0..HV).map(|h| -0.2 - 0.3 * h as f32).collect();
    let weights = gguf(&[
        (
            "conv",
            vec![D_CONV as u64, c as u64],
            GgmlType::F32,
            values(301, c * D_CONV),
        ),
        ("a", vec![HV as u64], GgmlType::F32, a),
        ("dt", vec![HV as u64], GgmlType::F32, values(302, HV)),
    ]);
    for nt in TOKENS {
        let d = 2 * S * 3;
        let mut b = GraphBuilder::new();
        let x = b.input("x", [d, nt, 1, 1], DType::F32);
        let y = b.slice(x, 2 * S, S, S);
        b.output(y);
        out.push(OpCase {
            name: format!("slice second half of {} blocks nt={nt}", d / (2 * S)),
            op: "slice",
            graph: b.build(),
            inputs: vec![f32_input("x", values(310 + nt as u64, d * nt))],
            weights: gguf(&[]),
            bound: 0.0,
        });
        let mut b = GraphBuilder::new();
        let x = b.input("x", [37, nt, 1, 1], DType::F32);
        let g = b.input("g", [37, nt, 1, 1], DType::F32);
        let y = b.sigmoid_gate(x, g);
        b.output(y);
        out.push(OpCase {
            name: format!("sigmoid_gate [37] nt={nt}"),
            op: "sigmoid_gate",
            graph: b.build(),
            inputs: vec![
                f32_input("x", values(320 + nt as u64, 37 * nt)),
                f32_input(
                    "g",
                    values(330 + nt as u64, 37 * nt)
                        .iter()
                        .map(|v| v * 8.0)
                        .collect(),
                ),
            ],
            weights: gguf(&[]),
            bound: 1e-6,
        });
        // Two steps in one graph: the second continues the state the first wrote.
        for (op, grouped) in [
            ("ssm_conv", false),
            ("delta_net", false),
            ("delta_net", true),
        ] {
            let m = meta(grouped);
            let mut b = GraphBuilder::new();
            let mut inputs = Vec::new();
            let mut last = None;
            for step in 0..2u32 {
                let x = b.input(&format!("x{step}"), [c, nt, 1, 1], DType::F32);
                let pos = b.input(&format!("pos{step}"), [nt, 1, 1, 1], DType::I32);
                let slots = b.input(&format!("slots{step}"), [nt, 1, 1, 1], DType::I32);
                let (p, s) = layout(nt, step * nt.div_ceil(2) as u32);
                inputs.push(f32_input(
                    &format!("x{step}"),
                    values(340 + u64::from(step) * 7 + nt as u64, c * nt),
                ));
                inputs.push(ids_input(&format!("pos{step}"), p));
                inputs.push(ids_input(&format!("slots{step}"), s));
                last = Some(if op == "ssm_conv" {
                    b.ssm_conv(x, pos, slots, m.clone())
                } else {
                    let al = b.input(&format!("alpha{step}"), [HV, nt, 1, 1], DType::F32);
                    let be = b.input(&format!("beta{step}"), [HV, nt, 1, 1], DType::F32);
                    inputs.push(f32_input(
                        &format!("alpha{step}"),
                        values(360 + u64::from(step) + nt as u64, HV * nt),
                    ));
                    inputs.push(f32_input(
                        &format!("beta{step}"),
                        values(370 + u64::from(step) + nt as u64, HV * nt),
                    ));
                    b.delta_net(x, al, be, pos, slots, m.clone())
                });
            }
            if let Some(y) = last {
                b.output(y);
            }
            out.push(OpCase {
                name: format!(
                    "{op} {HK}/{HV} heads of {S}{}, conv {D_CONV}, two steps nt={nt}",
                    if grouped { " grouped" } else { "" }
                ),
                op,
                graph: b.build(),
                inputs,
                weights: Arc::clone(&weights),
                bound: 1e-5,
            });
        }
    }
    out.push(chunked_case(&weights));
}

/// The delta rule with a chunk of 4 over one sequence in two steps of 10 tokens: whole
/// chunks at positions 0, 4, 12 and 16 run in the chunked form where a backend has it,
/// the tokens at 8, 9, 10, 11 one at a time; the reference runs every token one at a
/// time, so the bound covers the regrouping.
fn chunked_case(weights: &Arc<minfer_gguf::GgufFile>) -> OpCase {
    const NT: usize = 10;
    let m = RecurrentMeta {
        chunk: 4,
        ..meta(false)
    };
    let c = m.channels;
    let mut b = GraphBuilder::new();
    let mut inputs = Vec::new();
    let mut last = None;
    for step in 0..2u64 {
        let name = |what: &str| format!("{what}{step}");
        let x = b.input(&name("x"), [c, NT, 1, 1], DType::F32);
        let pos = b.input(&name("pos"), [NT, 1, 1, 1], DType::I32);
        let slots = b.input(&name("slots"), [NT, 1, 1, 1], DType::I32);
        let al = b.input(&name("alpha"), [HV, NT, 1, 1], DType::F32);
        let be = b.input(&name("beta"), [HV, NT, 1, 1], DType::F32);
        let first = step as u32 * NT as u32;
        inputs.push(f32_input(&name("x"), values(380 + step, c * NT)));
        inputs.push(ids_input(
            &name("pos"),
            (first..first + NT as u32).collect(),
        ));
        inputs.push(ids_input(&name("slots"), vec![1; NT]));
        inputs.push(f32_input(&name("alpha"), values(384 + step, HV * NT)));
        inputs.push(f32_input(&name("beta"), values(386 + step, HV * NT)));
        last = Some(b.delta_net(x, al, be, pos, slots, m.clone()));
    }
    if let Some(y) = last {
        b.output(y);
    }
    OpCase {
        name: format!("delta_net {HK}/{HV} heads of {S}, chunks of 4, two steps nt={NT}"),
        op: "delta_net",
        graph: b.build(),
        inputs,
        weights: Arc::clone(weights),
        bound: 1e-5,
    }
}
