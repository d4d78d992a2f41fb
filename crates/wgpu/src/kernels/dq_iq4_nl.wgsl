// IQ4_NL: 18-byte blocks of { f16 d; u8 qs[16] }. Value j < 16 is d times the level the low
// nibble of qs[j] indexes in the IQ4 table, value j + 16 the one its high nibble indexes.
fn load_chunk(row: u32, c: u32) {
    // Blocks are 18 bytes, so qs starts at any even byte: words are read unaligned.
    let off = row * p.row_bytes + c * 18u;
    let d = f16_at(off);
    for (var i = 0u; i < 4u; i++) {
        let qw = word_at(off + 2u + 4u * i);
        for (var b = 0u; b < 4u; b++) {
            let j = 4u * i + b;
            let q = (qw >> (8u * b)) & 0xffu;
            v[j] = d * iq4_level(q & 0x0fu);
            v[j + 16u] = d * iq4_level(q >> 4u);
        }
    }
}
