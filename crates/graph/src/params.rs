//! Graph parameters (§3.7): the entire reuse identity (invariant 2). Positions and
//! `n_past` are deliberately absent — they are data (invariant 1).

use std::sync::atomic::{AtomicU64, Ordering};

/// Whether the graph processes a prompt or one decode step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GraphType {
    /// One (or a few) tokens per step against the KV cache.
    Decode,
    /// A prompt chunk.
    Prefill,
}

impl GraphType {
    /// Lower-case name used by the JSON export.
    pub fn name(self) -> &'static str {
        match self {
            GraphType::Decode => "decode",
            GraphType::Prefill => "prefill",
        }
    }
}

/// Context parameters that shape the topology.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CParams {
    /// KV region length in rows.
    pub n_ctx: usize,
    /// Attention mode Flash instead of Gqa.
    pub flash_attn: bool,
    /// A GPU backend participates (assignment is topology).
    pub gpu: bool,
    /// Decode QKV fusion enabled.
    pub fuse_qkv: bool,
    /// Decode FFN fusion enabled.
    pub fuse_ffn: bool,
    /// Attention nodes take an explicit span input.
    pub explicit_span: bool,
}

/// Everything the builder's output depends on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GraphParams {
    /// Tokens per step.
    pub n_tokens: usize,
    /// Output rows (tail rows, G3); part of the topology.
    pub n_out: usize,
    /// Prefill or decode.
    pub gtype: GraphType,
    /// Context parameters.
    pub cparams: CParams,
    /// Bumped when weights change (reload, adapters); 1 until then.
    pub weights_version: u64,
}

static WEIGHTS_VERSION: AtomicU64 = AtomicU64::new(1);

/// A fresh weights version, for a future reload to break reuse.
pub fn next_weights_version() -> u64 {
    WEIGHTS_VERSION.fetch_add(1, Ordering::Relaxed) + 1
}
