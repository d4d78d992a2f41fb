//! The tokenizer: special-token partition, pre-tokenizer split, byte-level BPE, and decoding.

use crate::bpe::{encode_word, Merges, Scratch, NO_BYTE_TOKEN};
use crate::bytes::BYTE_TO_CHAR;
use crate::error::TokenizerError;
use crate::pretok::{PreKind, PreTokenizer};
use crate::spm::{Spm, SpmScratch};
use crate::vocab::{opt_id, Meta, Rendering, TokenType, Vocab, SPACE_MARK};
use crate::wpm::Wpm;
use minfer_gguf::GgufFile;
use std::ops::Range;

/// A tokenizer built from a GGUF vocabulary: byte-level BPE, SentencePiece or WordPiece.
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    pre_name: String,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
}

/// The encoding algorithm `tokenizer.ggml.model` names.
enum Model {
    /// `gpt2`: pre-tokenizer split, then rank-ordered merges over byte symbols.
    Bpe {
        merges: Merges,
        byte_ids: [u32; 256],
        pre: PreTokenizer,
        /// Whole words found in the vocabulary skip merging (Llama 3 family).
        ignore_merges: bool,
    },
    /// `llama`: score-ordered merges over characters with byte fallback.
    Spm(Spm),
    /// `bert`: normalized words cut greedily into the longest pieces (WordPiece).
    Wpm(Wpm),
}

/// One piece of the input after special-token partitioning.
#[derive(Clone, Copy)]
enum Frag {
    Text(usize, usize),
    Token(u32),
}

