// KV store: token row t of k and v lands in row cells[t] of the layer's regions. The
// cells were range checked on the host before dispatch. Token rows of k and v are
// `stride` apart starting at `k_off` / `v_off`: dense rows (stride n_embd, offsets 0),
// or the k and v columns of a fused q|k|v row.

struct P {
    n_embd: u32,
    nt: u32,
    n_ctx: u32,
    stride: u32,
    k_off: u32,
    v_off: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<storage, read> k: array<f32>;
@group(0) @binding(1) var<storage, read> vv: array<f32>;
@group(0) @binding(2) var<storage, read> cells: array<i32>;
@group(0) @binding(3) var<storage, read_write> kr: array<f32>;
@group(0) @binding(4) var<storage, read_write> vr: array<f32>;
@group(0) @binding(5) var<uniform> p: P;

@compute @workgroup_size(256)
fn kv_store(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i >= p.n_embd * p.nt) { return; }
    let t = i / p.n_embd;
    let j = i % p.n_embd;
    let row = min(u32(max(cells[t], 0)), p.n_ctx - 1u);
    kr[row * p.n_embd + j] = k[t * p.stride + p.k_off + j];
    vr[row * p.n_embd + j] = vv[t * p.stride + p.v_off + j];
}
