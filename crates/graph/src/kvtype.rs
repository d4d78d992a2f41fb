//! The element formats of stored K and V rows (ADR-0006): chosen per engine, reported by
//! the backend that holds the regions, and part of the KV-session file contract (the
//! codes below are written into session files and never change meaning).

/// Elements per Q8_0 block: 32 signed bytes sharing one f16 scale.
pub const Q8_0_BLOCK: usize = 32;

/// Bytes of one Q8_0 block (the f16 scale, then 32 `i8`).
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// How one layer's K or V rows are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvType {
    /// 32-bit floats, as computed (the reference format).
    #[default]
    F32,
    /// IEEE half precision, rounded to nearest even.
    F16,
    /// ggml's Q8_0: blocks of 32 values as `i8` with one f16 scale.
    Q8_0,
}

impl KvType {
    /// Every format, in code order.
    pub const ALL: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Q8_0];

    /// The name used by `--cache-type-k/--cache-type-v` (llama.cpp's spelling).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Parses a `--cache-type-*` value, naming the accepted ones on failure.
    pub fn parse(s: &str) -> Result<KvType, String> {
        KvType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown KV cache type '{s}' (expected f32, f16 or q8_0)"))
    }

    /// The stable code written into KV-session files.
    pub fn code(self) -> u8 {
        match self {
            KvType::F32 => 0,
            KvType::F16 => 1,
            KvType::Q8_0 => 8,
        }
    }

    /// The format of a session-file code, if it is one.
    pub fn from_code(code: u8) -> Option<KvType> {
        KvType::ALL.into_iter().find(|t| t.code() == code)
    }

    /// Elements that must divide a row (and a head) of this format.
    pub fn block(self) -> usize {
        match self {
            KvType::F32 | KvType::F16 => 1,
            KvType::Q8_0 => Q8_0_BLOCK,
        }
    }

    /// Bytes of `n` elements; `None` when `n` is not a whole number of blocks.
    pub fn bytes_for(self, n: usize) -> Option<usize> {
        match self {
            KvType::F32 => n.checked_mul(4),
            KvType::F16 => n.checked_mul(2),
            KvType::Q8_0 => n
                .is_multiple_of(Q8_0_BLOCK)
                .then(|| (n / Q8_0_BLOCK).checked_mul(Q8_0_BLOCK_BYTES))
                .flatten(),
        }
    }

    /// 32-bit words one stored row of `n` elements occupies: rows start on a word, so a
    /// region of any format lives in the backends' f32-word pools.
    pub fn row_words(self, n: usize) -> Option<usize> {
        self.bytes_for(n).map(|b| b.div_ceil(4))
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_codes_and_sizes_round_trip() {
        for t in KvType::ALL {
            assert_eq!(KvType::parse(t.name()), Ok(t));
            assert_eq!(KvType::from_code(t.code()), Some(t));
        }
        assert_eq!(KvType::parse("Q8_0"), Ok(KvType::Q8_0));
        let e = KvType::parse("q4_0").unwrap_err();
        assert!(e.contains("q4_0") && e.contains("f16"), "{e}");
        assert_eq!(KvType::from_code(2), None);
        // Qwen2.5-0.5B: 2 KV heads of 64.
        assert_eq!(KvType::F32.row_words(128), Some(128));
        assert_eq!(KvType::F16.row_words(128), Some(64));
        assert_eq!(KvType::Q8_0.row_words(128), Some(34));
        assert_eq!(
            KvType::F16.row_words(3),
            Some(2),
            "odd rows round up to a word"
        );
        assert_eq!(KvType::Q8_0.row_words(48), None, "not whole blocks");
    }
}