impl Tokenizer {
    /// Builds the tokenizer of an opened GGUF file (a vocabulary-only file is enough).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        Self::from_metadata(&|key| file.get(key))
    }

    /// Builds the tokenizer from any metadata lookup (`key` -> value).
    pub fn from_metadata<'a>(get: &Meta<'a>) -> Result<Self, TokenizerError> {
        let model = meta_str(get, "tokenizer.ggml.model")?.ok_or(TokenizerError::MissingKey {
            key: "tokenizer.ggml.model",
        })?;
        match model {
            "gpt2" => Self::bpe(get),
            "llama" => Self::spm(get),
            "bert" => Self::wpm(get),
            other => Err(TokenizerError::UnsupportedModel(other.to_string())),
        }
    }

    fn bpe<'a>(get: &Meta<'a>) -> Result<Self, TokenizerError> {
        // llama.cpp refuses nothing here but falls back to a generic split with a loud
        // warning; minfer prefers a clear refusal to silently different token ids.
        let pre_name = meta_str(get, "tokenizer.ggml.pre")?.ok_or(TokenizerError::MissingKey {
            key: "tokenizer.ggml.pre",
        })?;
        let kind = PreKind::from_name(pre_name)?;
        let llama3 = matches!(pre_name, "llama-bpe" | "llama3" | "llama-v3" | "falcon3");

        let vocab = Vocab::load(get, Rendering::ByteLevel)?;

        let mut byte_ids = [NO_BYTE_TOKEN; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            let mut buf = [0u8; 4];
            let c = BYTE_TO_CHAR[b].encode_utf8(&mut buf);
            if let Some(id) = vocab.texts.id(c) {
                *slot = id;
            }
        }
        // Real vocabularies may lack a few control bytes or bytes that never occur in
        // UTF-8 (SmolLM2 lacks 0x04, 0xC0, 0xFF, ...); those are left out when encoded, as
        // llama.cpp does. Printable ASCII and the common whitespace must all be there, or
        // the vocabulary is not byte-level.
        let essential = |b: u8| b.is_ascii_graphic() || matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        if let Some(b) =
            (0..=255u8).find(|&b| essential(b) && byte_ids[b as usize] == NO_BYTE_TOKEN)
        {
            return Err(TokenizerError::MissingByteToken(b));
        }

        let merges = load_merges(get, &vocab)?;
        let model = Model::Bpe {
            merges,
            byte_ids,
            pre: PreTokenizer::new(kind),
            ignore_merges: llama3,
        };
        Self::finish(get, vocab, model, pre_name.to_string(), llama3)
    }

    /// SentencePiece vocabularies, with llama.cpp's defaults for what the file leaves out:
    /// BOS added, a space prefixed, unknown/BOS/EOS ids 0/1/2.
    fn spm<'a>(get: &Meta<'a>) -> Result<Self, TokenizerError> {
        let mut vocab = Vocab::load(get, Rendering::SentencePiece)?;
        let n = vocab.texts.len();
        let default = |key: &str, id: u32| (get(key).is_none() && (id as usize) < n).then_some(id);
        vocab.bos = vocab.bos.or(default("tokenizer.ggml.bos_token_id", 1));
        vocab.eos = vocab.eos.or(default("tokenizer.ggml.eos_token_id", 2));
        if let Some(eos) = vocab.eos {
            if let Err(at) = vocab.eog.binary_search(&eos) {
                vocab.eog.insert(at, eos);
            }
        }
        let unk = opt_id(get, "tokenizer.ggml.unknown_token_id", n)?
            .or(default("tokenizer.ggml.unknown_token_id", 0));
        let add_space_prefix = meta_bool(get, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
        let spm = Spm::load(get, &vocab.texts, &vocab.types, unk, add_space_prefix)?;
        let pre_name = meta_str(get, "tokenizer.ggml.pre")?.unwrap_or("default");
        Self::finish(get, vocab, Model::Spm(spm), pre_name.to_string(), true)
    }

    /// WordPiece vocabularies, with llama.cpp's defaults for what the file leaves out:
    /// `[CLS]`/`[UNK]`/`[SEP]`/`[PAD]` ids 101/100/102/0, lowercasing on and accent
    /// stripping as lowercasing. `[CLS]` and `[SEP]` enclose every encoding with special
    /// tokens, whatever `add_bos_token` says (llama.cpp adds both for this model).
    fn wpm<'a>(get: &Meta<'a>) -> Result<Self, TokenizerError> {
        let mut vocab = Vocab::load(get, Rendering::SentencePiece)?;
        let n = vocab.texts.len();
        let id = |key: &'static str, default: u32| -> Result<Option<u32>, TokenizerError> {
            Ok(opt_id(get, key, n)?
                .or((get(key).is_none() && (default as usize) < n).then_some(default)))
        };
        vocab.bos = vocab.bos.or(id("tokenizer.ggml.bos_token_id", 101)?);
        vocab.pad = vocab.pad.or(id("tokenizer.ggml.padding_token_id", 0)?);
        let unk = id("tokenizer.ggml.unknown_token_id", 100)?
            .ok_or(TokenizerError::MissingSpecial { which: "unknown" })?;
        // llama.cpp's key is spelled so.
        let sep = id("tokenizer.ggml.seperator_token_id", 102)?
            .ok_or(TokenizerError::MissingSpecial { which: "separator" })?;
        if vocab.bos.is_none() {
            return Err(TokenizerError::MissingSpecial { which: "bos" });
        }
        let lowercase = meta_bool(get, "tokenizer.ggml.normalizer.lowercase")?.unwrap_or(true);
        let strip_accents =
            meta_bool(get, "tokenizer.ggml.normalizer.strip_accents")?.unwrap_or(lowercase);
        let wpm = Wpm::new(&vocab.texts, lowercase, strip_accents, unk, sep);
        let pre_name = meta_str(get, "tokenizer.ggml.pre")?.unwrap_or("default");
        let mut t = Self::finish(get, vocab, Model::Wpm(wpm), pre_name.to_string(), true)?;
        t.add_bos = true;
        Ok(t)
    }

    /// BOS/EOS flags and the chat template, shared by every model.
    fn finish<'a>(
        get: &Meta<'a>,
        vocab: Vocab,
        model: Model,
        pre_name: String,
        default_bos: bool,
    ) -> Result<Self, TokenizerError> {
        let add_bos = meta_bool(get, "tokenizer.ggml.add_bos_token")?.unwrap_or(default_bos);
        let add_eos = meta_bool(get, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        if add_bos && vocab.bos.is_none() {
            return Err(TokenizerError::MissingSpecial { which: "bos" });
        }
        if add_eos && vocab.eos.is_none() {
            return Err(TokenizerError::MissingSpecial { which: "eos" });
        }
        let chat_template = meta_str(get, "tokenizer.chat_template")?.map(str::to_string);

        Ok(Tokenizer {
            vocab,
            model,
            pre_name,
            add_bos,
            add_eos,
            chat_template,
        })
    }

    /// The SentencePiece model, when this is one.
    fn spm_model(&self) -> Option<&Spm> {
        match &self.model {
            Model::Spm(s) => Some(s),
            Model::Bpe { .. } | Model::Wpm(_) => None,
        }
    }

    /// Encodes `text`. `add_special` adds BOS/EOS where the model asks for them
    /// (`tokenizer.ggml.add_bos_token` / `add_eos_token`). `parse_special` matches CONTROL
    /// token texts such as `<|im_start|>` as single tokens; USER_DEFINED tokens are matched
    /// always, and UNUSED ones never (llama.cpp's rules).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_inner(text, add_special, parse_special, &[])
    }

    /// Encodes a prompt whose `literal` byte ranges hold untrusted text (chat message
    /// contents): CONTROL token texts are matched everywhere else, as with
    /// `parse_special = true`, but never inside or across those ranges, where the text is
    /// tokenized as `parse_special = false` would. Without control-token text in the
    /// ranges, the ids equal `encode(text, add_special, true)`. Ranges must be sorted,
    /// disjoint and inside `text`.
    pub fn encode_with_literals(
        &self,
        text: &str,
        add_special: bool,
        literal: &[Range<usize>],
    ) -> Vec<u32> {
        self.encode_inner(text, add_special, true, literal)
    }

    /// Whether `text` holds the text of a CONTROL token, which `parse_special = true`
    /// would turn into that token.
    pub fn contains_control_text(&self, text: &str) -> bool {
        self.vocab.specials.iter().any(|&id| {
            self.vocab.types[id as usize].is_special()
                && self
                    .vocab
                    .texts
                    .text(id)
                    .is_some_and(|t| !t.is_empty() && text.contains(t))
        })
    }

    fn encode_inner(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        literal: &[Range<usize>],
    ) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.vocab.bos);
        }
        let frags = self.partition(text, parse_special, literal);
        match &self.model {
            Model::Bpe {
                merges,
                byte_ids,
                pre,
                ignore_merges,
            } => {
                let mut words = Vec::new();
                let mut scratch = Scratch::default();
                let mut lookup = String::new();
                for f in frags {
                    match f {
                        Frag::Token(id) => out.push(id),
                        Frag::Text(s, e) => {
                            let part = &text[s..e];
                            pre.split(part, &mut words);
                            for &(ws, we) in &words {
                                let word = &part.as_bytes()[ws..we];
                                if *ignore_merges && word.len() > 1 {
                                    lookup.clear();
                                    lookup.extend(word.iter().map(|&b| BYTE_TO_CHAR[b as usize]));
                                    if let Some(id) = self.vocab.texts.id(&lookup) {
                                        out.push(id);
                                        continue;
                                    }
                                }
                                encode_word(merges, byte_ids, word, &mut scratch, &mut out);
                            }
                        }
                    }
                }
            }
            Model::Wpm(wpm) => {
                for f in frags {
                    match f {
                        Frag::Token(id) => out.push(id),
                        Frag::Text(s, e) => wpm.encode(&self.vocab.texts, &text[s..e], &mut out),
                    }
                }
            }
            Model::Spm(spm) => {
                let mut scratch = SpmScratch::default();
                let mut escaped = String::new();
                // llama.cpp prefixes the space after the start and after every special
                // token, i.e. before each raw-text fragment.
                for f in frags {
                    match f {
                        Frag::Token(id) => out.push(id),
                        Frag::Text(s, e) => {
                            escaped.clear();
                            if spm.add_space_prefix {
                                escaped.push(SPACE_MARK);
                            }
                            escaped.extend(text[s..e].chars().map(|c| {
                                if c == ' ' {
                                    SPACE_MARK
                                } else {
                                    c
                                }
                            }));
                            spm.encode(&self.vocab.texts, &escaped, &mut scratch, &mut out);
                        }
                    }
                }
            }
        }
        if let (true, Model::Wpm(wpm)) = (add_special, &self.model) {
            out.push(wpm.sep);
        } else if add_special && self.add_eos {
            out.extend(self.vocab.eos);
        }
        out
    }

    /// Splits out special-token texts: each candidate in turn, longest text first, cuts
    /// every remaining raw-text fragment at its occurrences. A CONTROL token occurrence
    /// that overlaps a `literal` range stays text.
    fn partition(&self, text: &str, parse_special: bool, literal: &[Range<usize>]) -> Vec<Frag> {
        let mut frags = vec![Frag::Text(0, text.len())];
        if text.is_empty() {
            frags.clear();
            return frags;
        }
        let mut next = Vec::new();
        for &id in &self.vocab.specials {
            let control = self.vocab.types[id as usize].is_special();
            if !parse_special && control {
                continue;
            }
            let tok = self.vocab.texts.text(id).unwrap_or_default();
            if tok.is_empty() || !text.contains(tok) {
                continue;
            }
            next.clear();
            for &f in &frags {
                let Frag::Text(mut s, e) = f else {
                    next.push(f);
                    continue;
                };
                // `s` starts the pending text; `from` is where the search goes on.
                let mut from = s;
                while let Some(p) = text[from..e].find(tok) {
                    let (a, b) = (from + p, from + p + tok.len());
                    if control && overlaps(literal, a, b) {
                        // Text from a literal range: look again one character further.
                        from = a + text[a..].chars().next().map_or(1, char::len_utf8);
                        continue;
                    }
                    if a > s {
                        next.push(Frag::Text(s, a));
                    }
                    next.push(Frag::Token(id));
                    s = b;
                    from = b;
                }
                if s < e {
                    next.push(Frag::Text(s, e));
                }
            }
            std::mem::swap(&mut frags, &mut next);
        }
        frags
    }

    /// Decodes ids to bytes; CONTROL/UNKNOWN tokens are rendered only when `special`.
    /// The bytes of `encode(s, false, false)` decode back to exactly `s`: a SentencePiece
    /// vocabulary that prefixes a space drops one leading space of the first token, as
    /// llama.cpp's detokenizer does ([`Tokenizer::token_bytes`] keeps it, for streams).
    pub fn decode_bytes(&self, ids: &[u32], special: bool) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        let strip = self.spm_model().is_some_and(|s| s.add_space_prefix);
        for (i, &id) in ids.iter().enumerate() {
            let piece = self.token_bytes(id, special)?;
            match piece.strip_prefix(b" ") {
                Some(rest) if strip && i == 0 => out.extend_from_slice(rest),
                _ => out.extend_from_slice(piece),
            }
        }
        Ok(out)
    }

    /// Decodes ids to text; byte sequences that are not UTF-8 (a cut-off character)
    /// become U+FFFD.
    pub fn decode(&self, ids: &[u32], special: bool) -> Result<String, TokenizerError> {
        let bytes = self.decode_bytes(ids, special)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// The bytes one token renders to (empty for hidden special tokens and unused slots).
    pub fn token_bytes(&self, id: u32, special: bool) -> Result<&[u8], TokenizerError> {
        let ty = self.token_type(id)?;
        if !special && ty.is_special() {
            return Ok(&[]);
        }
        Ok(self.vocab.piece(id))
    }

    /// Every token's rendered bytes in id order, with whether it is special (CONTROL or
    /// UNKNOWN, hidden from plain decoding): what a grammar engine's token trie is built
    /// from. Byte-level BPE texts come back as the bytes they stand for, not the GPT-2
    /// alphabet; unused slots are empty.
    pub fn token_pieces(&self) -> impl Iterator<Item = (&[u8], bool)> + '_ {
        (0..self.n_vocab() as u32).map(|id| {
            let special = self
                .vocab
                .types
                .get(id as usize)
                .is_some_and(|t| t.is_special());
            (self.vocab.piece(id), special)
        })
    }

    /// The token's text as stored in the vocabulary (byte-level alphabet for normal tokens).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.texts.text(id)
    }

    /// The token's type (after llama.cpp's promotion of known end tokens to CONTROL).
    pub fn token_type(&self, id: u32) -> Result<TokenType, TokenizerError> {
        self.vocab
            .types
            .get(id as usize)
            .copied()
            .ok_or(TokenizerError::BadTokenId {
                id,
                n_vocab: self.n_vocab(),
            })
    }

    /// The id of a vocabulary text, e.g. `"<|im_end|>"`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.texts.id(text)
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.texts.len()
    }

    /// Number of usable merge rules (0 for SentencePiece, which merges by score).
    pub fn n_merges(&self) -> usize {
        match &self.model {
            Model::Bpe { merges, .. } => merges.len(),
            Model::Spm(_) | Model::Wpm(_) => 0,
        }
    }

    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece).
    pub fn model_name(&self) -> &'static str {
        match &self.model {
            Model::Bpe { .. } => "gpt2",
            Model::Spm(_) => "llama",
            Model::Wpm(_) => "bert",
        }
    }

    /// The `tokenizer.ggml.pre` name this tokenizer was built with.
    pub fn pre_tokenizer(&self) -> &str {
        &self.pre_name
    }

    /// Beginning-of-sequence id.
    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }

    /// End-of-sequence id.
    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }

    /// End-of-turn id (from metadata, or found by its text).
    pub fn eot(&self) -> Option<u32> {
        self.vocab.eot
    }

    /// End-of-message id (from metadata, or `<|eom_id|>`).
    pub fn eom(&self) -> Option<u32> {
        self.vocab.eom
    }

    /// Padding id.
    pub fn pad(&self) -> Option<u32> {
        self.vocab.pad
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// The separator id (`[SEP]`) a WordPiece vocabulary closes every encoding with
    /// special tokens with (llama.cpp's `add_sep`); `None` for the other models.
    pub fn sep(&self) -> Option<u32> {
        match &self.model {
            Model::Wpm(wpm) => Some(wpm.sep),
            _ => None,
        }
    }

    /// Whether generation must stop at `id`.
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.binary_search(&id).is_ok()
    }

    /// Every end-of-generation id, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog
    }

    /// `tokenizer.chat_template`, if the model has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Text of a special id for templates (`bos_token`, `eos_token`); empty when absent.
    pub(crate) fn special_text(&self, id: Option<u32>) -> String {
        id.and_then(|i| self.token_text(i))
            .unwrap_or_default()
            .to_string()
    }
}

