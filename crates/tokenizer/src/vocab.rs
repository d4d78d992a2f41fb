//! Reading the vocabulary from GGUF metadata: token texts and types, the byte-level
//! rendering of each token, the special ids and the end-of-generation set.
//!
//! Special ids follow llama.cpp's rules (facts from its vocabulary loader): ids come from
//! `tokenizer.ggml.*_token_id` when present and inside the vocabulary; EOT, EOM and the FIM
//! pad/repo/separator tokens are otherwise found by their well-known texts. The EOG set is
//! those FIM tokens, every token whose text is one of [`EOG_TEXTS`], and the EOS, EOT and EOM
//! ids. A token found by text is treated as CONTROL whatever its stored type.
//!
//! The harmony vocabulary of gpt-oss (o200k_harmony) follows llama.cpp's rules for it: with
//! `<|return|>` and `<|call|>` ending generation, `<|end|>` (which closes a message that
//! another follows, such as the reasoning before the answer) does not, and it is rendered
//! as text (USER_DEFINED), as the message markers `<|channel|>`, `<|message|>`,
//! `<|start|>` and `<|constrain|>` are in every vocabulary, so the generated text carries
//! the message structure.

use crate::bytes::char_to_byte;
use crate::error::TokenizerError;
use crate::texts::TextTable;
use minfer_gguf::MetaValue;

/// The whitespace marker SentencePiece writes in place of a space.
pub(crate) const SPACE_MARK: char = '\u{2581}';

/// The byte a `<0xNN>` token text stands for.
pub(crate) fn byte_token_value(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// A metadata lookup: full key -> value.
pub type Meta<'a> = dyn Fn(&str) -> Option<&'a MetaValue> + 'a;

/// GGUF token types (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TokenType {
    /// 0, or any value outside the table.
    Undefined = 0,
    /// 1: an ordinary byte-level BPE token.
    Normal = 1,
    /// 2: the unknown token.
    Unknown = 2,
    /// 3: a control token such as `<|im_start|>`; matched in text only with parse_special.
    Control = 3,
    /// 4: a user-defined token; always matched in text, rendered verbatim.
    UserDefined = 4,
    /// 5: an unused slot (renders as nothing).
    Unused = 5,
    /// 6: a byte token `<0xNN>` (SentencePiece vocabularies; renders as that byte).
    Byte = 6,
}

impl TokenType {
    fn from_i64(v: i64) -> Self {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    /// Whether the token is hidden when decoding without `special`.
    pub fn is_special(self) -> bool {
        matches!(self, TokenType::Control | TokenType::Unknown)
    }
}

/// Texts that mark a token as end-of-generation wherever it sits in the vocabulary.
pub const EOG_TEXTS: [&str; 9] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|return|>",
    "<|call|>",
];

/// The harmony message markers, rendered as text (see the module documentation).
const HARMONY_MARKERS: [&str; 4] = ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// Candidate texts for the EOT token when the metadata names none, in preference order.
const EOT_TEXTS: [&str; 7] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "<｜end▁of▁sentence｜>",
];
const EOM_TEXTS: [&str; 1] = ["<|eom_id|>"];
const FIM_PAD_TEXTS: [&str; 3] = ["<|fim_pad|>", "<fim-pad>", "<PAD>"];
const FIM_REP_TEXTS: [&str; 4] = ["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"];
const FIM_SEP_TEXTS: [&str; 1] = ["<|file_sep|>"];

/// How a vocabulary's NORMAL and BYTE token texts turn into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rendering {
    /// GPT-2's byte-to-symbol alphabet (`tokenizer.ggml.model = "gpt2"`).
    ByteLevel,
    /// SentencePiece: `▁` is a space and `<0xNN>` byte tokens are their byte (`"llama"`).
    SentencePiece,
}

