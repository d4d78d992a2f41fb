//! A (query, document) pair joined for a cross-encoder, as llama.cpp lays one out: the
//! two texts tokenized without special tokens, between the vocabulary's own markers.

use crate::Tokenizer;

/// Where a pair ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairEnd {
    /// As llama-server's rerank: the document ends the sequence, followed only by EOS
    /// where the vocabulary adds one (a WordPiece pair is `[CLS] q [SEP] d`).
    Server,
    /// As llama-embedding's `query<TAB>document` line, tokenized with special tokens:
    /// also closed by the separator a WordPiece vocabulary appends (`[CLS] q [SEP] d [SEP]`).
    Embedding,
}

impl Tokenizer {
    /// The ids of `first` and `second` joined as one sequence: BOS where the model adds
    /// it, `first`, EOS where it adds one (the separator standing in for a missing EOS),
    /// the separator of a WordPiece vocabulary, `second`, EOS where it adds one, and with
    /// [`PairEnd::Embedding`] the closing separator of a WordPiece vocabulary. Special
    /// token texts inside either text stay text.
    pub fn encode_pair(&self, first: &str, second: &str, end: PairEnd) -> Vec<u32> {
        let eos = self.add_eos().then(|| self.eos().or(self.sep())).flatten();
        let mut out = Vec::new();
        if self.add_bos() {
            out.extend(self.bos());
        }
        out.extend(self.encode(first, false, false));
        out.extend(eos);
        out.extend(self.sep());
        out.extend(self.encode(second, false, false));
        out.extend(eos);
        if end == PairEnd::Embedding && eos.is_none() {
            out.extend(self.sep());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::{build, tiny_metadata};
    use minfer_gguf::{MetaType, MetaValue};

    #[test]
    fn a_wordpiece_pair_is_cls_query_sep_document_and_the_embedding_layout_closes_it() {
        let mut m = crate::hash::FastMap::default();
        let tokens = [
            "[PAD]",
            "[UNK]",
            "[CLS]",
            "[SEP]",
            "[MASK]",
            "\u{2581}a",
            "\u{2581}b",
        ];
        m.insert(
            "tokenizer.ggml.model".into(),
            MetaValue::String("bert".into()),
        );
        m.insert(
            "tokenizer.ggml.tokens".into(),
            MetaValue::Array(
                MetaType::String,
                tokens
                    .iter()
                    .map(|t| MetaValue::String(t.to_string()))
                    .collect(),
            ),
        );
        for (key, id) in [("bos", 2), ("unknown", 1), ("seperator", 3), ("padding", 0)] {
            m.insert(format!("tokenizer.ggml.{key}_token_id"), MetaValue::U32(id));
        }
        let tok = build(&m).unwrap();
        assert_eq!(tok.encode_pair("a", "b", PairEnd::Server), [2, 5, 3, 6]);
        assert_eq!(
            tok.encode_pair("a", "b", PairEnd::Embedding),
            [2, 5, 3, 6, 3]
        );
        // Special-token text in a client's text stays text.
        assert!(!tok.encode_pair("[SEP]", "b", PairEnd::Server)[1..].starts_with(&[3, 3]));
    }

    #[test]
    fn a_vocabulary_that_adds_eos_ends_both_texts_with_it() {
        let mut m = tiny_metadata();
        m.insert("tokenizer.ggml.add_eos_token".into(), MetaValue::Bool(true));
        let tok = build(&m).unwrap();
        let a = u32::from(b'a');
        for end in [PairEnd::Server, PairEnd::Embedding] {
            assert_eq!(
                tok.encode_pair("a", "b", end),
                [a, 258, u32::from(b'b'), 258]
            );
        }
    }
}
