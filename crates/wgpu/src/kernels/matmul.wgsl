// y[t, r] = dot(W[r, :], x[t, :]) (+ bias[r]). One workgroup per weight row and per
// tile of TT tokens: each thread dequantizes a 32-value chunk once and applies it to
// every token of the tile (decode is the nt = 1 matrix-vector case of the same code),
// then the partial sums meet in workgroup memory.

const TT: u32 = 8u;
const WG: u32 = 64u;

struct P {
    k: u32,          // input features (row length of W)
    n: u32,          // output features (rows of W)
    nt: u32,         // tokens
    row_bytes: u32,  // bytes of one W row
    x_stride: u32,   // values between consecutive token rows of x (>= k)
    has_bias: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: P;

var<workgroup> part: array<f32, 512>; // WG * TT

@compute @workgroup_size(64)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.n) { return; }
    let t0 = wid.z * TT;
    var acc: array<f32, 8>;
    for (var t = 0u; t < TT; t++) { acc[t] = 0.0; }
    let chunks = (p.k + 31u) / 32u;
    for (var c = lid; c < chunks; c += WG) {
        load_chunk(row, c);
        let lim = min(32u, p.k - c * 32u);
        for (var t = 0u; t < TT; t++) {
            let tok = t0 + t;
            if (tok < p.nt) {
                let xb = tok * p.x_stride + c * 32u;
                var s = 0.0;
                for (var i = 0u; i < lim; i++) {
                    s += v[i] * x[xb + i];
                }
                acc[t] += s;
            }
        }
    }
    for (var t = 0u; t < TT; t++) { part[t * WG + lid] = acc[t]; }
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (lid < k) {
            for (var t = 0u; t < TT; t++) { part[t * WG + lid] += part[t * WG + lid + k]; }
        }
        workgroupBarrier();
    }
    if (lid < TT) {
        let tok = t0 + lid;
        if (tok < p.nt) {
            var r = part[lid * WG];
            if (p.has_bias == 1u) { r += bias[row]; }
            y[tok * p.n + row] = r;
        }
    }
}
