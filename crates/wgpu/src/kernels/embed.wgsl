// Token embedding: out row t is table row ids[t], dequantized chunk by chunk. One
// workgroup per token. The ids were range checked on the host before dispatch.

struct P {
    k: u32,          // row length (n_embd)
    n: u32,          // rows in the table
    nt: u32,         // tokens
    row_bytes: u32,  // bytes of one table row
}

@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(64)
fn embed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let t = wid.y * nwg.x + wid.x;
    if (t >= p.nt) { return; }
    let row = min(u32(max(ids[t], 0)), p.n - 1u);
    let chunks = (p.k + 31u) / 32u;
    for (var c = lid; c < chunks; c += 64u) {
        load_chunk(row, c);
        let lim = min(32u, p.k - c * 32u);
        for (var i = 0u; i < lim; i++) {
            y[t * p.k + c * 32u + i] = v[i];
        }
    }
}
