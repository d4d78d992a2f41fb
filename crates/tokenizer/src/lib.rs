//! Tokenizer and chat templates from GGUF metadata.
//!
//! [`Tokenizer`] is a byte-level BPE (`tokenizer.ggml.model = "gpt2"`) built from
//! `tokenizer.ggml.tokens`, `token_type` and `merges`, with the pre-tokenizer named by
//! `tokenizer.ggml.pre` ([`PreKind`]), or a SentencePiece-style vocabulary
//! (`tokenizer.ggml.model = "llama"`: `tokens`, `scores`, `token_type`, byte fallback),
//! or WordPiece (`"bert"`: llama.cpp's WPM normalizer and greedy longest-piece cut).
//! Unknown models and pre-tokenizers are refused by name.
//! Encoding follows llama.cpp's rules for special tokens; decoding is byte-exact.
//! [`StreamDecoder`] turns a token stream into whole UTF-8 characters, and [`ChatTemplate`]
//! renders `tokenizer.chat_template` with minijinja. [`Tokenizer::encode_pair`] joins a
//! (query, document) pair as llama.cpp's rerank does.

mod bpe;
mod bytes;
mod error;
mod hash;
mod jinja_compat;
mod pair;
mod pretok;
mod spm;
mod stream;
mod strftime;
mod template;
mod texts;
mod tokenizer;
mod vocab;
mod wpm;

pub use error::{TemplateError, TokenizerError};
pub use pair::PairEnd;
pub use pretok::{PreKind, PreTokenizer};
pub use stream::StreamDecoder;
pub use template::{ChatMessage, ChatTemplate, RenderedChat, ToolCall, CHATML_TEMPLATE};
pub use tokenizer::Tokenizer;
pub use vocab::{TokenType, EOG_TEXTS};
