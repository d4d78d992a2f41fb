// Q8_0 (see dq_q8_0.wgsl): `o` is the block's offset, `a` its scale.
fn chunk_at(row: u32, c: u32) -> Chunk {
    let off = row * p.row_bytes + c * 34u;
    return Chunk(off, 0u, 0u, 0u, f16_at(off), 0.0);
}

fn group(ch: Chunk, g: u32) -> vec4<f32> {
    let q = word_at(ch.o + 2u + 4u * g);
    return vec4<f32>(f32(i8_of(q & 0xffu)), f32(i8_of((q >> 8u) & 0xffu)),
                     f32(i8_of((q >> 16u) & 0xffu)), f32(i8_of(q >> 24u))) * ch.a;
}
