//! The mixture-of-experts feed-forward block the MoE architectures share (llama.cpp's
//! `build_moe_ffn` with SiLU-gated experts and softmax gating): a router matmul gives
//! each token `n_expert` logits, softmax turns them into gate values, the `k` largest
//! choose the token's experts ([`minfer_graph::Op::TopK`]), each chosen expert runs its
//! SwiGLU FFN on the token ([`minfer_graph::Op::MulMatIdSwiGLU`], then
//! [`minfer_graph::Op::MulMatId`] for the down projection), and the outputs are summed
//! weighted by the chosen gate values, renormalised to sum to one where the architecture
//! does so ([`minfer_graph::Op::MoeSum`]). Qwen2-MoE adds a shared expert, a dense FFN
//! every token runs, scaled by `sigmoid(ffn_gate_inp_shexp · x)`.
//!
//! gpt-oss adds a bias to the router and to each expert's gate, up and down products and
//! gates its experts with the clamped SwiGLU ([`Glu::Oai`]); its gate values are the
//! softmax over the chosen experts' logits, which is the full softmax renormalised over
//! the chosen ones (`norm`), up to rounding.
//!
//! The expert choice is data flowing through the graph (the I32 output of the top-k
//! node), so the topology stays a function of the graph params alone (invariant 2).

use minfer_gguf::GgufFile;
use minfer_graph::{Glu, GraphBuilder, NodeId, WeightRef};

use crate::error::ModelError;
use crate::ffn::DenseFfn;
use crate::hparams::{HParams, MoeParams};
use crate::tensors::{blk, experts, matrix};

/// One layer's routed experts (the stacked weights carry their folded shapes, see
/// [`experts`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MoeFfn {
    /// `ffn_gate_inp`: `[n_embd, n_expert]`.
    pub router: WeightRef,
    /// `ffn_gate_exps`, `ffn_up_exps`: `[n_embd, n_ff_exp, n_expert]`.
    pub gate_exps: WeightRef,
    pub up_exps: WeightRef,
    /// `ffn_down_exps`: `[n_ff_exp, n_embd, n_expert]`.
    pub down_exps: WeightRef,
    pub n_expert: usize,
    /// Experts each token uses.
    pub n_used: usize,
    /// The chosen gate values are renormalised to sum to one.
    pub norm: bool,
    /// Qwen2-MoE's shared expert.
    pub shared: Option<SharedExpert>,
    /// The router's bias `[n_expert]` (gpt-oss).
    pub router_bias: Option<WeightRef>,
    /// Stacked biases of the gate, up and down products, `[out, n_expert]` each (gpt-oss).
    pub expert_biases: Option<[WeightRef; 3]>,
    /// The experts' gate activation.
    pub glu: Glu,
}

/// A dense FFN every token runs beside its routed experts, scaled per token by
/// `sigmoid(gate_inp · x)`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SharedExpert {
    /// `ffn_gate_inp_shexp`: `[n_embd]`, one gate value per token.
    pub gate_inp: WeightRef,
    /// `ffn_{gate,up,down}_shexp`.
    pub ffn: DenseFfn,
}

impl MoeFfn {
    /// Reads layer `il`'s router and experts (and the shared expert when `shared`),
    /// checking their shapes against `hp` and `moe`.
    pub fn read(
        file: &GgufFile,
        il: usize,
        hp: &HParams,
        moe: &MoeParams,
        norm: bool,
        shared: bool,
    ) -> Result<Self, ModelError> {
        let (ne, nf, nx) = (hp.n_embd, moe.n_ff_exp, moe.n_expert);
        let shared = if shared {
            Some(SharedExpert {
                gate_inp: matrix(file, &blk(il, "ffn_gate_inp_shexp"), ne, 1)?,
                ffn: DenseFfn::read(file, il, "_shexp", ne, moe.n_ff_shexp)?,
            })
        } else {
            None
        };
        Ok(MoeFfn {
            router: matrix(file, &blk(il, "ffn_gate_inp"), ne, nx)?,
            gate_exps: experts(file, &blk(il, "ffn_gate_exps"), ne, nf, nx)?,
            up_exps: experts(file, &blk(il, "ffn_up_exps"), ne, nf, nx)?,
            down_exps: experts(file, &blk(il, "ffn_down_exps"), nf, ne, nx)?,
            n_expert: nx,
            n_used: moe.n_expert_used,
            norm,
            shared,
            router_bias: None,
            expert_biases: None,
            glu: Glu::Silu,
        })
    }

