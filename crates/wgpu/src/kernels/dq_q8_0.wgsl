// Q8_0: 34-byte blocks of { f16 d; i8 qs[32] }, value = qs[i] * d.
fn load_chunk(row: u32, c: u32) {
    let off = row * p.row_bytes + c * 34u;
    let d = f16_at(off);
    for (var i = 0u; i < 8u; i++) {
        let q = word_at(off + 2u + 4u * i);
        for (var b = 0u; b < 4u; b++) {
            v[4u * i + b] = f32(i8_of((q >> (8u * b)) & 0xffu)) * d;
        }
    }
}
