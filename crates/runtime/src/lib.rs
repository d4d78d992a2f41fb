//! The minfer runtime: the engine that drives a model's graph through the reuse cache,
//! the sampler chain, and the generation loop.

pub mod sampling;

pub use sampling::{Sampler, SamplerError, SamplingParams};
