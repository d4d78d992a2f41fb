//! The minfer runtime: the engine that drives a model's graph through the reuse cache,
//! the sampler chain, stop strings, perplexity and the generation loop.

pub mod perplexity;
pub mod sampling;
pub mod stop;

pub use perplexity::PplAccumulator;
pub use sampling::{Sampler, SamplerError, SamplingParams};
pub use stop::{StopEvent, StopScanner};
