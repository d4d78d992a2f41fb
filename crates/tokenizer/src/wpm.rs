//! WordPiece (`tokenizer.ggml.model = "bert"`), as llama.cpp's WPM tokenizer encodes.
//!
//! The vocabulary stores a word-initial piece with the `▁` marker in front (`▁play`) and
//! a continuation piece bare (`ing`, BERT's `##ing`), as llama.cpp's converter writes it.
//! Encoding a raw-text fragment:
//!
//! 1. normalize each code point: with accent stripping, its first canonical-decomposition
//!    code point ([`nfd::NFD_FIRST`]), then combining marks (`\p{M}`) dropped; NUL, U+FFFD
//!    and control/format/private-use code points dropped; lowercased (simple mapping)
//!    when the vocabulary asks;
//! 2. split into words at whitespace (llama.cpp's fixed set), and make every punctuation
//!    mark, every ASCII symbol and every CJK ideograph a word of its own;
//! 3. per word, `▁` + word is cut greedily from the left into the longest vocabulary
//!    pieces (at most the longest token's bytes); a word with any part left unmatched
//!    becomes the one unknown token.
//!
//! `[CLS]` (the BOS id) opens and `[SEP]` closes the ids when special tokens are added.

use regex::Regex;

use crate::texts::TextTable;

mod nfd;

/// The word-initial marker in the vocabulary's texts.
const WORD_START: char = '\u{2581}';

/// The WordPiece model of a vocabulary.
pub(crate) struct Wpm {
    /// Lowercase the input (`tokenizer.ggml.normalizer.lowercase`, default on).
    lowercase: bool,
    /// Strip accents (`tokenizer.ggml.normalizer.strip_accents`, default: lowercase).
    strip_accents: bool,
    /// The id of a word that cannot be cut into pieces.
    unk: u32,
    /// The id that closes an encoding with special tokens (`[SEP]`).
    pub sep: u32,
    /// Bytes of the longest token text: no longer piece is looked up.
    max_len: usize,
    classes: Classes,
}

/// The Unicode general categories the normalizer and the split ask about.
struct Classes {
    punct: Regex,
    symbol: Regex,
    mark: Regex,
    control: Regex,
}

impl Classes {
    fn new() -> Self {
        let one = |class: &str| Regex::new(&format!(r"\A{class}\z")).expect("a valid class");
        Classes {
            punct: one(r"\p{P}"),
            symbol: one(r"\p{S}"),
            mark: one(r"\p{M}"),
            // llama.cpp's control flag: Cc, Cf, Co (unassigned code points are not control).
            control: one(r"[\p{Cc}\p{Cf}\p{Co}]"),
        }
    }
}

/// llama.cpp's whitespace set (Unicode's White_Space property).
fn is_whitespace(c: char) -> bool {
    matches!(c as u32,
        0x09..=0x0D | 0x20 | 0x85 | 0xA0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029
        | 0x202F | 0x205F | 0x3000)
}

/// The CJK ideograph blocks BERT splits character by character (llama.cpp's ranges,
/// which follow HF `tokenizers` in starting one block at U+2B920).
fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

/// The first code point of `c`'s canonical decomposition (`c` itself when it has none).
fn nfd_first(c: char) -> char {
    let cp = c as u32;
    let i = nfd::NFD_FIRST.partition_point(|&(first, _, _)| first <= cp);
    match i.checked_sub(1).map(|i| nfd::NFD_FIRST[i]) {
        Some((_, last, to)) if cp <= last => char::from_u32(to).unwrap_or(c),
        _ => c,
    }
}

/// The simple lowercase mapping (one code point; `İ` gives `i` as UnicodeData does).
fn lower(c: char) -> char {
    c.to_lowercase().next().unwrap_or(c)
}

