//! The peephole fusion pass (§5.2). Rules are data: each `FusionRule` pairs a
//! pattern (which recognizes a node and proposes its rewrite) with the capability
//! tag the rewritten node's backend must report (invariant 6). A new rule is one
//! `RULES` entry plus its test.
//!
//! A rewrite replaces the anchor node's op and sources in place (so ids and build
//! order are untouched) and marks the producers it absorbed dead: the scheduler
//! skips them and the allocator gives them no buffer.

use crate::alloc::GraphAllocator;
use crate::ir::*;

/// What a pattern proposes for its anchor node.
#[derive(Debug, Clone, PartialEq)]
pub struct Rewrite {
    /// The anchor's new op.
    pub op: Op,
    /// The anchor's new sources.
    pub src: Vec<NodeId>,
    /// Producers absorbed by the rewrite; they become dead.
    pub orphans: Vec<NodeId>,
}

/// One fusion rule: a pattern and the capability gating it.
#[derive(Debug, Clone, Copy)]
pub struct FusionRule {
    /// Diagnostic name.
    pub name: &'static str,
    /// Capability the anchor's backend must report through `supports_fused`.
    pub fused: FusedOp,
    /// Recognizes `anchor` in `graph` given live consumer counts.
    pub pattern: fn(graph: &ComputeGraph, anchor: NodeId, consumers: &[usize]) -> Option<Rewrite>,
}

/// The rule table, applied in order.
pub const RULES: &[FusionRule] = &[
    FusionRule {
        name: "swiglu",
        fused: FusedOp::SwiGLU,
        pattern: swiglu_pattern,
    },
    FusionRule {
        name: "geglu",
        fused: FusedOp::GeGLU,
        pattern: geglu_pattern,
    },
];

/// `Mul(Silu(x), y) -> SwiGLU(x, y)`.
fn swiglu_pattern(g: &ComputeGraph, anchor: NodeId, consumers: &[usize]) -> Option<Rewrite> {
    gated_pattern(g, anchor, consumers, Op::Silu, Op::SwiGLU)
}

/// `Mul(Gelu(x), y) -> GeGLU(x, y)`.
fn geglu_pattern(g: &ComputeGraph, anchor: NodeId, consumers: &[usize]) -> Option<Rewrite> {
    gated_pattern(g, anchor, consumers, Op::Gelu, Op::GeGLU)
}

/// `Mul(act(x), y) -> gated(x, y)`, with the activation on either side. The activation
/// must be live, not a graph output, and consumed only by this Mul, so nothing is
/// duplicated.
fn gated_pattern(
    g: &ComputeGraph,
    anchor: NodeId,
    consumers: &[usize],
    act: Op,
    gated: Op,
) -> Option<Rewrite> {
    let node = g.nodes.get(anchor)?;
    if node.op != Op::Mul || node.src.len() != 2 {
        return None;
    }
    let absorbable = |s: NodeId| {
        g.nodes[s].op == act
            && g.nodes[s].src.len() == 1
            && !g.is_dead(s)
            && consumers[s] == 1
            && !g.outputs.contains(&s)
            && g.nodes[s].out_shape == node.out_shape
    };
    let (a, other) = if absorbable(node.src[0]) {
        (node.src[0], node.src[1])
    } else if absorbable(node.src[1]) {
        (node.src[1], node.src[0])
    } else {
        return None;
    };
    Some(Rewrite {
        op: gated,
        src: vec![g.nodes[a].src[0], other],
        orphans: vec![a],
    })
}

/// Runs the rule table over a graph.
#[derive(Debug, Default, Clone, Copy)]
pub struct FusionPass;

impl FusionPass {
    /// A pass over `RULES`.
    pub fn new() -> Self {
        FusionPass
    }

