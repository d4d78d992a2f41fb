//! The crate's error type: every failure names the node, buffer or backend involved.

use crate::backend_error::BackendError;
use crate::backend_id::Backend;
use crate::types::NodeId;

/// Everything the graph machinery can refuse.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// A node's id does not equal its position.
    #[error("node at position {position} carries id {id}")]
    BadId {
        /// Position in `nodes`.
        position: usize,
        /// The id it carries.
        id: NodeId,
    },
    /// A source does not precede its consumer (invariant 5) or does not exist.
    #[error("node {node} reads node {src}, which is not built before it")]
    BadSource {
        /// Consumer.
        node: NodeId,
        /// Offending source.
        src: NodeId,
    },
    /// `inputs` lists a node that is not `Op::Input`.
    #[error("graph input {0} is not an input node")]
    BadInput(NodeId),
    /// `outputs` lists a node that does not exist.
    #[error("graph output {0} does not exist")]
    BadOutput(NodeId),
    /// The graph has a cycle.
    #[error("the graph has a cycle")]
    Cycle,
    /// No input node has this name.
    #[error("no graph input named '{0}'")]
    UnknownInput(String),
    /// Host data of the wrong length.
    #[error("input '{name}' takes {expected} values, got {got}")]
    LengthMismatch {
        /// Input name.
        name: String,
        /// Elements the node holds.
        expected: usize,
        /// Elements supplied.
        got: usize,
    },
    /// The allocator holds no backend with this id.
    #[error("backend {0} is not registered with the allocator")]
    BackendMissing(Backend),
    /// Two backends were registered under one id.
    #[error("backend id {0} registered twice")]
    DuplicateBackend(Backend),
    /// A live node has no buffer (alloc_graph was not run for this graph).
    #[error("node {id} '{name}' has no buffer; run alloc_graph for this graph first")]
    NoBuffer {
        /// Node id.
        id: NodeId,
        /// Node name.
        name: String,
    },
    /// A node's buffer (or its KV region) lives on another backend than its split.
    #[error("node {id} '{name}': its {what} lives on {buffer_backend} but its split runs on {split_backend}")]
    SplitMismatch {
        /// Node id.
        id: NodeId,
        /// Node name.
        name: String,
        /// "buffer" or "KV region".
        what: &'static str,
        /// Backend owning the buffer.
        buffer_backend: String,
        /// Backend of the executing split.
        split_backend: String,
    },
    /// A layer's KV region is missing or too small.
    #[error("KV layer {layer}: {problem}")]
    Kv {
        /// Layer index.
        layer: usize,
        /// What is wrong.
        problem: String,
    },
    /// A persistent buffer was requested again with another backend or size.
    #[error("persistent buffer '{name}': {problem}")]
    Persistent {
        /// Buffer name.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// A staged cross-backend copy was read before its wait was issued.
    #[error("staged copy of node {node} into {backend} read before await_cross")]
    CrossNotAwaited {
        /// Source node.
        node: NodeId,
        /// Destination backend.
        backend: String,
    },
    /// A backend refused or failed an operation (invariant 7: never a fallback).
    #[error("{backend}: {context}: {message}")]
    Backend {
        /// Backend name.
        backend: String,
        /// Node or operation that failed.
        context: String,
        /// What the backend refused or failed, with the values (boxed: errors stay small).
        message: Box<BackendError>,
    },
    /// A JSON graph could not be parsed back.
    #[error("graph JSON: {0}")]
    Import(String),
}
