// Rounds matmul activations exactly as the CPU backend quantizes them before a
// quantized dot product (ggml's quantize_row_q8_0 and quantize_row_q8_K), and writes
// each value as a level and a scale (below). The matmul then multiplies the same
// rounded activations the CPU's integer dot products see, so the two backends differ only in
// float summation order, not by the activation rounding (about 1/254 of a block's
// largest value, enough to flip near-tied logits).
//
// - q8_0 (beside Q8_0 and Q5_0 weights): blocks of 32, d = amax / 127 rounded to f16
//   (round to nearest even), q = round(x / d) with ties away from zero computed as
//   x * (1 / d) in f32, level times the f16 scale.
// - q8_k (beside Q4_K and Q6_K weights): blocks of 256, max the signed value of
//   largest magnitude (the first of equals), iscale = -127 / max, q = min(round half
//   to even(iscale * x), 127), d = 1 / iscale kept in f32.
//
// One workgroup per block; x rows of `k` values at `x_stride`. The output is packed,
// rows dense: first the levels, four signed bytes a word (value e of token t in byte
// e % 4 of word t * k / 4 + e / 4), then one f32 scale per 32 values (scale of values
// 32c.. of token t at word nt * k / 4 + t * k / 32 + c; a Q8_K block's scale repeats
// for its eight 32-value parts). The matmul reads a value back as f32(level) * scale,
// the very product the CPU's rounding stands for, at a quarter of the loads.

struct P {
    k: u32,        // values per token row (a multiple of the block)
    nt: u32,       // tokens
    x_stride: u32, // values between token rows of x
    _p0: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<u32>;
@group(0) @binding(2) var<uniform> p: P;

var<workgroup> red: array<f32, 256>;
var<workgroup> idx: array<u32, 256>;
var<workgroup> lvl: array<i32, 256>;

// Writes block `c` (of `n` values, a multiple of 32) of token `t`: the levels each
// invocation left in `lvl`, packed by the first n / 4 invocations, and its scale.
fn store_block(t: u32, c: u32, n: u32, lid: u32, scale: f32, valid: bool) {
    workgroupBarrier();
    if (!valid) { return; }
    if (lid < n / 4u) {
        var word = 0u;
        for (var b = 0u; b < 4u; b++) {
            word |= (u32(lvl[4u * lid + b]) & 0xffu) << (8u * b);
        }
        y[(t * p.k + c * n) / 4u + lid] = word;
    }
    if (lid < n / 32u) {
        y[p.nt * p.k / 4u + (t * p.k + c * n) / 32u + lid] = bitcast<u32>(scale);
    }
}

fn block_of(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}

// IEEE binary16 rounding of a non-negative f32 (nearest, ties to even), as f32.
fn f16_round(v: f32) -> f32 {
    if (v >= 65520.0) {
        return bitcast<f32>(0x7f800000u); // overflows to infinity, as the CPU's f16
    }
    if (v < 6.103515625e-05) {
        // Subnormal halves are multiples of 2^-24; the scaling by powers of two is
        // exact and WGSL's round() rounds ties to even.
        return round(v * 16777216.0) / 16777216.0;
    }
    let b = bitcast<u32>(v);
    let r = (b + 0x0fffu + ((b >> 13u) & 1u)) & 0xffffe000u;
    return bitcast<f32>(r);
}

// Rust's f32::round / C roundf: to nearest, ties away from zero.
fn round_away(v: f32) -> f32 {
    let t = trunc(v);
    if (abs(v - t) >= 0.5) {
        return t + sign(v);
    }
    return t;
}

@compute @workgroup_size(32)
fn q8_0(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let blk = block_of(wid, nwg);
    let per_row = p.k / 32u;
    let valid = blk < per_row * p.nt;
    let t = blk / max(per_row, 1u);
    let c = blk % max(per_row, 1u);
    var v = 0.0;
    if (valid) {
        v = x[t * p.x_stride + c * 32u + lid];
    }
    // The largest magnitude is exact whatever the order of the reduction.
    red[lid] = abs(v);
    workgroupBarrier();
    for (var s = 16u; s > 0u; s >>= 1u) {
        if (lid < s) { red[lid] = max(red[lid], red[lid + s]); }
        workgroupBarrier();
    }
    let d = red[0] / 127.0;
    var id = 0.0;
    if (d != 0.0) { id = 1.0 / d; }
    let q = clamp(round_away(v * id), -128.0, 127.0);
    lvl[lid] = i32(q);
    store_block(t, c, 32u, lid, f16_round(d), valid);
}

@compute @workgroup_size(256)
fn q8_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let blk = block_of(wid, nwg);
    let per_row = p.k / 256u;
    let valid = blk < per_row * p.nt;
    let t = blk / max(per_row, 1u);
    let c = blk % max(per_row, 1u);
    var v = 0.0;
    if (valid) {
        v = x[t * p.x_stride + c * 256u + lid];
    }
    // The signed value of largest magnitude, the first of equal magnitudes as the
    // CPU's sequential scan keeps it: the reduction carries the index to break ties.
    red[lid] = abs(v);
    idx[lid] = lid;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let a = red[lid];
            let b = red[lid + s];
            if (b > a || (b == a && idx[lid + s] < idx[lid])) {
                red[lid] = b;
                idx[lid] = idx[lid + s];
            }
        }
        workgroupBarrier();
    }
    let amax = red[0];
    // An all-zero block is levels 0 at scale 0, which reads back as 0 as before.
    var q = 0.0;
    var scale = 0.0;
    if (amax != 0.0) {
        let mx = x[t * p.x_stride + c * 256u + min(idx[0], 255u)];
        let iscale = -127.0 / mx;
        q = min(round(iscale * v), 127.0);
        scale = 1.0 / iscale;
    }
    lvl[lid] = i32(q);
    store_block(t, c, 256u, lid, scale, valid);
}
