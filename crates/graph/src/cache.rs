//! The reuse cache (§3.7, §6): the graph, the allocator that outlives it (and so the
//! KV regions), and the params it was built from. Reuse is decided by params alone.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::alloc::GraphAllocator;
use crate::error::GraphError;
use crate::fusion::FusionPass;
use crate::ir::ComputeGraph;
use crate::params::GraphParams;
use crate::scheduler::BackendScheduler;

static NEXT_GRAPH_UID: AtomicU64 = AtomicU64::new(1);

/// How often the cache rebuilt and reused (read by tests and the CLI).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// Graphs installed by `replace_graph`.
    pub builds: u64,
    /// Successful `try_reuse` calls.
    pub reuses: u64,
}

/// One engine's cached graph plus the allocator holding its KV.
#[derive(Debug)]
pub struct GraphCache {
    graph: Option<ComputeGraph>,
    alloc: GraphAllocator,
    prev_params: Option<GraphParams>,
    counters: CacheCounters,
}

impl GraphCache {
    /// An empty cache around `alloc`.
    pub fn new(alloc: GraphAllocator) -> Self {
        GraphCache {
            graph: None,
            alloc,
            prev_params: None,
            counters: CacheCounters::default(),
        }
    }

    /// Whether two params give the same topology: every field, fusion flags included.
    pub fn params_match(a: &GraphParams, b: &GraphParams) -> bool {
        a == b
    }

    /// True when a graph is cached for params equal to `params`; never inspects nodes.
    pub fn try_reuse(&mut self, params: &GraphParams) -> bool {
        match (&self.prev_params, &self.graph) {
            (Some(prev), Some(_)) if Self::params_match(prev, params) => {
                self.counters.reuses += 1;
                true
            }
            _ => false,
        }
    }

    /// Stores `graph` under a fresh process-wide uid; the allocator (and KV) stays.
    pub fn replace_graph(&mut self, mut graph: ComputeGraph, params: GraphParams) -> u64 {
        graph.uid = NEXT_GRAPH_UID.fetch_add(1, Ordering::Relaxed);
        let uid = graph.uid;
        self.graph = Some(graph);
        self.prev_params = Some(params);
        self.counters.builds += 1;
        uid
    }

    /// The rebuild path: assign backends, run fusion, allocate, then `replace_graph`.
    /// Returns the fusion rewrite count. On error nothing is cached.
    pub fn install(
        &mut self,
        mut graph: ComputeGraph,
        params: GraphParams,
        scheduler: &mut BackendScheduler,
        fusion: &FusionPass,
    ) -> Result<usize, GraphError> {
        self.graph = None;
        self.prev_params = None;
        scheduler.assign_backends(&mut graph, &self.alloc);
        let fused = fusion.run(&mut graph, &self.alloc);
        self.alloc.alloc_graph(&graph)?;
        self.replace_graph(graph, params);
        Ok(fused)
    }

    /// The cached graph and the allocator, borrowed together for fill + execute.
    pub fn current(&mut self) -> Option<(&ComputeGraph, &mut GraphAllocator)> {
        let g = self.graph.as_ref()?;
        Some((g, &mut self.alloc))
    }

    /// The cached graph.
    pub fn graph(&self) -> Option<&ComputeGraph> {
        self.graph.as_ref()
    }

    /// The allocator.
    pub fn alloc(&self) -> &GraphAllocator {
        &self.alloc
    }

    /// The allocator, mutably (backend setup, KV inspection).
    pub fn alloc_mut(&mut self) -> &mut GraphAllocator {
        &mut self.alloc
    }

    /// Build and reuse counts so far.
    pub fn counters(&self) -> CacheCounters {
        self.counters
    }

    /// Forgets the cached graph so the next step rebuilds and reallocates it; the
    /// allocator keeps its KV regions and every pool id (used after a failed or
    /// interrupted execution, whose intermediate buffers are not trusted).
    pub fn forget_graph(&mut self) {
        self.graph = None;
        self.prev_params = None;
    }

