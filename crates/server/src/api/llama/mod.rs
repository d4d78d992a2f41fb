//! llama-server's native routes, with its field names and semantics: `POST /completion`,
//! `POST /infill` (fill-in-the-middle with the model's FIM tokens), `GET /props` and
//! `POST /apply-template`, and the `--no-slots` / `--no-metrics` switches of `/slots`
//! and `/metrics`.
//!
//! A request is parsed into the one internal [`GenRequest`] and runs through
//! [`generate::start`], the generation path every API shares; only the wire format is
//! here. A request's `model` selects among several served models (as llama-server's
//! router does); without one, the default model answers. As llama-server does on its own routes, fields it does not know are ignored;
//! llama-server features that would change the output and that minfer does not have
//! (grammars, Mirostat, DRY, XTC, ...) are refused by name when set to anything but
//! their neutral value, so a request never silently gets a different sampler.
//!
//! `routes` holds the handlers, `request` reads bodies, `response` renders answers,
//! `fim` lays out fill-in-the-middle prompts, `switches` the endpoint switches and
//! `shape` gives every error on llama-server's paths its shape.

mod fim;
mod request;
mod response;
mod routes;
mod shape;
mod switches;
#[cfg(test)]
pub(crate) mod tests;

pub use fim::{infill_layout, ExtraChunk, Fim, FIM_BATCH};
pub use request::{fim_prompt, has_fim, parse_options, prompt_tokens, Options, MAX_N_PROBS};
pub use response::{error_body, llama_type, LlamaError};
pub use routes::routes;
pub use shape::{is_llama_path, llama_errors};
pub use switches::{metrics_refusal, slots_refusal, Native};
