// Q4_K: 144-byte super-blocks of 256 values { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }.
// Sub-block s (32 values) has a 6-bit scale and min packed as in `scale_min_k4`;
// value = d * sc * q - dmin * m, q the low (even s) or high (odd s) nibble of
// qs[32 * (s / 2) + l].
fn load_chunk(row: u32, c: u32) {
    let off = row * p.row_bytes + (c / 8u) * 144u;
    let s = c % 8u;
    let d = f16_at(off);
    let dmin = f16_at(off + 2u);
    let sc_off = off + 4u;
    var sc: u32;
    var m: u32;
    if (s < 4u) {
        sc = byte_at(sc_off + s) & 63u;
        m = byte_at(sc_off + s + 4u) & 63u;
    } else {
        sc = (byte_at(sc_off + s + 4u) & 0x0fu) | ((byte_at(sc_off + s - 4u) >> 6u) << 4u);
        m = (byte_at(sc_off + s + 4u) >> 4u) | ((byte_at(sc_off + s) >> 6u) << 4u);
    }
    let d1 = d * f32(sc);
    let m1 = dmin * f32(m);
    // Rows are whole 144-byte super-blocks, so qs is word aligned.
    let q_word = (off + 16u + 32u * (s / 2u)) >> 2u;
    let shift = 4u * (s % 2u);
    for (var i = 0u; i < 8u; i++) {
        let q = w[q_word + i] >> shift;
        for (var b = 0u; b < 4u; b++) {
            v[4u * i + b] = d1 * f32((q >> (8u * b)) & 0x0fu) - m1;
        }
    }
}