impl Wpm {
    /// The model over `texts`, with the normalizer options and the unknown and
    /// separator ids.
    pub fn new(
        texts: &TextTable,
        lowercase: bool,
        strip_accents: bool,
        unk: u32,
        sep: u32,
    ) -> Self {
        let max_len = (0..texts.len() as u32)
            .filter_map(|id| texts.text(id))
            .map(str::len)
            .max()
            .unwrap_or(0);
        Wpm {
            lowercase,
            strip_accents,
            unk,
            sep,
            max_len,
            classes: Classes::new(),
        }
    }

    /// The normalized words of `text` (step 1 and 2 of the module's description).
    fn words(&self, text: &str) -> Vec<String> {
        let mut words = vec![String::new()];
        let mut buf = [0u8; 4];
        for c in text.chars() {
            let c = if self.strip_accents { nfd_first(c) } else { c };
            if is_whitespace(c) {
                if !words.last().is_some_and(String::is_empty) {
                    words.push(String::new());
                }
                continue;
            }
            let s: &str = c.encode_utf8(&mut buf);
            let k = &self.classes;
            if c == '\0' || c == '\u{FFFD}' || k.control.is_match(s) {
                continue;
            }
            if self.strip_accents && k.mark.is_match(s) {
                continue;
            }
            let punct = k.punct.is_match(s) || (c < '\u{7F}' && k.symbol.is_match(s));
            let c = if self.lowercase { lower(c) } else { c };
            if punct || is_cjk(c) {
                if !words.last().is_some_and(String::is_empty) {
                    words.push(String::new());
                }
                words.push(c.to_string());
                words.push(String::new());
            } else if let Some(w) = words.last_mut() {
                w.push(c);
            }
        }
        words.retain(|w| !w.is_empty());
        words
    }

    /// Appends the ids of one raw-text fragment to `out`.
    pub fn encode(&self, texts: &TextTable, text: &str, out: &mut Vec<u32>) {
        let mut marked = String::new();
        for word in self.words(text) {
            marked.clear();
            marked.push(WORD_START);
            marked.push_str(&word);
            let start = out.len();
            let n = marked.len();
            let mut i = 0;
            while i < n {
                // The longest piece from `i`; cuts inside a character match nothing.
                let hit = (i + 1..=n.min(i + self.max_len))
                    .rev()
                    .find_map(|j| Some((j, texts.id(marked.get(i..j)?)?)));
                match hit {
                    Some((j, id)) => {
                        out.push(id);
                        i = j;
                    }
                    None => {
                        out.truncate(start);
                        break;
                    }
                }
            }
            if out.len() == start {
                out.push(self.unk);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(texts: &[&str]) -> TextTable {
        TextTable::new(texts.iter().copied()).expect("small table")
    }

    #[test]
    fn normalizer_splits_punctuation_cjk_and_strips_accents() {
        let t = table(&["[UNK]"]);
        let w = Wpm::new(&t, true, true, 0, 0);
        assert_eq!(
            w.words("Héllo,  WORLD!\tnaïve\u{0301} 中文x $5 \u{200B}ok"),
            ["hello", ",", "world", "!", "naive", "中", "文", "x", "$", "5", "ok"]
        );
        // Without lowercasing (and so, by default, without accent stripping).
        let w = Wpm::new(&t, false, false, 0, 0);
        assert_eq!(w.words("Héllo €"), ["Héllo", "€"]);
        assert_eq!(nfd_first('한'), '\u{1112}');
        assert_eq!(lower('İ'), 'i');
    }

    #[test]
    fn greedy_longest_pieces_and_unknown_words() {
        let t = table(&["[UNK]", "▁play", "▁playing", "ing", "ed", "▁un", "▁,", "▁a"]);
        let w = Wpm::new(&t, true, true, 0, 0);
        let mut out = Vec::new();
        w.encode(&t, "Playing played, unplayed a", &mut out);
        // "unplayed": ▁un then "played" has no piece from 'p' on: the whole word is unknown.
        assert_eq!(out, [2, 1, 4, 6, 0, 7]);
    }
}
