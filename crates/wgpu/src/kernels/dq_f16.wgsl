// F16 rows: chunk `c` is values 32c..32c+32 of the row (the tail past `p.k` reads 0).
fn load_chunk(row: u32, c: u32) {
    let base = row * p.row_bytes;
    for (var i = 0u; i < 32u; i++) {
        let e = c * 32u + i;
        v[i] = select(0.0, f16_at(base + 2u * min(e, p.k - 1u)), e < p.k);
    }
}
