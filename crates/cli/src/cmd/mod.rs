//! One module per subcommand; each is a thin layer over the library crates.

pub mod bench;
pub mod chat;
pub mod common;
pub mod embed;
pub mod info;
pub mod llama_flags;
pub mod params;
pub mod perplexity;
pub mod pull;
pub mod quantize;
pub mod run;
pub mod sampling_flags;
pub mod serve;
pub mod tokenize;
pub mod trace;
pub mod viz;
