//! Pre-tokenizers: the regex splits that cut text into words before BPE, chosen by
//! `tokenizer.ggml.pre`. Patterns are the ones llama.cpp and the Hugging Face tokenizer
//! configurations use for each family.
//!
//! The GPT-2 family patterns end in `\s+(?!\S)|\s+`, a look-ahead that linear-time regex
//! engines lack. It is exact to match `\s+` instead and then, when that whitespace run is
//! followed by a non-space character and is at least two characters long, give its last
//! character back: that is precisely what the backtracking `\s+(?!\S)` would have matched,
//! and a one-character run fails the look-ahead and falls through to `\s+` unchanged.

use crate::error::TokenizerError;
use regex::Regex;

/// Qwen2: case-insensitive English contractions, letters with one leading non-letter, single
/// digits, punctuation runs, newline runs, whitespace.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+";

/// Llama 3: as Qwen2 but digits in groups of up to three.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+";

/// GPT-2: lower-case contractions, optional leading space before letter/digit/other runs.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";

/// GPT-4o's o200k split (gpt-oss, Llama 4): letter runs cased as words (an upper-case
/// run followed by lower-case letters, or an upper-case run alone) with one leading
/// non-letter and an optional case-insensitive contraction, digits in groups of up to
/// three, punctuation runs with trailing line breaks or slashes, newline runs, whitespace.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+";

/// SmolLM (and StarCoder, Command-R): every digit on its own, then GPT-2's pattern.
const DIGIT: &str = r"\p{N}";

/// The pre-tokenizer families minfer implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreKind {
    /// `qwen2` (also `megrez`, `stablelm2`).
    Qwen2,
    /// `llama-bpe` (also `llama3`, `llama-v3`, `falcon3`, `dbrx`, `smaug-bpe`).
    Llama3,
    /// `gpt-2` (also `gpt2`, `phi-2`, `roberta-bpe`, `mpt`, `olmo`, `jais`).
    Gpt2,
    /// `smollm` (also `starcoder`, `refact`, `command-r`, `codeshell`): digits split one by
    /// one, then GPT-2's split.
    SmolLm,
    /// `gpt-4o` (also `llama4`): the o200k split.
    Gpt4o,
}

impl PreKind {
    /// Maps a `tokenizer.ggml.pre` value; unknown names are refused, never approximated.
    pub fn from_name(name: &str) -> Result<Self, TokenizerError> {
        Ok(match name {
            "qwen2" | "megrez" | "stablelm2" => PreKind::Qwen2,
            "llama-bpe" | "llama3" | "llama-v3" | "falcon3" | "dbrx" | "smaug-bpe" => {
                PreKind::Llama3
            }
            "gpt-2" | "gpt2" | "phi-2" | "roberta-bpe" | "mpt" | "olmo" | "jais" => PreKind::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" => PreKind::SmolLm,
            "gpt-4o" | "llama4" => PreKind::Gpt4o,
            other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
        })
    }
}

/// One compiled split step.
#[derive(Debug, Clone)]
struct Step {
    re: Regex,
    /// The pattern's last branch stands for `\s+(?!\S)|\s+` (see the module comment).
    ws_lookahead: bool,
    /// The pattern has a `\s*[\r\n]+` branch before the whitespace one, so an all-whitespace
    /// match ending in a line break came from that branch and is kept whole.
    newline_branch: bool,
}

/// A compiled pre-tokenizer.
#[derive(Debug, Clone)]
pub struct PreTokenizer {
    kind: PreKind,
    steps: Vec<Step>,
}

impl PreTokenizer {
    /// Compiles the patterns of `kind`.
    pub fn new(kind: PreKind) -> Self {
        let step = |pattern: &str, ws_lookahead: bool, newline_branch: bool| Step {
            // The patterns are constants exercised by the tests, so compiling cannot fail.
            re: Regex::new(pattern).expect("built-in pre-tokenizer pattern compiles"),
            ws_lookahead,
            newline_branch,
        };
        let steps = match kind {
            PreKind::Qwen2 => vec![step(QWEN2, true, true)],
            PreKind::Llama3 => vec![step(LLAMA3, true, true)],
            PreKind::Gpt2 => vec![step(GPT2, true, false)],
            PreKind::SmolLm => vec![step(DIGIT, false, false), step(GPT2, true, false)],
            PreKind::Gpt4o => vec![step(GPT4O, true, true)],
        };
        PreTokenizer { kind, steps }
    }

    /// The family this pre-tokenizer implements.
    pub fn kind(&self) -> PreKind {
        self.kind
    }

    /// Splits `text` into word byte ranges covering it entirely, in order.
    pub fn split(&self, text: &str, out: &mut Vec<(usize, usize)>) {
        out.clear();
        if text.is_empty() {
            return;
        }
        out.push((0, text.len()));
        let mut next = Vec::new();
        for step in &self.steps {
            next.clear();
            for &(start, end) in out.iter() {
                step.split_range(text, start, end, &mut next);
            }
            std::mem::swap(out, &mut next);
        }
    }
}

