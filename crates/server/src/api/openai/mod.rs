//! OpenAI's API: `routes` (the handlers), `request` (chat and text completion bodies
//! read into the shared request) and `response` (answers as JSON or server-sent events).

mod request;
mod response;
mod routes;

pub use crate::generate::{
    chat_prompt, chat_prompt_with_tools, completion_prompt, fault_of, KERNEL_PANIC_MARKER,
    PANIC_MARKER, SLOW_MARKER, SLOW_PREFILL_MARKER,
};
pub use request::{
    continuation, parse_chat, parse_completion, CHAT_FIELDS, COMPLETION_FIELDS, NO_EFFECT_FIELDS,
};
pub use response::{fingerprint, generate, now_secs, secs, Kind};
pub use routes::routes;
