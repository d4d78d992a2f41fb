// Q6_K: 210-byte super-blocks of 256 values { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }.
// Chunk cc of a super-block is quarter k = cc % 4 of half n = cc / 4; value l takes
// 4 low bits from ql and 2 high bits from qh, minus 32, times d * scales[8n + l/16 + 2k].
fn load_chunk(row: u32, c: u32) {
    let off = row * p.row_bytes + (c / 8u) * 210u;
    let cc = c % 8u;
    let n = cc / 4u;
    let k = cc % 4u;
    let d = f16_at(off + 208u);
    let ql_off = off + 64u * n + 32u * (k % 2u);
    let qh_off = off + 128u + 32u * n;
    let sc_off = off + 192u + 8u * n + 2u * k;
    let lshift = 4u * (k / 2u);
    let hshift = 2u * k;
    let s0 = d * f32(i8_of(byte_at(sc_off)));
    let s1 = d * f32(i8_of(byte_at(sc_off + 1u)));
    for (var i = 0u; i < 8u; i++) {
        let lw = word_at(ql_off + 4u * i) >> lshift;
        let hw = word_at(qh_off + 4u * i) >> hshift;
        let s = select(s1, s0, i < 4u);
        for (var b = 0u; b < 4u; b++) {
            let q = ((lw >> (8u * b)) & 0x0fu) | (((hw >> (8u * b)) & 3u) << 4u);
            v[4u * i + b] = s * f32(i32(q) - 32);
        }
    }
}
