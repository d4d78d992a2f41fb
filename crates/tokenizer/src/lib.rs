//! Tokenizer and chat templates from GGUF metadata.
