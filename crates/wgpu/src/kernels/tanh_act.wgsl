// The tanh-form activations of Gemma's graphs over f32 buffers, in the CPU's forms
// (cpu/src/ops/act.rs), one thread per output element on a two-dimensional grid:
// GELU as `x / (1 + e^(-2u))` with `u = sqrt(2/pi) x (1 + 0.044715 x^2)` (no `1 + tanh`
// cancellation in the negative tail), GeGLU as gelu(gate) * up, and the soft-cap as
// `c * tanh(x / c)` with `tanh(v) = 2 / (1 + e^(-2v)) - 1`. The exponential's argument
// is clamped below f32's overflow, where both forms have already reached their limit.

struct P {
    n: u32,      // output elements
    _p0: u32,
    c: f32,      // the soft-cap
    inv_c: f32,  // 1 / c, rounded once on the host as the CPU rounds it
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

// 2 sqrt(2/pi) (the f32 of sqrt(2/pi), doubled exactly) and ggml's cubic coefficient.
const GELU_2C: f32 = 1.5957691216057308;
const GELU_A: f32 = 0.044715;
const EXP_MAX: f32 = 88.0;

fn index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * 256u + lid;
}

fn gelu1(x: f32) -> f32 {
    let q = GELU_A * (x * x) + 1.0;
    return x / (1.0 + exp(min(-((GELU_2C * x) * q), EXP_MAX)));
}

fn tanh1(v: f32) -> f32 {
    return 2.0 / (1.0 + exp(min(-2.0 * v, EXP_MAX))) - 1.0;
}

@compute @workgroup_size(256)
fn gelu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n) { return; }
    y[i] = gelu1(a[i]);
}

@compute @workgroup_size(256)
fn geglu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n) { return; }
    y[i] = gelu1(a[i]) * b[i];
}

@compute @workgroup_size(256)
fn softcap(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = index(wid, nwg, lid);
    if (i >= p.n) { return; }
    y[i] = p.c * tanh1(a[i] * p.inv_c);
}
