//! Property tests over random UTF-8 and the streaming decoder.

mod common;

use common::tokenizer;
use minfer_testkit::Rng;
use minfer_tokenizer::StreamDecoder;

/// A random Unicode scalar, biased towards the ranges tokenizers find hard.
fn random_char(rng: &mut Rng) -> char {
    let ranges: [(u32, u32); 12] = [
        (0x20, 0x7e),       // ASCII printable
        (0x00, 0x20),       // controls and whitespace
        (0x80, 0x2ff),      // Latin-1, Latin extended
        (0x300, 0x36f),     // combining marks
        (0x400, 0x4ff),     // Cyrillic
        (0x600, 0x6ff),     // Arabic
        (0x900, 0x97f),     // Devanagari
        (0x2000, 0x206f),   // general punctuation, spaces, ZWJ
        (0x3000, 0x30ff),   // CJK punctuation, kana
        (0x4e00, 0x9fff),   // CJK ideographs
        (0x1f300, 0x1faff), // emoji
        (0x0, 0x10ffff),    // anything
    ];
    loop {
        let (lo, hi) = ranges[rng.below(ranges.len())];
        let cp = lo + rng.below((hi - lo + 1) as usize) as u32;
        if let Some(c) = char::from_u32(cp) {
            return c;
        }
    }
}

#[test]
fn random_utf8_round_trips_exactly() {
    let tok = tokenizer();
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    for i in 0..2000 {
        let len = rng.below(40);
        let s: String = (0..len).map(|_| random_char(&mut rng)).collect();
        let ids = tok.encode(&s, false, false);
        let back = tok.decode_bytes(&ids, false).expect("ids in range");
        assert_eq!(back, s.as_bytes(), "case {i}: {s:?} -> {ids:?}");
        let ids = tok.encode(&s, false, true);
        let back = tok.decode_bytes(&ids, true).expect("ids in range");
        assert_eq!(back, s.as_bytes(), "case {i} with parse_special: {s:?}");
    }
}

#[test]
fn streaming_matches_one_shot_and_never_splits_a_character() {
    let tok = tokenizer();
    let text = "Emoji 👨‍👩‍👧‍👦🇯🇵🧑🏽‍🚀 and CJK 机器学习、日本語のテキスト, 한국어 — done.";
    let ids = tok.encode(text, false, false);
    let mut dec = StreamDecoder::new(false);
    let mut streamed = String::new();
    let mut held = 0;
    for &id in &ids {
        let chunk = dec.push(tok, id).expect("id in range");
        assert!(
            !chunk.contains('\u{fffd}'),
            "chunk {chunk:?} has a replacement char"
        );
        if chunk.is_empty() && dec.has_pending() {
            held += 1;
        }
        streamed.push_str(&chunk);
    }
    streamed.push_str(&dec.flush());
    assert!(
        held > 0,
        "no token ended inside a character; the test would prove nothing"
    );
    assert_eq!(streamed, tok.decode(&ids, false).unwrap());
    assert_eq!(streamed, text);
}

#[test]
fn streaming_flush_reports_a_cut_character() {
    let tok = tokenizer();
    // A private-use character has no token of its own, so its bytes span several tokens.
    let ids = tok.encode("\u{10fffd}", false, false);
    assert!(
        ids.len() > 1,
        "U+10FFFD should take several byte tokens: {ids:?}"
    );
    let mut dec = StreamDecoder::new(false);
    assert_eq!(dec.push(tok, ids[0]).unwrap(), "");
    assert_eq!(dec.flush(), "\u{fffd}");
    assert!(!dec.has_pending());
}

#[test]
fn token_pieces_are_the_bytes_each_token_decodes_to_with_specials_marked() {
    let tok = tokenizer();
    let pieces: Vec<(&[u8], bool)> = tok.token_pieces().collect();
    assert_eq!(pieces.len(), tok.n_vocab());
    // A byte-level token comes back as raw bytes, not in the GPT-2 alphabet ("Ġ" is a space).
    let hello = tok.encode(" hello", false, false);
    assert_eq!(hello.len(), 1, "{hello:?}");
    assert_eq!(pieces[hello[0] as usize], (&b" hello"[..], false));
    // Control tokens are marked special and keep their text; a tool-call tag is plain text.
    let im_end = tok.token_id("<|im_end|>").expect("ChatML end token");
    assert_eq!(pieces[im_end as usize], (&b"<|im_end|>"[..], true));
    let call = tok.token_id("<tool_call>").expect("tool-call tag");
    assert_eq!(pieces[call as usize], (&b"<tool_call>"[..], false));
    // Concatenated pieces of any text are that text.
    let text = "fn main() { println!(\"é 😀\"); }";
    let ids = tok.encode(text, false, false);
    let joined: Vec<u8> = ids
        .iter()
        .flat_map(|&i| pieces[i as usize].0.to_vec())
        .collect();
    assert_eq!(joined, text.as_bytes());
}