    /// Applies every rule whose anchor's backend (CPU when unassigned) reports the
    /// rule's capability in `alloc`; returns the number of rewrites.
    pub fn run(&self, graph: &mut ComputeGraph, alloc: &GraphAllocator) -> usize {
        self.run_with(graph, &|b, f| {
            alloc.backend(b).is_some_and(|x| x.supports_fused(f))
        })
    }

    /// `run` with an explicit capability oracle `(backend, tag) -> supported`.
    pub fn run_with(
        &self,
        graph: &mut ComputeGraph,
        supports: &dyn Fn(Backend, FusedOp) -> bool,
    ) -> usize {
        let mut count = 0;
        for rule in RULES {
            let mut consumers = graph.consumer_counts();
            for anchor in 0..graph.nodes.len() {
                if graph.is_dead(anchor) {
                    continue;
                }
                let backend = graph.nodes[anchor].backend.unwrap_or(Backend::CPU);
                if !supports(backend, rule.fused) {
                    continue;
                }
                let Some(rw) = (rule.pattern)(graph, anchor, &consumers) else {
                    continue;
                };
                let node = &mut graph.nodes[anchor];
                node.op = rw.op;
                node.src = rw.src;
                for &o in &rw.orphans {
                    graph.mark_dead(o);
                }
                consumers = graph.consumer_counts();
                count += 1;
            }
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::GraphBuilder;

    fn ffn(silu_left: bool) -> (ComputeGraph, NodeId, NodeId) {
        let mut b = GraphBuilder::new();
        let g = b.input("g", [4, 2, 1, 1], DType::F32);
        let u = b.input("u", [4, 2, 1, 1], DType::F32);
        let s = b.silu(g);
        let m = if silu_left { b.mul(s, u) } else { b.mul(u, s) };
        b.output(m);
        (b.build(), s, m)
    }

    #[test]
    fn silu_on_either_side_is_rewritten() {
        for left in [true, false] {
            let (mut g, s, m) = ffn(left);
            assert_eq!(FusionPass.run_with(&mut g, &|_, _| true), 1);
            assert_eq!(g.nodes[m].op, Op::SwiGLU);
            assert_eq!(g.nodes[m].src, vec![0, 1]);
            assert!(g.is_dead(s));
            assert_eq!(g.live_count(), 3);
        }
    }

    #[test]
    fn gelu_times_up_becomes_geglu_only_where_the_backend_fuses_it() {
        let mut b = GraphBuilder::new();
        let g = b.input("g", [4, 2, 1, 1], DType::F32);
        let u = b.input("u", [4, 2, 1, 1], DType::F32);
        let s = b.gelu(g);
        let m = b.mul(u, s);
        b.output(m);
        let graph = b.build();
        let mut off = graph.clone();
        let only_swiglu = |_: Backend, f: FusedOp| f == FusedOp::SwiGLU;
        assert_eq!(FusionPass.run_with(&mut off, &only_swiglu), 0);
        assert_eq!(off.nodes[m].op, Op::Mul);
        let mut on = graph;
        assert_eq!(FusionPass.run_with(&mut on, &|_, _| true), 1);
        assert_eq!(on.nodes[m].op, Op::GeGLU);
        assert_eq!(on.nodes[m].src, vec![g, u]);
        assert!(on.is_dead(s));
    }

    #[test]
    fn the_gate_and_the_sole_consumer_rule_hold() {
        let (mut g, _, m) = ffn(true);
        assert_eq!(FusionPass.run_with(&mut g, &|_, _| false), 0);
        assert_eq!(g.nodes[m].op, Op::Mul);

        // A Silu read elsewhere must stay: fusing would duplicate its work.
        let mut b = GraphBuilder::new();
        let x = b.input("x", [4, 1, 1, 1], DType::F32);
        let s = b.silu(x);
        let m = b.mul(s, x);
        let a = b.add(s, m);
        b.output(a);
        let mut g = b.build();
        assert_eq!(FusionPass.run_with(&mut g, &|_, _| true), 0);
        assert!(!g.is_dead(s));
    }
}
