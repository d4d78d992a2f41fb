//! ollama's API: `POST /api/chat` and `POST /api/generate` (NDJSON streams by default,
//! ollama's `options` names, durations in nanoseconds), `GET /api/tags`,
//! `POST /api/show`, `GET /api/version`, `GET /api/ps` and `GET /` (`Ollama is
//! running`). Errors are ollama's
//! `{"error": "..."}` with its status codes.
//!
//! Requests are parsed into the one internal [`GenRequest`] and run through
//! [`generate::start`], the generation path every API shares; only the wire format is
//! here. A request's `model` names one of the served models (`NAME` or `NAME:latest`);
//! `/api/tags` lists every served model and `/api/ps` the loaded ones. The routes that manage models (`pull`, `push`, `create`, `copy`, `delete`)
//! answer 501 with the reason; `/api/embed` and `/api/embeddings` are `api::embed`'s.
//!
//! `routes` holds the handlers, `request` reads bodies (`format`'s objects closed as
//! ollama reads them, by `api::closed_schema`), `options` their `options`, `response`
//! renders answers and `facts` what ollama reports about a model.

mod facts;
mod options;
mod request;
mod response;
mod routes;
#[cfg(test)]
mod tests;

pub(crate) use facts::tag_name;
pub use facts::{rfc3339, ModelFacts, MAX_INFO_ARRAY};
pub use options::parse_options;
pub use response::OllamaError;
pub(crate) use routes::served;
pub use routes::{routes, VERSION};
