// The fused FFN's epilogue, in place: each token row holds gate (nf values) then up
// (nf values); the gate half becomes silu(gate) * up, the up half stays.

struct P {
    n: u32,   // nt * nf
    nf: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<uniform> p: P;

@compute @workgroup_size(256)
fn swiglu_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i >= p.n) { return; }
    let g = (i / p.nf) * 2u * p.nf + i % p.nf;
    let x = y[g];
    // The same expression as elementwise.wgsl's swiglu, so fused and unfused agree.
    y[g] = x / (1.0 + exp(-x)) * y[g + p.nf];
}
