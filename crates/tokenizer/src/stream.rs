//! Incremental detokenization: tokens arrive one at a time, text leaves only as whole UTF-8
//! characters (a byte-level token may end in the middle of one).

use crate::error::TokenizerError;
use crate::tokenizer::Tokenizer;

/// Buffers the bytes of a token stream and releases complete UTF-8 text.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    special: bool,
}

impl StreamDecoder {
    /// A decoder; `special` renders CONTROL tokens (e.g. `<|im_end|>`) instead of hiding them.
    pub fn new(special: bool) -> Self {
        StreamDecoder {
            pending: Vec::new(),
            special,
        }
    }

    /// Feeds one token; returns the text completed by it (possibly empty). Bytes that can
    /// never become valid UTF-8 are emitted as U+FFFD rather than held forever.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        self.pending
            .extend_from_slice(tokenizer.token_bytes(id, self.special)?);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix was just validated, so this conversion cannot fail.
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete character at the end: wait for the next token.
                        None => {
                            self.pending.drain(..valid);
                            break;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Ends the stream: returns what is still buffered (an incomplete character becomes
    /// U+FFFD) and resets the decoder.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Whether bytes of an incomplete character are buffered.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}
