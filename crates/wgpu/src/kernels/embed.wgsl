// Token embedding: out row t is table row ids[t], dequantized chunk by chunk. One
// workgroup per token. A table larger than the adapter's largest binding is split by
// rows into several buffers, one dispatch each: a dispatch writes only the tokens
// whose row its buffer holds. The ids were range checked on the host.

struct P {
    k: u32,          // row length (n_embd)
    n: u32,          // rows in this buffer
    nt: u32,         // tokens
    row_bytes: u32,  // bytes of one table row
    row0: u32,       // first table row in this buffer
}

@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(64)
fn embed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let t = wid.y * nwg.x + wid.x;
    if (t >= p.nt) { return; }
    let id = ids[t];
    if (id < i32(p.row0) || id >= i32(p.row0 + p.n)) { return; }
    let row = u32(id) - p.row0;
    let chunks = (p.k + 31u) / 32u;
    for (var c = lid; c < chunks; c += 64u) {
        load_chunk(row, c);
        let lim = min(32u, p.k - c * 32u);
        for (var i = 0u; i < lim; i++) {
            y[t * p.k + c * 32u + i] = v[i];
        }
    }
}
