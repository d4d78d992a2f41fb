//! The cli crate's integration tests, one binary: each module is one former
//! test file, so they link once and share the two cores as one run.

#[path = "../common/mod.rs"]
mod common;

mod bench;
mod bert;
mod deploy;
mod info;
mod llama;
mod pull;
mod quantize;
mod quantize_imatrix;
mod run;
mod scale_out;
mod session;
mod speculative;
mod tokenize;
mod trace_wgpu;
mod viz;
mod wgpu;
