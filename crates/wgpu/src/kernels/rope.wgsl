// Rotary embedding in place on a copy of the input: one thread per rotated pair.
// The angle of pair i is pos * theta_scale^i built by repeated multiplication, the
// running product the CPU kernel uses, so both round the same way.

struct P {
    nt: u32,
    n_head: u32,
    hd: u32,
    n_dims: u32,
    stride: u32,       // values between token rows
    interleaved: u32,  // 1: pairs (2i, 2i+1); 0: pairs (i, i + n_dims/2)
    freq_scale: f32,
    theta_scale: f32,
    off: u32,          // first value of head 0 inside a token row
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<storage, read> pos: array<i32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: P;

@compute @workgroup_size(256)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let half = p.n_dims / 2u;
    let idx = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (idx >= p.nt * p.n_head * half) { return; }
    let i = idx % half;
    let h = (idx / half) % p.n_head;
    let t = idx / (half * p.n_head);
    var theta = f32(pos[t]);
    for (var k = 0u; k < i; k++) { theta *= p.theta_scale; }
    let a = p.freq_scale * theta;
    let c = cos(a);
    let s = sin(a);
    let base = t * p.stride + p.off + h * p.hd;
    var i0 = base + i;
    var i1 = base + i + half;
    if (p.interleaved == 1u) {
        i0 = base + 2u * i;
        i1 = i0 + 1u;
    }
    let x0 = y[i0];
    let x1 = y[i1];
    y[i0] = x0 * c - x1 * s;
    y[i1] = x0 * s + x1 * c;
}