/// The loaded vocabulary.
pub struct Vocab {
    /// Token texts as stored (byte-level alphabet for normal tokens), both ways.
    pub texts: TextTable,
    /// Token types, after forcing text-detected special tokens to CONTROL.
    pub types: Vec<TokenType>,
    /// Rendered bytes of every token, concatenated; `offsets[i]..offsets[i + 1]` is token i.
    pub piece_bytes: Vec<u8>,
    /// Piece boundaries into `piece_bytes` (`n_vocab + 1` entries).
    pub offsets: Vec<u32>,
    /// Beginning-of-sequence id.
    pub bos: Option<u32>,
    /// End-of-sequence id.
    pub eos: Option<u32>,
    /// End-of-turn id.
    pub eot: Option<u32>,
    /// End-of-message id.
    pub eom: Option<u32>,
    /// Padding id.
    pub pad: Option<u32>,
    /// End-of-generation ids, sorted, without duplicates.
    pub eog: Vec<u32>,
    /// Ids matched in raw text (control, user-defined, unknown), longest text first.
    pub specials: Vec<u32>,
}

fn str_array<'a>(get: &Meta<'a>, key: &'static str) -> Result<Vec<&'a str>, TokenizerError> {
    let v = get(key).ok_or(TokenizerError::MissingKey { key })?;
    let arr = v.as_array().ok_or(TokenizerError::WrongType {
        key,
        expected: "an array of strings",
    })?;
    arr.iter()
        .map(|x| {
            x.as_str().ok_or(TokenizerError::WrongType {
                key,
                expected: "an array of strings",
            })
        })
        .collect()
}

/// An optional id key; absent or outside the vocabulary reads as `None` (as llama.cpp does).
pub(crate) fn opt_id<'a>(
    get: &Meta<'a>,
    key: &'static str,
    n_vocab: usize,
) -> Result<Option<u32>, TokenizerError> {
    match get(key) {
        None => Ok(None),
        Some(v) => {
            let id = v.as_u64().ok_or(TokenizerError::WrongType {
                key,
                expected: "an unsigned integer",
            })?;
            Ok(if id < n_vocab as u64 {
                Some(id as u32)
            } else {
                None
            })
        }
    }
}

