// Row gather over an f32 activation: out row t is row ids[t] of x. The ids were range
// checked on the host before dispatch; `min` only keeps a stray id inside the buffer.

struct P {
    d: u32,     // row length
    nt: u32,    // output rows
    rows: u32,  // rows in x
    _p0: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

@compute @workgroup_size(256)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i >= p.d * p.nt) { return; }
    let t = i / p.d;
    let r = min(u32(max(ids[t], 0)), p.rows - 1u);
    y[i] = x[r * p.d + i % p.d];
}
