//! The server crate's integration tests, one binary: each module is one former
//! test file, so they link once and share the two cores as one run.

#[path = "../common/mod.rs"]
mod common;

mod agent_apis;
mod api;
mod checkpoints;
mod cross_site;
mod e2e_agents;
mod e2e_openai;
mod e2e_structured;
mod embeddings;
mod fields;
mod harmony;
mod llama_api;
mod load_real;
mod models;
mod ollama_api;
mod openai_shape;
mod prompt_cache;
mod rerank;
mod slots;
mod speculative;
mod speculative_draft;
mod structured;
mod thinking;
mod xml_tools;
