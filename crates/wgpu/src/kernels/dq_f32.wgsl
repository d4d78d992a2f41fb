// F32 rows: chunk `c` is values 32c..32c+32 of the row (the tail past `p.k` reads 0).
fn load_chunk(row: u32, c: u32) {
    let base = row * p.k;
    for (var i = 0u; i < 32u; i++) {
        let e = c * 32u + i;
        v[i] = select(0.0, bitcast<f32>(w[base + e]), e < p.k);
    }
}