impl Step {
    /// Splits `text[start..end]` into matches and the gaps between them.
    fn split_range(&self, text: &str, start: usize, end: usize, out: &mut Vec<(usize, usize)>) {
        let hay = &text[start..end];
        let mut pos = 0;
        let mut last = 0;
        while pos < hay.len() {
            let Some(m) = self.re.find_at(hay, pos) else {
                break;
            };
            let (ms, mut me) = (m.start(), m.end());
            if me == ms {
                // No pattern here matches empty text, but never loop on one that does.
                pos = ms + hay[ms..].chars().next().map_or(1, char::len_utf8);
                continue;
            }
            if self.ws_lookahead && me < hay.len() {
                me = self.give_back_last_space(hay, ms, me);
            }
            if ms > last {
                out.push((start + last, start + ms));
            }
            out.push((start + ms, start + me));
            last = me;
            pos = me;
        }
        if last < hay.len() {
            out.push((start + last, end));
        }
    }

    /// The end of the match `hay[ms..me]` once the `\s+(?!\S)` rule is applied.
    fn give_back_last_space(&self, hay: &str, ms: usize, me: usize) -> usize {
        let m = &hay[ms..me];
        if !m.chars().all(char::is_whitespace) {
            return me;
        }
        if self.newline_branch && (m.ends_with('\n') || m.ends_with('\r')) {
            return me;
        }
        let mut chars = m.char_indices();
        match (chars.next_back(), chars.next()) {
            // At least two characters: drop the last one.
            (Some((last_start, _)), Some(_)) => ms + last_start,
            _ => me,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(kind: PreKind, text: &str) -> Vec<String> {
        let pre = PreTokenizer::new(kind);
        let mut ranges = Vec::new();
        pre.split(text, &mut ranges);
        ranges
            .iter()
            .map(|&(s, e)| text[s..e].to_string())
            .collect()
    }

    #[test]
    fn qwen2_splits_like_the_reference_pattern() {
        assert_eq!(
            pieces(PreKind::Qwen2, "Hello world 12345!!\n\n  x   y\t"),
            vec![
                "Hello", " world", " ", "1", "2", "3", "4", "5", "!!\n\n", " ", " x", "  ", " y",
                "\t"
            ]
        );
        assert_eq!(
            pieces(PreKind::Qwen2, "I'M you'RE it's"),
            vec!["I", "'M", " you", "'RE", " it", "'s"]
        );
        assert_eq!(pieces(PreKind::Qwen2, "a \n b"), vec!["a", " \n", " b"]);
        assert_eq!(
            pieces(PreKind::Qwen2, "x\t\t(y)"),
            vec!["x", "\t", "\t", "(y", ")"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        assert_eq!(pieces(PreKind::Llama3, "1234567"), vec!["123", "456", "7"]);
    }

    #[test]
    fn gpt2_whitespace_lookahead() {
        assert_eq!(pieces(PreKind::Gpt2, "a   b"), vec!["a", "  ", " b"]);
        assert_eq!(
            pieces(PreKind::Gpt2, "a \n\n b  "),
            vec!["a", " \n\n", " b", "  "]
        );
        assert_eq!(
            pieces(PreKind::Gpt2, "it'S 42"),
            vec!["it", "'", "S", " 42"]
        );
    }

    #[test]
    fn smollm_isolates_every_digit_before_the_gpt2_split() {
        assert_eq!(
            pieces(PreKind::SmolLm, "x 2024 ab12c"),
            vec!["x", " ", "2", "0", "2", "4", " ab", "1", "2", "c"]
        );
        assert_eq!(PreKind::from_name("smollm").unwrap(), PreKind::SmolLm);
    }

    /// Expected splits from Python's `regex` module (a backtracking engine with the
    /// look-ahead) over the tokenizer's original pattern.
    #[test]
    fn gpt4o_splits_like_the_o200k_pattern() {
        let cases: [(&str, &[&str]); 4] = [
            (
                "Hello World's HTTPServer 12345\n\n  x",
                &[
                    "Hello",
                    " World's",
                    " HTTPServer",
                    " ",
                    "123",
                    "45",
                    "\n\n",
                    " ",
                    " x",
                ],
            ),
            (
                "I'M you'RE it's DON'T",
                &["I'M", " you'RE", " it's", " DON'T"],
            ),
            (
                "a \n b  c\t\t(y)//\n",
                &["a", " \n", " b", " ", " c", "\t", "\t", "(y", ")//\n"],
            ),
            (
                "<|channel|>analysis<|message|>Need 2+2=4.  Done",
                &[
                    "<|", "channel", "|>", "analysis", "<|", "message", "|>", "Need", " ", "2",
                    "+", "2", "=", "4", ".", " ", " Done",
                ],
            ),
        ];
        for (text, want) in cases {
            assert_eq!(pieces(PreKind::Gpt4o, text), want, "{text:?}");
        }
        assert_eq!(PreKind::from_name("gpt-4o").unwrap(), PreKind::Gpt4o);
    }

    #[test]
    fn unknown_names_are_refused() {
        let err = PreKind::from_name("deepseek-llm").unwrap_err();
        assert!(err.to_string().contains("`deepseek-llm`"), "{err}");
        assert_eq!(PreKind::from_name("qwen2").unwrap(), PreKind::Qwen2);
    }
}
