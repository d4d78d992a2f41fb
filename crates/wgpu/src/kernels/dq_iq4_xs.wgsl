// IQ4_XS: 136-byte super-blocks of 256 values { f16 d; u16 scales_h; u8 scales_l[4];
// u8 qs[128] }. Sub-block s (32 values) has the 6-bit scale ls = nibble s % 2 of
// scales_l[s / 2] | bits 2s..2s + 2 of scales_h << 4, and its indices in qs[16 s..16 s + 16]
// packed as IQ4_NL's; value = d * (ls - 32) * level.
fn load_chunk(row: u32, c: u32) {
    let off = row * p.row_bytes + (c / 8u) * 136u;
    let s = c % 8u;
    let dl = iq4_xs_scale(off, s);
    // Rows are whole 136-byte super-blocks, so qs is word aligned.
    let q_word = (off + 8u + 16u * s) >> 2u;
    for (var i = 0u; i < 4u; i++) {
        let qw = w[q_word + i];
        for (var b = 0u; b < 4u; b++) {
            let j = 4u * i + b;
            let q = (qw >> (8u * b)) & 0xffu;
            v[j] = dl * iq4_level(q & 0x0fu);
            v[j + 16u] = dl * iq4_level(q >> 4u);
        }
    }
}
