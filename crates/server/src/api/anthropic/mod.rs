//! Anthropic's Messages API: `POST /v1/messages` (one JSON answer, or server-sent events
//! in Anthropic's sequence) and `POST /v1/messages/count_tokens`. Errors are Anthropic's
//! `{"type": "error", "error": {"type", "message"}}`; the key may come as `x-api-key`
//! or as a bearer token.
//!
//! A request is read into the shared chat messages and [`crate::params::GenRequest`]
//! (`request`), its tools into the shared [`crate::tools::ToolSpec`], so tool calls are
//! constrained and parsed by the machinery the OpenAI routes use; `response` renders
//! the split answer ([`crate::answer`]) as content blocks, `stream` as events, and
//! `routes` holds the handlers.

mod request;
mod response;
mod routes;
mod stream;
#[cfg(test)]
mod tests;

pub use request::{parse, Parsed, FIELDS};
pub use response::{error_body, AnthropicError};
pub use routes::{is_anthropic_path, routes};
