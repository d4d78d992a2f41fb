//! One piece of an answer as the reasoning splitters hand it on (`reasoning` for
//! `<think>` blocks, `harmony` for gpt-oss's channels), in its own file so that both
//! splitters name it without naming each other.

/// A piece of split output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Text inside the reasoning block.
    Reasoning(String),
    /// Answer text.
    Content(String),
    /// A whole tool call in the model's own message format (harmony's `to=functions.NAME`
    /// messages): the function's name and its arguments as written.
    Call {
        /// The function's name.
        name: String,
        /// The arguments' text.
        arguments: String,
    },
}