impl Vocab {
    /// Reads tokens, types and special ids from metadata; `rendering` says how token
    /// texts become bytes.
    pub fn load<'a>(get: &Meta<'a>, rendering: Rendering) -> Result<Self, TokenizerError> {
        let raw = str_array(get, "tokenizer.ggml.tokens")?;
        let n = raw.len();
        if n >= u32::MAX as usize {
            return Err(TokenizerError::VocabTooLarge(n));
        }
        let mut types = match get("tokenizer.ggml.token_type") {
            None => vec![TokenType::Normal; n],
            Some(v) => {
                let key = "tokenizer.ggml.token_type";
                let arr = v.as_array().ok_or(TokenizerError::WrongType {
                    key,
                    expected: "an array of integers",
                })?;
                if arr.len() != n {
                    return Err(TokenizerError::TokenTypeCount {
                        tokens: n,
                        types: arr.len(),
                    });
                }
                arr.iter()
                    .map(|x| {
                        x.as_i64()
                            .map(TokenType::from_i64)
                            .ok_or(TokenizerError::WrongType {
                                key,
                                expected: "an array of integers",
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
        };

        // An empty text could never be matched or merged; llama.cpp names it instead.
        let empty_names: Vec<String> = raw
            .iter()
            .enumerate()
            .filter(|(_, t)| t.is_empty())
            .map(|(i, _)| format!("[EMPTY_{i}]"))
            .collect();
        let mut empty = empty_names.iter();
        let texts = TextTable::new(raw.iter().map(|t| {
            if t.is_empty() {
                empty.next().map_or("", String::as_str)
            } else {
                *t
            }
        }))
        .ok_or(TokenizerError::VocabTooLarge(n))?;

        let find = |cands: &[&str]| cands.iter().find_map(|t| texts.id(t));
        let bos = opt_id(get, "tokenizer.ggml.bos_token_id", n)?;
        let eos = opt_id(get, "tokenizer.ggml.eos_token_id", n)?;
        let pad = opt_id(get, "tokenizer.ggml.padding_token_id", n)?;
        let mut forced = Vec::new();
        let mut by_meta_or_text =
            |key: &'static str, cands: &[&str]| -> Result<Option<u32>, TokenizerError> {
                if let Some(id) = opt_id(get, key, n)? {
                    return Ok(Some(id));
                }
                let id = find(cands);
                forced.extend(id);
                Ok(id)
            };
        let eot = by_meta_or_text("tokenizer.ggml.eot_token_id", &EOT_TEXTS)?;
        let eom = by_meta_or_text("tokenizer.ggml.eom_token_id", &EOM_TEXTS)?;
        let fim_pad = by_meta_or_text("tokenizer.ggml.fim_pad_token_id", &FIM_PAD_TEXTS)?;
        let fim_rep = by_meta_or_text("tokenizer.ggml.fim_rep_token_id", &FIM_REP_TEXTS)?;
        let fim_sep = by_meta_or_text("tokenizer.ggml.fim_sep_token_id", &FIM_SEP_TEXTS)?;

        let mut eog: Vec<u32> = [fim_pad, fim_rep, fim_sep, eos, eot, eom]
            .into_iter()
            .flatten()
            .collect();
        for t in EOG_TEXTS {
            if let Some(id) = texts.id(t) {
                eog.push(id);
                forced.push(id);
            }
        }
        eog.sort_unstable();
        eog.dedup();
        for id in forced {
            types[id as usize] = TokenType::Control;
        }
        // Harmony: `<|end|>` closes one message of several, not the turn.
        let harmony = ["<|return|>", "<|call|>"]
            .iter()
            .all(|t| texts.id(t).is_some_and(|id| eog.contains(&id)));
        if let Some(end) = texts.id("<|end|>").filter(|_| harmony) {
            eog.retain(|&id| id != end);
            types[end as usize] = TokenType::UserDefined;
        }
        // As llama.cpp, whatever the vocabulary: these always render.
        for t in HARMONY_MARKERS {
            if let Some(id) = texts.id(t) {
                types[id as usize] = TokenType::UserDefined;
            }
        }

        let mut piece_bytes = Vec::with_capacity(n * 7);
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0u32);
        for (i, ty) in types.iter().enumerate() {
            let text = texts.text(i as u32).unwrap_or_default();
            match (ty, rendering) {
                (TokenType::Normal | TokenType::UserDefined, Rendering::SentencePiece) => {
                    // llama.cpp unescapes the whitespace marker of both kinds.
                    for c in text.chars() {
                        match c {
                            SPACE_MARK => piece_bytes.push(b' '),
                            c => {
                                piece_bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes())
                            }
                        }
                    }
                }
                (TokenType::Byte, Rendering::SentencePiece) => {
                    piece_bytes.extend(byte_token_value(text));
                }
                (TokenType::Normal, Rendering::ByteLevel) => {
                    let start = piece_bytes.len();
                    for c in text.chars() {
                        match char_to_byte(c) {
                            Some(b) => piece_bytes.push(b),
                            None => {
                                // Not in the byte alphabet: show it as written, not lost.
                                piece_bytes.truncate(start);
                                piece_bytes.extend_from_slice(text.as_bytes());
                                break;
                            }
                        }
                    }
                }
                (TokenType::UserDefined | TokenType::Control | TokenType::Unknown, _) => {
                    piece_bytes.extend_from_slice(text.as_bytes())
                }
                (TokenType::Unused | TokenType::Byte | TokenType::Undefined, _) => {}
            }
            let end =
                u32::try_from(piece_bytes.len()).map_err(|_| TokenizerError::VocabTooLarge(n))?;
            offsets.push(end);
        }

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                matches!(
                    types[i as usize],
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                )
            })
            .collect();
        let len = |id: u32| texts.text(id).map_or(0, str::len);
        specials.sort_by(|&a, &b| len(b).cmp(&len(a)).then(a.cmp(&b)));

        Ok(Vocab {
            texts,
            types,
            piece_bytes,
            offsets,
            bos,
            eos,
            eot,
            eom,
            pad,
            eog,
            specials,
        })
    }

    /// Rendered bytes of a token (empty for unused slots).
    #[inline]
    pub fn piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        &self.piece_bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_token_texts_parse_only_in_their_exact_form() {
        assert_eq!(byte_token_value("<0x0A>"), Some(10));
        assert_eq!(byte_token_value("<0xff>"), Some(255));
        for bad in ["<0x1>", "<0x100>", "0x0A", "<0xZZ>", "<0x0A"] {
            assert_eq!(byte_token_value(bad), None, "{bad}");
        }
    }
}
