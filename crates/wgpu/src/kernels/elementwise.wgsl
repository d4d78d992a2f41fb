// Element-wise kernels over f32 buffers. One thread per output element; the grid is
// two-dimensional so that outputs longer than 65535 workgroups still fit.

struct P {
    n: u32,   // output elements
    nb: u32,  // elements of b (b broadcasts over rows when nb < n); the row length of
              // `mul_sigmoid`
    s: f32,   // the constant of `scale`
    _p1: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

fn index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * 256u + lid;
}

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n) { return; }
    y[i] = a[i] + b[i % p.nb];
}

@compute @workgroup_size(256)
fn mul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n) { return; }
    y[i] = a[i] * b[i % p.nb];
}

// x * sigmoid(x), written as x / (1 + e^-x) like the CPU reference.
fn silu1(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

@compute @workgroup_size(256)
fn silu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n) { return; }
    y[i] = silu1(a[i]);
}

@compute @workgroup_size(256)
fn swiglu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n) { return; }
    y[i] = silu1(a[i]) * b[i];
}

@compute @workgroup_size(256)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n) { return; }
    y[i] = a[i] * p.s;
}

// x times the sigmoid of its row's gate (one gate per row of `nb` values), the sigmoid
// rounded once per row as the CPU rounds it: 1 / (1 + e^-g).
@compute @workgroup_size(256)
fn mul_sigmoid(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n) { return; }
    y[i] = a[i] * (1.0 / (1.0 + exp(-b[i / p.nb])));
}
