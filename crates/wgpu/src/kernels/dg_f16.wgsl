// F16 rows: `o` is the row's offset, `e` the chunk's first value (the tail past `p.k`
// reads 0).
fn chunk_at(row: u32, c: u32) -> Chunk {
    return Chunk(row * p.row_bytes, 0u, c * 32u, 0u, 0.0, 0.0);
}

fn group(ch: Chunk, g: u32) -> vec4<f32> {
    var r: vec4<f32>;
    for (var b = 0u; b < 4u; b++) {
        let e = ch.e + 4u * g + b;
        r[b] = select(0.0, f16_at(ch.o + 2u * min(e, p.k - 1u)), e < p.k);
    }
    return r;
}
