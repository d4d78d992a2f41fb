// RMS normalization over rows of `d` values: one workgroup per row, a tree reduction
// of the squares in workgroup memory, then `(x * scale) * w` as the CPU kernel orders it.
// Rows are dense, or `per_tok` heads of each token row `stride` apart from `off` (the
// q or k heads of a fused q|k|v row); x and y share that layout.

struct P {
    d: u32,        // row length (n_embd for RmsNorm, hd for QkNorm)
    rows: u32,     // rows in the output
    eps: f32,
    has_w: u32,    // 1 when a scale vector is bound
    per_tok: u32,  // rows per token row (rows for dense rows)
    stride: u32,   // values between token rows (unused for dense rows)
    off: u32,      // first value of the first row inside a token row
    _p0: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;

var<workgroup> part: array<f32, 256>;

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) { return; }
    let base = (row / p.per_tok) * p.stride + p.off + (row % p.per_tok) * p.d;
    var s = 0.0;
    for (var i = lid; i < p.d; i += 256u) {
        let v = x[base + i];
        s += v * v;
    }
    part[lid] = s;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (lid < k) { part[lid] += part[lid + k]; }
        workgroupBarrier();
    }
    let scale = 1.0 / sqrt(part[0] / f32(p.d) + p.eps);
    for (var i = lid; i < p.d; i += 256u) {
        var v = x[base + i] * scale;
        if (p.has_w == 1u) { v = v * w[i]; }
        y[base + i] = v;
    }
}
