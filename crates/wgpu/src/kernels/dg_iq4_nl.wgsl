// IQ4_NL (see dq_iq4_nl.wgsl): `o` is the block's offset, `a` its scale. Groups 0-3 take
// the low nibbles of qs, groups 4-7 the high ones.
fn chunk_at(row: u32, c: u32) -> Chunk {
    let off = row * p.row_bytes + c * 18u;
    return Chunk(off, 0u, 0u, 0u, f16_at(off), 0.0);
}

fn group(ch: Chunk, g: u32) -> vec4<f32> {
    let q = word_at(ch.o + 2u + 4u * (g % 4u)) >> (4u * (g / 4u));
    return vec4<f32>(iq4_level(q & 0x0fu), iq4_level((q >> 8u) & 0x0fu),
                     iq4_level((q >> 16u) & 0x0fu), iq4_level((q >> 24u) & 0x0fu)) * ch.a;
}