    /// Parameters one token reads: the router, its `n_used` experts' share of the
    /// stacked weights, and the shared expert.
    pub fn active_params(&self) -> u64 {
        let n = |w: &WeightRef| (w.shape[0] * w.shape[1]) as u64;
        let stacked = n(&self.gate_exps) + n(&self.up_exps) + n(&self.down_exps);
        let shared = self.shared.as_ref().map_or(0, |s| {
            n(&s.gate_inp) + n(&s.ffn.gate) + n(&s.ffn.up) + n(&s.ffn.down)
        });
        n(&self.router) + stacked / self.n_expert as u64 * self.n_used as u64 + shared
    }

    /// Every tensor of the block, in a fixed order.
    pub fn all(&self) -> Vec<&WeightRef> {
        let mut v = vec![
            &self.router,
            &self.gate_exps,
            &self.up_exps,
            &self.down_exps,
        ];
        if let Some(s) = &self.shared {
            v.extend([&s.gate_inp, &s.ffn.gate, &s.ffn.up, &s.ffn.down]);
        }
        v.extend(
            self.router_bias
                .iter()
                .chain(self.expert_biases.iter().flatten()),
        );
        v
    }
}

/// The block of layer `il` from the normed input to its output (what the residual add
/// takes); node names carry llama.cpp's callback names with the `-{il}` suffix.
pub(crate) fn build_ffn(b: &mut GraphBuilder, il: usize, normed: NodeId, m: &MoeFfn) -> NodeId {
    let name = |n: &str| format!("{n}-{il}");
    let mm = |b: &mut GraphBuilder, n: &str, x: NodeId, w: &WeightRef| {
        let id = b.matmul(x, w, None);
        b.set_name(id, &name(n));
        id
    };
    let logits = b.matmul(normed, &m.router, m.router_bias.as_ref());
    b.set_name(logits, &name("ffn_moe_logits"));
    let probs = b.softmax(logits, 0);
    b.set_name(probs, &name("ffn_moe_probs"));
    let ids = b.top_k(probs, m.n_used);
    b.set_name(ids, &name("ffn_moe_topk"));
    let par = b.mul_mat_id_swiglu(normed, ids, &m.gate_exps, &m.up_exps, m.n_expert);
    b.set_name(par, &name("ffn_moe_gate_par"));
    let down = b.mul_mat_id(par, ids, &m.down_exps, m.n_expert);
    b.set_name(down, &name("ffn_moe_down"));
    if let Some([gate_b, up_b, down_b]) = &m.expert_biases {
        b.set_expert_terms(par, Some(up_b), Some(gate_b), m.glu);
        b.set_expert_terms(down, Some(down_b), None, Glu::Silu);
    } else if !m.glu.is_silu() {
        b.set_expert_terms(par, None, None, m.glu);
    }
    let out = b.moe_sum(down, probs, ids, m.norm);
    b.set_name(out, &name("ffn_moe_out"));
    let Some(s) = &m.shared else {
        return out;
    };
    let gate_inp = mm(b, "ffn_shexp_gate_inp", normed, &s.gate_inp);
    let g = mm(b, "ffn_shexp_gate", normed, &s.ffn.gate);
    let u = mm(b, "ffn_shexp_up", normed, &s.ffn.up);
    let act = b.silu(g);
    b.set_name(act, &name("ffn_shexp_silu"));
    // Mul(silu(gate), up): the FusionPass folds it into SwiGLU.
    let par = b.mul(act, u);
    b.set_name(par, &name("ffn_shexp_par"));
    let sh = mm(b, "ffn_shexp", par, &s.ffn.down);
    let sh = b.mul_sigmoid(sh, gate_inp);
    b.set_name(sh, &name("ffn_shexp_out"));
    let sum = b.add(out, sh);
    b.set_name(sum, &name("ffn_out"));
    sum
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use minfer_gguf::{GgmlType, GgufFile, GgufWriter};
    use minfer_graph::testing::cases::{relative_error, CaseInput, OpCase, Prepared};
    use minfer_graph::testing::RefBackend;
    use minfer_graph::{DType, WeightType};
    use minfer_testkit::Rng;

    use super::*;

    const NE: usize = 32;
    const NF: usize = 16;
    const NX: usize = 8;
    const K: usize = 2;
    const NT: usize = 3;

    type Tensors = BTreeMap<&'static str, (Vec<u64>, Vec<f32>)>;

    /// Random F32 weights of one layer's experts, router and shared expert.
    fn tensors(seed: u64) -> Tensors {
        let mut r = Rng::new(seed);
        let (ne, nf, nx) = (NE as u64, NF as u64, NX as u64);
        let mut t = Tensors::new();
        let mut add = |name, dims: Vec<u64>, scale: f32| {
            let n = dims.iter().product::<u64>() as usize;
            t.insert(name, (dims, r.vec(n, scale)));
        };
        add("ffn_gate_inp", vec![ne, nx], 1.0);
        add("ffn_gate_exps", vec![ne, nf, nx], 0.3);
        add("ffn_up_exps", vec![ne, nf, nx], 0.3);
        add("ffn_down_exps", vec![nf, ne, nx], 0.3);
        add("ffn_gate_inp_shexp", vec![ne], 0.3);
        add("ffn_gate_shexp", vec![ne, nf], 0.3);
        add("ffn_up_shexp", vec![ne, nf], 0.3);
        add("ffn_down_shexp", vec![nf, ne], 0.3);
        t
    }

    fn wref(name: &str, shape: [usize; 2]) -> WeightRef {
        WeightRef::new(name, WeightType::F32, shape)
    }

    fn block(norm: bool, shared: bool) -> MoeFfn {
        MoeFfn {
            router: wref("ffn_gate_inp", [NE, NX]),
            gate_exps: wref("ffn_gate_exps", [NE, NF * NX]),
            up_exps: wref("ffn_up_exps", [NE, NF * NX]),
            down_exps: wref("ffn_down_exps", [NF, NE * NX]),
            n_expert: NX,
            n_used: K,
            norm,
            shared: shared.then(|| SharedExpert {
                gate_inp: wref("ffn_gate_inp_shexp", [NE, 1]),
                ffn: DenseFfn {
                    gate: wref("ffn_gate_shexp", [NE, NF]),
                    up: wref("ffn_up_shexp", [NE, NF]),
                    down: wref("ffn_down_shexp", [NF, NE]),
                },
            }),
            router_bias: None,
            expert_biases: None,
            glu: Glu::Silu,
        }
    }

    /// The block's graph on the reference backend.
    fn run(t: &Tensors, m: &MoeFfn, x: &[f32]) -> Vec<f32> {
        let mut b = GraphBuilder::new();
        let xin = b.input("x", [NE, NT, 1, 1], DType::F32);
        let y = build_ffn(&mut b, 0, xin, m);
        b.output(y);
        let mut w = GgufWriter::new();
        for (name, (dims, v)) in t {
            w.add_tensor_f32(name, dims, GgmlType::F32, v).unwrap();
        }
        let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let case = OpCase {
            name: "moe block".into(),
            op: "moe_sum",
            graph: b.build(),
            inputs: vec![("x".into(), CaseInput::F32(x.to_vec()))],
            weights: Arc::new(file),
            bound: 0.0,
        };
        Prepared::new(&case, vec![Box::new(RefBackend::cpu())])
            .unwrap()
            .run()
            .unwrap()
    }

    fn silu(v: f64) -> f64 {
        v / (1.0 + (-v).exp())
    }

    /// `rows` rows of `w` (memory `[rows][cols]`, starting at row `r0`) times `x`, in f64.
    fn product(w: &[f32], r0: usize, rows: usize, x: &[f64]) -> Vec<f64> {
        let cols = x.len();
        (r0..r0 + rows)
            .map(|r| {
                let wr = &w[r * cols..(r + 1) * cols];
                wr.iter().zip(x).map(|(&a, b)| f64::from(a) * b).sum()
            })
            .collect()
    }

    /// Token `x`'s experts (descending gate value, ties to the lower index) and gates.
    fn route(t: &Tensors, x: &[f64], k: usize) -> (Vec<usize>, Vec<f64>) {
        let logits = product(&t["ffn_gate_inp"].1, 0, NX, x);
        let mx = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = logits.iter().map(|l| (l - mx).exp()).collect();
        let sum: f64 = e.iter().sum();
        let probs: Vec<f64> = e.iter().map(|v| v / sum).collect();
        let mut order: Vec<usize> = (0..NX).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        order.truncate(k);
        (order, probs)
    }

    /// The block computed token by token in f64, every expert of the choice run densely.
    fn naive(t: &Tensors, x: &[f32], k: usize, norm: bool, shared: bool) -> Vec<f32> {
        let mut out = Vec::new();
        for xr in x.chunks(NE) {
            let xr: Vec<f64> = xr.iter().map(|&v| f64::from(v)).collect();
            let (chosen, probs) = route(t, &xr, k);
            let mut w: Vec<f64> = chosen.iter().map(|&e| probs[e]).collect();
            if norm {
                let s: f64 = w.iter().sum();
                w.iter_mut().for_each(|v| *v /= s);
            }
            let mut y = vec![0.0f64; NE];
            let ffn = |gate: &str, up: &str, down: &str, e: usize| {
                let g = product(&t[gate].1, e * NF, NF, &xr);
                let u = product(&t[up].1, e * NF, NF, &xr);
                let h: Vec<f64> = g.iter().zip(&u).map(|(&a, &b)| silu(a) * b).collect();
                product(&t[down].1, e * NE, NE, &h)
            };
            for (&e, &wj) in chosen.iter().zip(&w) {
                let o = ffn("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", e);
                y.iter_mut().zip(&o).for_each(|(a, b)| *a += wj * b);
            }
            if shared {
                let gi = product(&t["ffn_gate_inp_shexp"].1, 0, 1, &xr)[0];
                let s = ffn("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", 0);
                let sg = 1.0 / (1.0 + (-gi).exp());
                y.iter_mut().zip(&s).for_each(|(a, b)| *a += sg * b);
            }
            out.extend(y.iter().map(|&v| v as f32));
        }
        out
    }

    fn input() -> Vec<f32> {
        Rng::new(5).vec(NE * NT, 1.0)
    }

    /// The graph is the naive per-token computation, and not the one that ignores the
    /// top-k (every expert weighted) or the renormalisation.
    #[test]
    fn the_block_is_the_naive_per_token_computation() {
        let t = tensors(1);
        let x = input();
        for (norm, shared) in [(true, false), (false, true), (true, true)] {
            let got = run(&t, &block(norm, shared), &x);
            let want = naive(&t, &x, K, norm, shared);
            let e = relative_error(&got, &want);
            assert!(e < 1e-5, "norm {norm} shared {shared}: error {e}");
            let dense = naive(&t, &x, NX, norm, shared);
            assert!(relative_error(&got, &dense) > 1e-2, "top-k is not felt");
            let other = naive(&t, &x, K, !norm, shared);
            assert!(
                relative_error(&got, &other) > 1e-2,
                "renormalisation is not felt"
            );
        }
        // The router switches experts across tokens.
        let choices: Vec<Vec<usize>> = x
            .chunks(NE)
            .map(|r| route(&t, &r.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(), K).0)
            .collect();
        assert!(choices.windows(2).any(|w| w[0] != w[1]), "{choices:?}");
    }

    /// Perturbing an expert no token chose leaves the output's bits alone; perturbing a
    /// chosen one changes them.
    #[test]
    fn only_the_chosen_experts_matter() {
        let t = tensors(2);
        let x = input();
        let m = block(true, false);
        let base = run(&t, &m, &x);
        let mut used = [false; NX];
        for r in x.chunks(NE) {
            let xr: Vec<f64> = r.iter().map(|&v| f64::from(v)).collect();
            for e in route(&t, &xr, K).0 {
                used[e] = true;
            }
        }
        let perturbed = |e: usize| {
            let mut t = t.clone();
            for name in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
                let v = &mut t.get_mut(name).unwrap().1;
                let n = v.len() / NX;
                v[e * n..(e + 1) * n].iter_mut().for_each(|w| *w += 0.5);
            }
            run(&t, &m, &x)
        };
        let unused = used
            .iter()
            .position(|&u| !u)
            .expect("an expert no token chose");
        assert_eq!(perturbed(unused), base, "expert {unused} was not chosen");
        let chosen = used.iter().position(|&u| u).expect("a chosen expert");
        assert_ne!(perturbed(chosen), base, "expert {chosen} was chosen");
    }
}
