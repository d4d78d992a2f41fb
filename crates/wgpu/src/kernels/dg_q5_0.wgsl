// Q5_0 (see dq_q5_0.wgsl): `o` is the block's offset, `e` its 32 high bits, `a` its
// scale. Groups 0-3 take the low nibbles of qs, groups 4-7 the high ones.
fn chunk_at(row: u32, c: u32) -> Chunk {
    let off = row * p.row_bytes + c * 22u;
    let h = u16_at(off + 2u) | (u16_at(off + 4u) << 16u);
    return Chunk(off, 0u, h, 0u, f16_at(off), 0.0);
}

fn group(ch: Chunk, g: u32) -> vec4<f32> {
    let gi = g % 4u;
    let qw = word_at(ch.o + 6u + 4u * gi);
    // Nibble shift and the position of value 4 gi's high bit within `e`.
    let hi = g / 4u;
    let qs = qw >> (4u * hi);
    let hb = ch.e >> (4u * gi + 16u * hi);
    var r: vec4<f32>;
    for (var b = 0u; b < 4u; b++) {
        let q = ((qs >> (8u * b)) & 0x0fu) | (((hb >> b) & 1u) << 4u);
        r[b] = f32(i32(q) - 16) * ch.a;
    }
    return r;
}
