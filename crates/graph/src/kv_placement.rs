//! The placement rule for the nodes that touch one layer's KV regions (stores, loads,
//! attention, the decode QKV fusions): the regions live on one backend, so those nodes
//! run on one. A layer whose nodes were placed apart, because a backend took its KV
//! store but declined its attention by capability (a windowed attention, or one with
//! sinks, without that term in the device kernel), moves whole to the first backend in priority
//! order that takes every one of its nodes, the CPU at the latest.

use std::collections::BTreeMap;

use crate::ir::{Backend, ComputeGraph, NodeId};

/// One layer's nodes moved to `backend`; `declined` are the backends ranked above it
/// that refused one of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvMove {
    /// The layer's nodes, in build order.
    pub nodes: Vec<NodeId>,
    /// Where they all run.
    pub backend: Backend,
    /// Higher-priority backends that refused a node of the layer.
    pub declined: Vec<Backend>,
}

/// The moves that put every layer's KV nodes on one backend, given the placed `graph`,
/// the backends in priority `order`, and `takes(backend, node)` (the scheduler's own
/// claim test). Layers already on one backend, and layers with an explicitly placed
/// node (`fixed`), are left as they are.
pub fn colocate_kv(
    graph: &ComputeGraph,
    order: &[Backend],
    fixed: &dyn Fn(NodeId) -> bool,
    takes: &dyn Fn(Backend, NodeId) -> bool,
) -> Vec<KvMove> {
    let mut layers: BTreeMap<usize, Vec<NodeId>> = BTreeMap::new();
    for n in &graph.nodes {
        if let Some(layer) = n.kv_layer() {
            layers.entry(layer).or_default().push(n.id);
        }
    }
    let mut moves = Vec::new();
    for nodes in layers.into_values() {
        let first = graph.nodes[nodes[0]].backend;
        if nodes.iter().all(|&i| graph.nodes[i].backend == first) || nodes.iter().any(|&i| fixed(i))
        {
            continue;
        }
        let backend = order
            .iter()
            .copied()
            .find(|&b| nodes.iter().all(|&i| takes(b, i)))
            .unwrap_or(Backend::CPU);
        let declined = order
            .iter()
            .copied()
            .take_while(|&b| b != backend)
            .collect();
        moves.push(KvMove {
            nodes,
            backend,
            declined,
        });
    }
    moves
}
