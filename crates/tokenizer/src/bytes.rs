//! The byte-level BPE alphabet: each of the 256 byte values is written as one printable
//! character so that vocabularies can be stored as text (the GPT-2 convention). Printable
//! Latin-1 bytes stand for themselves; the other 68 bytes take code points 256.. in byte order.

/// Whether `b` is one of the bytes that stands for itself.
const fn is_direct(b: u8) -> bool {
    matches!(b, 0x21..=0x7e | 0xa1..=0xac | 0xae..=0xff)
}

const fn build_byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    let mut b = 0usize;
    while b < 256 {
        if is_direct(b as u8) {
            table[b] = b as u8 as char;
        } else {
            table[b] = match char::from_u32(next) {
                Some(c) => c,
                None => '\0',
            };
            next += 1;
        }
        b += 1;
    }
    table
}

/// Byte value -> its character in the byte-level alphabet.
pub const BYTE_TO_CHAR: [char; 256] = build_byte_to_char();

/// Maps 256 + k back to the k-th indirect byte.
const fn build_indirect() -> [u8; 68] {
    let mut table = [0u8; 68];
    let mut k = 0usize;
    let mut b = 0usize;
    while b < 256 {
        if !is_direct(b as u8) {
            table[k] = b as u8;
            k += 1;
        }
        b += 1;
    }
    table
}

const INDIRECT: [u8; 68] = build_indirect();

/// The byte a character of the byte-level alphabet stands for; `None` for other characters.
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 256 && is_direct(cp as u8) {
        Some(cp as u8)
    } else if (256..256 + 68).contains(&cp) {
        Some(INDIRECT[(cp - 256) as usize])
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = BYTE_TO_CHAR[b as usize];
            assert!(seen.insert(c), "duplicate char for byte {b}");
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], '\u{120}'); // "Ġ"
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], '\u{10a}'); // "Ċ"
        assert_eq!(BYTE_TO_CHAR[b'A' as usize], 'A');
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte('😀'), None);
    }
}
