// Q6_K (see dq_q6_k.wgsl): `o`/`o2` are the chunk's ql and qh offsets, `e`/`e2`
// their shifts, `a`/`b` the scales of its first and second 16 values (times d).
fn chunk_at(row: u32, c: u32) -> Chunk {
    let off = row * p.row_bytes + (c / 8u) * 210u;
    let cc = c % 8u;
    let n = cc / 4u;
    let k = cc % 4u;
    let d = f16_at(off + 208u);
    let sc_off = off + 192u + 8u * n + 2u * k;
    return Chunk(off + 64u * n + 32u * (k % 2u), off + 128u + 32u * n, 4u * (k / 2u), 2u * k,
                 d * f32(i8_of(byte_at(sc_off))), d * f32(i8_of(byte_at(sc_off + 1u))));
}

fn group(ch: Chunk, g: u32) -> vec4<f32> {
    let lw = word_at(ch.o + 4u * g) >> ch.e;
    let hw = word_at(ch.o2 + 4u * g) >> ch.e2;
    let s = select(ch.b, ch.a, g < 4u);
    var r: vec4<f32>;
    for (var b = 0u; b < 4u; b++) {
        let q = ((lw >> (8u * b)) & 0x0fu) | (((hw >> (8u * b)) & 3u) << 4u);
        r[b] = s * f32(i32(q) - 32);
    }
    return r;
}
