//! OpenAI's Responses API: `POST /v1/responses` (one response object, or typed
//! server-sent events), `GET` and `DELETE /v1/responses/{id}`, `GET
//! /v1/responses/{id}/input_items` and `POST /v1/responses/{id}/cancel` (always refused:
//! there is no background mode). Responses are kept in memory for
//! `previous_response_id` (`store`: bounded in number and age, see `store`).
//!
//! A request is read into chat messages and the shared [`crate::params::GenRequest`]
//! (`request`): `text.format` constrains the output through the shared constraint and
//! function tools go through the shared tool machinery. `output` turns the split answer
//! ([`crate::answer`]) into output items and their events, `response` builds the
//! response object, `stream` the event stream, `items` the listed input items, and
//! `routes` holds the handlers.

mod items;
mod output;
mod request;
mod response;
mod routes;
pub mod store;
mod stream;
#[cfg(test)]
mod tests;

pub use request::{parse, Parsed, FIELDS};
pub use routes::routes;
pub use store::Store;
