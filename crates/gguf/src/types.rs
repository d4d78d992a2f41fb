//! The ggml tensor-type table: type ids as stored in GGUF, block sizes and block byte sizes.

use std::fmt;

/// A ggml tensor type that minfer can read, write and dequantize.
///
/// The discriminants are the on-disk `ggml_type` ids; they never change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    Iq2Xxs = 16,
    Iq2Xs = 17,
    Iq3Xxs = 18,
    Iq1S = 19,
    Iq4Nl = 20,
    Iq3S = 21,
    Iq2S = 22,
    Iq4Xs = 23,
    Iq1M = 29,
    BF16 = 30,
    Tq1_0 = 34,
    Tq2_0 = 35,
    Mxfp4 = 39,
}

/// Every supported type, in id order.
pub const ALL_TYPES: [GgmlType; 26] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8K,
    GgmlType::Iq2Xxs,
    GgmlType::Iq2Xs,
    GgmlType::Iq3Xxs,
    GgmlType::Iq1S,
    GgmlType::Iq4Nl,
    GgmlType::Iq3S,
    GgmlType::Iq2S,
    GgmlType::Iq4Xs,
    GgmlType::Iq1M,
    GgmlType::BF16,
    GgmlType::Tq1_0,
    GgmlType::Tq2_0,
    GgmlType::Mxfp4,
];

/// Elements per super-block for the k-quants.
pub const QK_K: usize = 256;

impl GgmlType {
    /// Maps an on-disk type id to a supported type; `None` for ids minfer does not handle.
    pub fn from_id(id: u32) -> Option<Self> {
        ALL_TYPES.iter().copied().find(|t| *t as u32 == id)
    }

    /// The on-disk type id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Number of elements one block encodes (1 for the float types).
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Iq4Nl
            | GgmlType::Mxfp4 => 32,
            GgmlType::Q2K
            | GgmlType::Q3K
            | GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
            | GgmlType::Q8K
            | GgmlType::Iq2Xxs
            | GgmlType::Iq2Xs
            | GgmlType::Iq2S
            | GgmlType::Iq3Xxs
            | GgmlType::Iq3S
            | GgmlType::Iq1S
            | GgmlType::Iq1M
            | GgmlType::Iq4Xs
            | GgmlType::Tq1_0
            | GgmlType::Tq2_0 => QK_K,
        }
    }

    /// Bytes one block occupies on disk and in memory.
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q2K => 84,
            GgmlType::Q3K => 110,
            GgmlType::Q4K => 144,
            GgmlType::Q5K => 176,
            GgmlType::Q6K => 210,
            GgmlType::Q8K => 292,
            GgmlType::Iq2Xxs => 66,
            GgmlType::Iq2Xs => 74,
            GgmlType::Iq2S => 82,
            GgmlType::Iq3Xxs => 98,
            GgmlType::Iq3S => 110,
            GgmlType::Iq1S => 50,
            GgmlType::Iq1M => 56,
            GgmlType::Iq4Nl => 18,
            GgmlType::Iq4Xs => 136,
            GgmlType::Tq1_0 => 54,
            GgmlType::Tq2_0 => 66,
            GgmlType::Mxfp4 => 17,
        }
    }

    /// Bytes needed for `n_elements` elements, or `None` when `n_elements` is not a
    /// multiple of the block size or the product overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size() as u64)
    }

    /// The ggml spelling of the type name (`"q4_K"`, `"f32"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Q8K => "Q8_K",
            GgmlType::Iq2Xxs => "IQ2_XXS",
            GgmlType::Iq2Xs => "IQ2_XS",
            GgmlType::Iq2S => "IQ2_S",
            GgmlType::Iq3Xxs => "IQ3_XXS",
            GgmlType::Iq3S => "IQ3_S",
            GgmlType::Iq1S => "IQ1_S",
            GgmlType::Iq1M => "IQ1_M",
            GgmlType::Iq4Nl => "IQ4_NL",
            GgmlType::Iq4Xs => "IQ4_XS",
            GgmlType::Tq1_0 => "TQ1_0",
            GgmlType::Tq2_0 => "TQ2_0",
            GgmlType::Mxfp4 => "MXFP4",
        }
    }

    /// Parses the name printed by [`GgmlType::name`], case-insensitively.
    pub fn from_name(s: &str) -> Option<Self> {
        ALL_TYPES
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    }

    /// True for the block-quantized types.
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_unknown_ids_are_rejected() {
        for t in ALL_TYPES {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        for bad in [4u32, 5, 9, 24, 28, 31, 36, 40, 1000] {
            assert_eq!(GgmlType::from_id(bad), None);
        }
    }

    #[test]
    fn bytes_for_checks_block_multiples_and_overflow() {
        assert_eq!(GgmlType::Q4K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_0.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
        assert_eq!(GgmlType::Iq4Xs.bytes_for(512), Some(272));
        assert_eq!(GgmlType::Mxfp4.bytes_for(64), Some(34));
    }

    #[test]
    fn ids_and_names_are_ggmls() {
        // A few ids from ggml's `ggml_type` enum, which GGUF files store verbatim.
        for (id, name) in [
            (16, "IQ2_XXS"),
            (20, "IQ4_NL"),
            (23, "IQ4_XS"),
            (29, "IQ1_M"),
        ] {
            assert_eq!(GgmlType::from_id(id).map(GgmlType::name), Some(name));
        }
        for (id, name) in [(34, "TQ1_0"), (35, "TQ2_0"), (39, "MXFP4")] {
            assert_eq!(GgmlType::from_id(id).map(GgmlType::name), Some(name));
        }
        assert_eq!(GgmlType::from_name("iq4_xs"), Some(GgmlType::Iq4Xs));
    }
}
