// IQ4_XS (see dq_iq4_xs.wgsl): a chunk is sub-block s of its super-block; `o` is the word
// of its first four index bytes, `a` its scale d * (ls - 32). Groups 0-3 take the low
// nibbles, groups 4-7 the high ones.
fn chunk_at(row: u32, c: u32) -> Chunk {
    let off = row * p.row_bytes + (c / 8u) * 136u;
    let s = c % 8u;
    // Rows are whole 136-byte super-blocks, so qs is word aligned.
    return Chunk((off + 8u + 16u * s) >> 2u, 0u, 0u, 0u, iq4_xs_scale(off, s), 0.0);
}

fn group(ch: Chunk, g: u32) -> vec4<f32> {
    let q = w[ch.o + g % 4u] >> (4u * (g / 4u));
    return vec4<f32>(iq4_level(q & 0x0fu), iq4_level((q >> 8u) & 0x0fu),
                     iq4_level((q >> 16u) & 0x0fu), iq4_level((q >> 24u) & 0x0fu)) * ch.a;
}
