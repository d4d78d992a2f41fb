//! Typed errors of tokenizer construction, encoding, decoding and chat templates.

use minfer_gguf::GgufError;

/// Every way building or using a tokenizer can fail. Each variant names the offending value.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// Reading a metadata key failed (missing or mistyped).
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A required tokenizer metadata key is absent.
    #[error("missing metadata key `{key}`")]
    MissingKey { key: &'static str },
    /// A tokenizer metadata key holds a value of the wrong type.
    #[error("metadata key `{key}` is not {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
    },
    /// `tokenizer.ggml.model` names a tokenizer minfer does not implement.
    #[error("unsupported tokenizer model `{0}` (supported: gpt2, llama, bert)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer minfer does not implement.
    #[error(
        "unsupported pre-tokenizer `{0}` (supported: qwen2, llama-bpe, smollm, gpt-2 and their aliases)"
    )]
    UnsupportedPreTokenizer(String),
    /// The token-type array does not match the token list.
    #[error(
        "tokenizer.ggml.token_type has {types} entries but tokenizer.ggml.tokens has {tokens}"
    )]
    TokenTypeCount { tokens: usize, types: usize },
    /// The score array does not match the token list.
    #[error("tokenizer.ggml.scores has {scores} entries but tokenizer.ggml.tokens has {tokens}")]
    ScoreCount { tokens: usize, scores: usize },
    /// The vocabulary is too large for 32-bit token ids.
    #[error("vocabulary of {0} tokens exceeds the 32-bit id range")]
    VocabTooLarge(usize),
    /// The vocabulary lacks a token for one of the 256 bytes (a byte-level symbol, or for
    /// SentencePiece a `<0xNN>` byte token with no unknown token to stand in).
    #[error("vocabulary has no token for byte 0x{0:02x}")]
    MissingByteToken(u8),
    /// A merge rule is not of the form `left right`.
    #[error("tokenizer.ggml.merges entry #{index} `{text}` is not two space-separated pieces")]
    BadMerge { index: usize, text: String },
    /// The model asks for a BOS/EOS token to be added but does not name one.
    #[error("tokenizer.ggml.add_{which}_token is true but no valid {which} token id is set")]
    MissingSpecial { which: &'static str },
    /// A token id outside the vocabulary was given to the decoder.
    #[error("token id {id} is outside the vocabulary of {n_vocab} tokens")]
    BadTokenId { id: u32, n_vocab: usize },
}

/// Chat-template failures: compiling, rendering, or a `raise_exception` from the template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template source does not compile.
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// Rendering failed; includes the message of a `raise_exception(...)` call.
    #[error("chat template failed: {0}")]
    Render(String),
}
