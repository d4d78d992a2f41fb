//! What the per-node trace hands its sink for each executed step.

use minfer_graph::trace::NodeTrace;

/// Entries of a traced step's `logits_top`.
pub const TRACE_LOGITS_TOP: usize = 5;

/// One step as the per-node trace records it (see [`Engine::set_trace`]).
#[derive(Debug, Clone)]
pub struct TracedStep {
    /// `prefill` (more than one token) or `decode`.
    pub kind: &'static str,
    /// The uid of the graph the step ran; a new uid starts a new phase.
    pub graph_uid: u64,
    /// The graph's `minfer-graph` export, on the first step of each graph only.
    pub graph: Option<serde_json::Value>,
    /// Every captured node, in execution order.
    pub nodes: Vec<NodeTrace>,
    /// The largest logits of the step's last output row, `(token id, logit)`.
    pub logits_top: Vec<(u32, f32)>,
}

/// Where traced steps go: called once per executed step.
pub type TraceSink = Box<dyn FnMut(TracedStep) + Send>;

/// The engine's side of an active trace.
pub(super) struct EngineTrace {
    pub(super) sink: TraceSink,
    pub(super) last_uid: Option<u64>,
}
