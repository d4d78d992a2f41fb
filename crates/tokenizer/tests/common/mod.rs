//! Shared by the integration tests: the default model's tokenizer, loaded once.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use minfer_gguf::GgufFile;
use minfer_tokenizer::Tokenizer;
use std::sync::OnceLock;

/// The tokenizer of the default catalog model; fails loudly when the model is absent.
pub fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = minfer_hub::default_model_path();
        assert!(
            path.exists(),
            "default model not found at {}; run `minfer pull` first",
            path.display()
        );
        let file = GgufFile::open(&path).expect("default model opens");
        Tokenizer::from_gguf(&file).expect("default model's tokenizer loads")
    })
}
