//! SentencePiece-style vocabularies (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral):
//! score-driven merges over UTF-8 characters, spaces written as `▁`, byte fallback.
//!
//! The algorithm is llama.cpp's (which follows SentencePiece's BPE model): the text becomes
//! one symbol per character; every adjacent pair whose concatenation is a token is a
//! candidate, and the candidate whose token has the highest score is merged first (ties go
//! to the leftmost pair), creating new candidates with its neighbours, until none is left.
//! A final symbol that is not a token (a character the vocabulary lacks) is written as its
//! UTF-8 bytes through the `<0xNN>` byte tokens, or as the unknown token where the
//! vocabulary has no byte token for one of them.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::error::TokenizerError;
use crate::texts::TextTable;
use crate::vocab::{byte_token_value, Meta, TokenType};

/// Scores and byte fallback of a SentencePiece vocabulary.
pub(crate) struct Spm {
    scores: Vec<f32>,
    /// The token each byte falls back to: its `<0xNN>` token, else the unknown token.
    byte_ids: [u32; 256],
    /// Prefix every raw-text fragment with a space (`tokenizer.ggml.add_space_prefix`).
    pub add_space_prefix: bool,
}

impl Spm {
    /// Reads the scores and resolves the byte fallback of the vocabulary `texts`.
    pub fn load<'a>(
        get: &Meta<'a>,
        texts: &TextTable,
        types: &[TokenType],
        unk: Option<u32>,
        add_space_prefix: bool,
    ) -> Result<Self, TokenizerError> {
        let n = texts.len();
        let key = "tokenizer.ggml.scores";
        let scores = match get(key) {
            // llama.cpp reads absent scores as 0: merges then go left to right.
            None => vec![0.0; n],
            Some(v) => {
                let arr = v.as_array().ok_or(TokenizerError::WrongType {
                    key,
                    expected: "an array of floats",
                })?;
                if arr.len() != n {
                    return Err(TokenizerError::ScoreCount {
                        tokens: n,
                        scores: arr.len(),
                    });
                }
                arr.iter()
                    .map(|x| {
                        x.as_f64().map(|f| f as f32).filter(|f| !f.is_nan()).ok_or(
                            TokenizerError::WrongType {
                                key,
                                expected: "an array of floats",
                            },
                        )
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        let mut byte_ids = [u32::MAX; 256];
        for id in 0..n as u32 {
            if types.get(id as usize) != Some(&TokenType::Byte) {
                continue;
            }
            if let Some(b) = texts.text(id).and_then(byte_token_value) {
                byte_ids[b as usize] = id;
            }
        }
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            if *slot == u32::MAX {
                // llama.cpp then looks for the byte as a one-character token, and the
                // unknown token stands in for what neither covers.
                let single = std::str::from_utf8(&[b as u8])
                    .ok()
                    .and_then(|s| texts.id(s));
                *slot = single
                    .or(unk)
                    .ok_or(TokenizerError::MissingByteToken(b as u8))?;
            }
        }
        Ok(Spm {
            scores,
            byte_ids,
            add_space_prefix,
        })
    }

    /// Appends the ids of `text` (spaces already written as `▁`) to `out`.
    pub fn encode(
        &self,
        texts: &TextTable,
        text: &str,
        scratch: &mut SpmScratch,
        out: &mut Vec<u32>,
    ) {
        if text.is_empty() {
            return;
        }
        let syms = &mut scratch.syms;
        syms.clear();
        for (i, (start, c)) in text.char_indices().enumerate() {
            syms.push(Sym {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                syms[i - 1].next = Some(i);
            }
        }
        let heap = &mut scratch.heap;
        heap.clear();
        let candidate = |syms: &[Sym], left: usize, right: usize| -> Option<Bigram> {
            let (l, r) = (&syms[left], &syms[right]);
            let piece = &text[l.start..r.start + r.len];
            let id = texts.id(piece)?;
            Some(Bigram {
                score: self.scores[id as usize],
                left,
                right,
                size: piece.len(),
            })
        };
        for i in 1..syms.len() {
            heap.extend(candidate(syms, i - 1, i));
        }
        while let Some(bg) = heap.pop() {
            let (l, r) = (syms[bg.left], syms[bg.right]);
            // A pair one of whose symbols has merged since is stale.
            if l.len == 0 || r.len == 0 || l.len + r.len != bg.size || l.next != Some(bg.right) {
                continue;
            }
            syms[bg.left].len += r.len;
            syms[bg.right].len = 0;
            syms[bg.left].next = r.next;
            if let Some(n) = r.next {
                syms[n].prev = Some(bg.left);
            }
            if let Some(p) = l.prev {
                heap.extend(candidate(syms, p, bg.left));
            }
            if let Some(n) = r.next {
                heap.extend(candidate(syms, bg.left, n));
            }
        }
        let mut i = Some(0);
        while let Some(k) = i {
            let s = syms[k];
            let piece = &text[s.start..s.start + s.len];
            match texts.id(piece) {
                Some(id) => out.push(id),
                None => out.extend(piece.bytes().map(|b| self.byte_ids[b as usize])),
            }
            i = s.next;
        }
    }
}

/// Reusable buffers of [`Spm::encode`].
#[derive(Default)]
pub(crate) struct SpmScratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Bigram>,
}

#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    /// Bytes; 0 once merged into its left neighbour.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Bigram {
    /// Highest score first; among equal scores the leftmost pair.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(tokens: &[&str]) -> TextTable {
        TextTable::new(tokens.iter().copied()).unwrap()
    }

    #[test]
    fn highest_score_merges_first_and_unknown_characters_fall_back_to_bytes() {
        let tokens = ["<unk>", "▁", "a", "b", "ab", "▁a", "<0xC3>", "<0xA9>"];
        let texts = table(&tokens);
        let mut types = vec![TokenType::Normal; tokens.len()];
        types[0] = TokenType::Unknown;
        types[6] = TokenType::Byte;
        types[7] = TokenType::Byte;
        let spm = |scores: [f32; 8]| Spm {
            scores: scores.to_vec(),
            byte_ids: {
                let mut b = [0u32; 256];
                b[0xC3] = 6;
                b[0xA9] = 7;
                b
            },
            add_space_prefix: true,
        };
        let mut scratch = SpmScratch::default();
        let run = |s: &Spm, text: &str, scratch: &mut SpmScratch| {
            let mut out = Vec::new();
            s.encode(&texts, text, scratch, &mut out);
            out
        };
        // "▁ab": "▁a" (score -1) beats "ab" (-2), then "b" is left alone.
        let first = spm([0.0, -5.0, -5.0, -5.0, -2.0, -1.0, 0.0, 0.0]);
        assert_eq!(run(&first, "▁ab", &mut scratch), vec![5, 3]);
        // The other way round: "ab" first, then "▁" stays alone.
        let second = spm([0.0, -5.0, -5.0, -5.0, -1.0, -2.0, 0.0, 0.0]);
        assert_eq!(run(&second, "▁ab", &mut scratch), vec![1, 4]);
        // "é" is not a token: its two UTF-8 bytes; "x" has no byte token: unknown (0).
        assert_eq!(run(&first, "é", &mut scratch), vec![6, 7]);
        assert_eq!(run(&first, "ax", &mut scratch), vec![2, 0]);
    }
}
