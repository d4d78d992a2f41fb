//! One module per subcommand; each is a thin layer over the library crates.

pub mod info;
pub mod pull;
pub mod tokenize;
