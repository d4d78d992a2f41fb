//! The APIs the server speaks, each a codec into the shared [`crate::params::GenRequest`]
//! and [`crate::generate::start`]: `openai` (OpenAI's), `llama` (llama-server's native
//! routes), `ollama` (ollama's), `anthropic` (Anthropic's Messages) and `responses` (OpenAI's
//! Responses), each a folder of its routes, request parsing and
//! response rendering, over the shared field readers of `fields`; `embed` serves every
//! API's embedding routes and rerank through the worker's whole-text tasks.

pub mod anthropic;
pub(crate) mod closed_schema;
pub mod embed;
pub mod fields;
pub mod llama;
pub mod ollama;
pub mod openai;
pub mod prepare;
pub mod responses;
pub mod thinking;
pub mod timings;
