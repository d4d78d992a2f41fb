// Q4_K (see dq_q4_k.wgsl): a chunk is sub-block s of its super-block, value
// d * sc * q - dmin * m; `o` is the word of its first four nibbles, `e` their shift.
fn chunk_at(row: u32, c: u32) -> Chunk {
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
    // Rows are whole 144-byte super-blocks, so qs is word aligned.
    let q_word = (off + 16u + 32u * (s / 2u)) >> 2u;
    return Chunk(q_word, 0u, 4u * (s % 2u), 0u, d * f32(sc), dmin * f32(m));
}

fn group(ch: Chunk, g: u32) -> vec4<f32> {
    let q = w[ch.o + g] >> ch.e;
    let n = vec4<f32>(f32(q & 0x0fu), f32((q >> 8u) & 0x0fu), f32((q >> 16u) & 0x0fu),
                      f32((q >> 24u) & 0x0fu));
    return ch.a * n - vec4<f32>(ch.b);
}
