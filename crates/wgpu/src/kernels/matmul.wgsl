// y[t, r] = dot(W[r, :], x[t, :]) (+ bias[r]) for the rows row0..row0+rows held by one
// weight buffer (a weight larger than the adapter's largest binding is split by rows
// into several buffers, one dispatch each). One workgroup per four weight rows and per
// tile of TT tokens: each thread dequantizes a 32-value chunk once and applies it to
// every token of the tile (decode is the nt = 1 matrix-vector case of the same code),
// then the partial sums of a row's lanes meet in workgroup memory.

const TT: u32 = 8u;
const WG: u32 = 64u;
// Each workgroup computes ROWS rows with LANES threads per row: rows of 896 values
// are 28 chunks, so one row per 64-thread workgroup would leave most threads idle.
const ROWS: u32 = 4u;
const LANES: u32 = 16u;

struct P {
    k: u32,          // input features (row length of W)
    n: u32,          // output features (rows of the whole W)
    nt: u32,         // tokens
    row_bytes: u32,  // bytes of one W row
    x_stride: u32,   // values between consecutive token rows of x (>= k)
    has_bias: u32,
    row0: u32,       // first row of W in this buffer
    rows: u32,       // rows of W in this buffer
    y_stride: u32,   // values between token rows of y (n, or 2 nf in the fused FFN)
    y_off: u32,      // first column of y written (nf for the fused FFN's up half)
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: P;

var<workgroup> part: array<f32, 512>; // TT * WG

@compute @workgroup_size(64)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let lane = lid % LANES;
    let row = (wid.y * nwg.x + wid.x) * ROWS + lid / LANES;
    let t0 = wid.z * TT;
    let tn = min(TT, p.nt - t0);
    var acc: array<f32, 8>;
    for (var t = 0u; t < TT; t++) { acc[t] = 0.0; }
    if (row < p.rows) {
        let chunks = (p.k + 31u) / 32u;
        for (var c = lane; c < chunks; c += LANES) {
            load_chunk(row, c);
            // A constant trip count lets the compiler keep `v` in registers. Past `p.k`
            // (an f32/f16 row tail) `v` is zero, and a read past the end of x is
            // clamped into the buffer by the bounds checks, so it adds nothing.
            for (var t = 0u; t < tn; t++) {
                let xb = (t0 + t) * p.x_stride + c * 32u;
                var s = 0.0;
                for (var i = 0u; i < 32u; i++) {
                    s += v[i] * x[xb + i];
                }
                acc[t] += s;
            }
        }
    }
    for (var t = 0u; t < TT; t++) { part[t * WG + lid] = acc[t]; }
    workgroupBarrier();
    for (var k = LANES / 2u; k > 0u; k >>= 1u) {
        if (lane < k) {
            for (var t = 0u; t < TT; t++) { part[t * WG + lid] += part[t * WG + lid + k]; }
        }
        workgroupBarrier();
    }
    if (lane < tn && row < p.rows) {
        let tok = t0 + lane;
        var r = part[lane * WG + lid - lane];
        if (p.has_bias == 1u) { r += bias[p.row0 + row]; }
        y[tok * p.y_stride + p.y_off + p.row0 + row] = r;
    }
}
