//! The runtime crate's integration tests, one binary: each module is one former
//! test file, so they link once and share the two cores as one run.

mod backends;
mod batch;
mod bert;
mod checkpoint;
mod constraint;
mod conversation;
mod embed;
mod fusion;
mod gemma;
mod moe;
mod recurrent;
mod reference;
mod rerank;
mod session;
mod speculative;
mod swa;
mod tiny;
mod unwind;
mod wgpu;