/// Whether `[a, b)` overlaps any of the sorted, disjoint `ranges` (a binary search, so a
/// prompt of many messages with many control texts stays linear-logarithmic).
fn overlaps(ranges: &[Range<usize>], a: usize, b: usize) -> bool {
    let i = ranges.partition_point(|r| r.end <= a);
    ranges.get(i).is_some_and(|r| r.start < b)
}

fn meta_str<'a>(get: &Meta<'a>, key: &'static str) -> Result<Option<&'a str>, TokenizerError> {
    match get(key) {
        None => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or(TokenizerError::WrongType {
            key,
            expected: "a string",
        }),
    }
}

fn meta_bool<'a>(get: &Meta<'a>, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    match get(key) {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or(TokenizerError::WrongType {
            key,
            expected: "a bool",
        }),
    }
}

/// Reads `tokenizer.ggml.merges` into the id-pair table. A rule whose pieces or result are
/// not tokens can never fire on byte-level symbols, so it is skipped.
fn load_merges<'a>(get: &Meta<'a>, vocab: &Vocab) -> Result<Merges, TokenizerError> {
    let key = "tokenizer.ggml.merges";
    let arr = get(key)
        .ok_or(TokenizerError::MissingKey { key })?
        .as_array()
        .ok_or(TokenizerError::WrongType {
            key,
            expected: "an array of strings",
        })?;
    let mut merges = Merges::with_capacity(arr.len());
    let mut joined = String::new();
    for (rank, v) in arr.iter().enumerate() {
        let text = v.as_str().ok_or(TokenizerError::WrongType {
            key,
            expected: "an array of strings",
        })?;
        // Split at the first space after the first character: a piece may itself be " ".
        let split = text
            .char_indices()
            .skip(1)
            .find(|&(_, c)| c == ' ')
            .map(|(i, _)| i)
            .ok_or_else(|| TokenizerError::BadMerge {
                index: rank,
                text: text.to_string(),
            })?;
        let (left, right) = (&text[..split], &text[split + 1..]);
        joined.clear();
        joined.push_str(left);
        joined.push_str(right);
        let (Some(l), Some(r), Some(m)) = (
            vocab.texts.id(left),
            vocab.texts.id(right),
            vocab.texts.id(&joined),
        ) else {
            continue;
        };
        merges.insert(l, r, rank as u32, m);
    }
    Ok(merges)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::hash::FastMap;
    use minfer_gguf::{MetaType, MetaValue};

    /// Metadata of a tiny vocabulary: the 256 byte tokens, "Ġa" (merged from "Ġ a"),
    /// `<|im_start|>` and `<|im_end|>` (control), `<x>` (user-defined); no chat template.
    pub(crate) fn tiny_metadata() -> FastMap<String, MetaValue> {
        let mut tokens: Vec<String> = BYTE_TO_CHAR.iter().map(|c| c.to_string()).collect();
        let mut types = vec![1i32; 256];
        for (t, ty) in [
            ("Ġa", 1),
            ("<|im_start|>", 3),
            ("<|im_end|>", 3),
            ("<x>", 4),
        ] {
            tokens.push(t.to_string());
            types.push(ty);
        }
        let strings = |v: Vec<String>| {
            MetaValue::Array(
                MetaType::String,
                v.into_iter().map(MetaValue::String).collect(),
            )
        };
        let mut m = FastMap::default();
        m.insert(
            "tokenizer.ggml.model".into(),
            MetaValue::String("gpt2".into()),
        );
        m.insert(
            "tokenizer.ggml.pre".into(),
            MetaValue::String("qwen2".into()),
        );
        m.insert("tokenizer.ggml.tokens".into(), strings(tokens));
        m.insert(
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array(
                MetaType::I32,
                types.into_iter().map(MetaValue::I32).collect(),
            ),
        );
        m.insert("tokenizer.ggml.merges".into(), strings(vec!["Ġ a".into()]));
        m.insert("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(258));
        m
    }

    pub(crate) fn build(m: &FastMap<String, MetaValue>) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_metadata(&|k| m.get(k))
    }

    #[test]
    fn tiny_vocabulary_encodes_and_decodes() {
        let tok = build(&tiny_metadata()).unwrap();
        assert_eq!(tok.n_vocab(), 260);
        assert_eq!(tok.n_merges(), 1);
        assert_eq!(tok.encode("b a", false, false), vec![u32::from(b'b'), 256]);
        assert_eq!(tok.encode("<x>", false, false), vec![259]);
        assert_eq!(tok.encode("<|im_end|>", true, true), vec![258]);
        assert_eq!(tok.encode("<|im_end|>", false, false).len(), 10);
        assert_eq!(tok.eog_ids(), &[258]);
        assert_eq!(tok.eot(), Some(258));
        assert!(tok.chat_template().is_none());
        assert!(tok.encode("", true, true).is_empty());
    }

    /// The harmony vocabulary (gpt-oss): `<|return|>` and `<|call|>` end generation,
    /// `<|end|>` does not, and it and the message markers render as text; a vocabulary
    /// without `<|call|>` keeps `<|end|>` as an end of generation.
    #[test]
    fn harmony_ends_at_return_and_call_and_renders_its_markers() {
        let with = |extra: &[&str]| {
            let mut m = tiny_metadata();
            let Some(MetaValue::Array(_, tokens)) = m.get_mut("tokenizer.ggml.tokens") else {
                panic!("tokens");
            };
            tokens.extend(extra.iter().map(|t| MetaValue::String(t.to_string())));
            let Some(MetaValue::Array(_, types)) = m.get_mut("tokenizer.ggml.token_type") else {
                panic!("types");
            };
            types.extend(extra.iter().map(|_| MetaValue::I32(3)));
            build(&m).unwrap()
        };
        let marks = [
            "<|start|>",
            "<|channel|>",
            "<|message|>",
            "<|end|>",
            "<|return|>",
            "<|call|>",
        ];
        let tok = with(&marks);
        let id = |t: &str| 260 + marks.iter().position(|m| *m == t).unwrap() as u32;
        assert_eq!(tok.eog_ids(), &[258, id("<|return|>"), id("<|call|>")]);
        for m in ["<|start|>", "<|channel|>", "<|message|>", "<|end|>"] {
            assert_eq!(tok.token_bytes(id(m), false).unwrap(), m.as_bytes(), "{m}");
        }
        assert!(tok.token_bytes(id("<|return|>"), false).unwrap().is_empty());
        let tok = with(&["<|end|>", "<|return|>"]);
        assert_eq!(tok.eog_ids(), &[258, 260, 261]);
        assert!(tok.token_bytes(260, false).unwrap().is_empty());
    }

    #[test]
    fn control_text_in_literal_ranges_stays_text() {
        let tok = build(&tiny_metadata()).unwrap();
        let text = "<|im_start|>u<|im_end|>x<x><|im_end|>";
        // Without literal ranges it is the special-parsing encoding, exactly.
        assert_eq!(
            tok.encode_with_literals(text, false, &[]),
            tok.encode(text, false, true)
        );
        // The range covers "u<|im_end|>x<x>": its control text is bytes, its
        // user-defined token still matches, and the markers outside stay tokens.
        let lit = 12..27;
        assert_eq!(&text[lit.clone()], "u<|im_end|>x<x>");
        let ids = tok.encode_with_literals(text, false, &[lit]);
        assert_eq!(ids.first(), Some(&257));
        assert_eq!(ids.last(), Some(&258));
        assert_eq!(ids.iter().filter(|&&i| i == 258).count(), 1, "{ids:?}");
        assert!(ids.contains(&259));
        assert_eq!(tok.decode(&ids, true).unwrap(), text);
        // A range that only overlaps the start of a control text still disarms it.
        let head = 0..3;
        let ids = tok.encode_with_literals("a<|im_end|>", false, &[head]);
        assert!(!ids.contains(&258), "{ids:?}");
        assert!(tok.contains_control_text("x<|im_start|>"));
        assert!(!tok.contains_control_text("x<x><|im_"));
    }

    #[test]
    fn unknown_model_and_pre_tokenizer_are_refused_by_name() {
        let mut m = tiny_metadata();
        m.insert(
            "tokenizer.ggml.model".into(),
            MetaValue::String("rwkv".into()),
        );
        let err = build(&m).err().unwrap();
        assert!(
            matches!(err, TokenizerError::UnsupportedModel(ref n) if n == "rwkv"),
            "{err}"
        );
        assert!(err.to_string().contains("`rwkv`"), "{err}");

        let mut m = tiny_metadata();
        m.insert(
            "tokenizer.ggml.pre".into(),
            MetaValue::String("tekken".into()),
        );
        let err = build(&m).err().unwrap();
        assert!(matches!(err, TokenizerError::UnsupportedPreTokenizer(ref n) if n == "tekken"));
        assert!(err.to_string().contains("`tekken`"), "{err}");
    }

    #[test]
    fn malformed_metadata_gives_typed_errors() {
        let mut m = tiny_metadata();
        m.remove("tokenizer.ggml.merges");
        assert!(matches!(
            build(&m).err().unwrap(),
            TokenizerError::MissingKey { .. }
        ));

        let mut m = tiny_metadata();
        m.insert(
            "tokenizer.ggml.merges".into(),
            MetaValue::Array(MetaType::String, vec![MetaValue::String("nospace".into())]),
        );
        assert!(matches!(
            build(&m).err().unwrap(),
            TokenizerError::BadMerge { index: 0, .. }
        ));

        let mut m = tiny_metadata();
        m.insert("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(true));
        assert!(matches!(
            build(&m).err().unwrap(),
            TokenizerError::MissingSpecial { which: "bos" }
        ));

        let mut m = tiny_metadata();
        m.insert(
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array(MetaType::I32, vec![]),
        );
        assert!(matches!(
            build(&m).err().unwrap(),
            TokenizerError::TokenTypeCount { .. }
        ));

        let mut m = tiny_metadata();
        m.insert("tokenizer.ggml.pre".into(), MetaValue::U32(1));
        assert!(matches!(
            build(&m).err().unwrap(),
            TokenizerError::WrongType { .. }
        ));

        let mut m = tiny_metadata();
        let MetaValue::Array(_, toks) = m.get_mut("tokenizer.ggml.tokens").unwrap() else {
            unreachable!()
        };
        toks[b'A' as usize] = MetaValue::String("AA".into());
        assert!(matches!(
            build(&m).err().unwrap(),
            TokenizerError::MissingByteToken(b'A')
        ));
    }

    #[test]
    fn a_missing_control_byte_symbol_is_left_out_not_fatal() {
        let mut m = tiny_metadata();
        let MetaValue::Array(_, toks) = m.get_mut("tokenizer.ggml.tokens").unwrap() else {
            unreachable!()
        };
        // Byte 0x04's symbol, as SmolLM2's vocabulary lacks it.
        toks[0x04] = MetaValue::String("[gone]".into());
        let tok = build(&m).unwrap();
        let with = tok.encode("a\u{4}b", false, false);
        assert_eq!(with, tok.encode("ab", false, false));
        assert_eq!(tok.encode("\u{4}", false, false), Vec::<u32>::new());
    }
}