    /// Debug check of invariant 2: `a` and `b` have the same nodes (op with payloads,
    /// shape, sources), inputs and outputs.
    #[cfg(any(test, debug_assertions))]
    pub fn verify_structural(a: &ComputeGraph, b: &ComputeGraph) -> bool {
        a.nodes.len() == b.nodes.len()
            && a.inputs == b.inputs
            && a.outputs == b.outputs
            && a.nodes
                .iter()
                .zip(&b.nodes)
                .all(|(x, y)| x.op == y.op && x.out_shape == y.out_shape && x.src == y.src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::GraphBuilder;
    use crate::ir::*;
    use crate::params::{CParams, GraphType};
    use crate::testing::RefBackend;

    fn params(nt: usize, fuse_qkv: bool, fuse_ffn: bool) -> GraphParams {
        GraphParams {
            n_tokens: nt,
            n_out: nt,
            gtype: if nt == 1 {
                GraphType::Decode
            } else {
                GraphType::Prefill
            },
            cparams: CParams {
                n_ctx: 16,
                flash_attn: false,
                gpu: false,
                fuse_qkv,
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

    fn build(p: &GraphParams) -> ComputeGraph {
        let mut b = GraphBuilder::new();
        let x = b.input("x", [4, p.n_tokens, 1, 1], DType::F32);
        let s = b.silu(x);
        let y = b.mul(s, x);
        b.output(y);
        b.build()
    }

    fn cache() -> GraphCache {
        GraphCache::new(GraphAllocator::new(vec![Box::new(RefBackend::cpu())]).unwrap())
    }

    #[test]
    fn structural_check_fails_on_an_extra_node() {
        let p = params(2, false, false);
        let a = build(&p);
        assert!(GraphCache::verify_structural(&a, &build(&p)));
        let mut b = a.clone();
        let mut extra = b.nodes[1].clone();
        extra.id = b.nodes.len();
        b.nodes.push(extra);
        assert!(!GraphCache::verify_structural(&a, &b));
        let mut c = a.clone();
        c.nodes[0].out_shape[0] = 5;
        assert!(!GraphCache::verify_structural(&a, &c));
    }

    #[test]
    fn equal_params_reuse_with_identical_topology() {
        let mut c = cache();
        let p = params(3, false, false);
        assert!(!c.try_reuse(&p));
        let mut sched = BackendScheduler::new();
        c.install(build(&p), p.clone(), &mut sched, &FusionPass)
            .unwrap();
        let uid = c.graph().unwrap().uid;
        assert!(uid >= 1);
        assert!(c.try_reuse(&p.clone()));
        // Equal params produce a structurally identical graph, so reuse is sound.
        let mut fresh = build(&p);
        sched.assign_backends(&mut fresh, c.alloc());
        FusionPass.run(&mut fresh, c.alloc());
        assert!(GraphCache::verify_structural(c.graph().unwrap(), &fresh));
        assert_eq!(
            c.counters(),
            CacheCounters {
                builds: 1,
                reuses: 1
            }
        );
        assert_eq!(c.graph().unwrap().uid, uid, "reuse keeps the uid");
    }

    #[test]
    fn fuse_flags_are_part_of_the_reuse_identity() {
        for (from, to) in [
            ((false, false), (true, false)),
            ((true, false), (false, false)),
            ((false, false), (false, true)),
            ((false, true), (false, false)),
        ] {
            let mut c = cache();
            let p = params(1, from.0, from.1);
            c.replace_graph(build(&p), p.clone());
            assert!(c.try_reuse(&p));
            assert!(!c.try_reuse(&params(1, to.0, to.1)), "{from:?} -> {to:?}");
        }
    }

    #[test]
    fn uids_are_fresh_and_monotonic() {
        let mut c = cache();
        let p = params(1, false, false);
        let a = c.replace_graph(build(&p), p.clone());
        let b = c.replace_graph(build(&p), p);
        assert!(a >= 1 && b > a);
    }
}
