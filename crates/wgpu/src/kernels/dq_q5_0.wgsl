// Q5_0: 22-byte blocks of { f16 d; u8 qh[4]; u8 qs[16] }. Value j < 16 takes the low
// nibble of qs[j] and bit j of qh; value j + 16 the high nibble and bit j + 16.
fn load_chunk(row: u32, c: u32) {
    let off = row * p.row_bytes + c * 22u;
    let d = f16_at(off);
    let h = u16_at(off + 2u) | (u16_at(off + 4u) << 16u);
    for (var i = 0u; i < 4u; i++) {
        let qw = word_at(off + 6u + 4u * i);
        for (var b = 0u; b < 4u; b++) {
            let j = 4u * i + b;
            let q = (qw >> (8u * b)) & 0xffu;
            let lo = (q & 0x0fu) | (((h >> j) << 4u) & 0x10u);
            let hi = (q >> 4u) | ((h >> (j + 12u)) & 0x10u);
            v[j] = f32(i32(lo) - 16) * d;
            v[j + 16u] = f32(i32(hi) - 16) * d;
        }
    }
}
