// Grouped-query attention over the persistent KV regions, one workgroup per (head,
// token). Keys [lo, hi) come from the causal bound (0, pos + 1) or from the explicit
// span pair; both were checked on the host. A sliding window keeps the last `window`;
// a soft-cap bounds each scaled score. The softmax runs online over chunks of
// 64 keys: each thread scores one key of the chunk, the chunk max and sum meet in
// workgroup memory, and each thread accumulates the output dims it owns.

const WG: u32 = 64u;
const NEG: f32 = -3.0e38;

struct P {
    n_head: u32,
    n_head_kv: u32,
    hd: u32,
    n_ctx: u32,
    q_stride: u32,
    nt: u32,
    scale: f32,
    has_span: u32,
    // Sliding window in rows (0: none).
    window: u32,
    // Score soft-cap c (0: none) and 1 / c: each scaled score s becomes c tanh(s / c),
    // before the softmax (Gemma 2); then padding to 16 bytes.
    softcap: f32,
    inv_cap: f32,
    pad2: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<f32>;
@group(0) @binding(2) var<storage, read> vc: array<f32>;
@group(0) @binding(3) var<storage, read> pos: array<i32>;
@group(0) @binding(4) var<storage, read> span: array<i32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
@group(0) @binding(6) var<uniform> p: P;

var<workgroup> probs: array<f32, 64>;
var<workgroup> red: array<f32, 64>;
var<workgroup> bounds: vec2<u32>;

@compute @workgroup_size(64)
fn attn(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let group = p.n_head / p.n_head_kv;
    let g = h / group;
    let nkt = p.n_head_kv * p.hd;
    if (lid == 0u) {
        var lo = 0u;
        var hi = u32(max(pos[t], 0)) + 1u;
        if (p.has_span == 1u) {
            lo = u32(max(span[2u * t], 0));
            hi = u32(max(span[2u * t + 1u], 0));
        }
        hi = min(hi, p.n_ctx);
        // A sliding-window layer reads only the last `window` rows of the range.
        if (p.window > 0u && hi > lo + p.window) {
            lo = hi - p.window;
        }
        bounds = vec2<u32>(lo, hi);
    }
    let b = workgroupUniformLoad(&bounds);
    let lo = b.x;
    let hi = b.y;
    let qb = t * p.q_stride + h * p.hd;
    var o: array<f32, 4>; // dims lid + 64 r, r < hd / 64 rounded up
    for (var r = 0u; r < 4u; r++) { o[r] = 0.0; }
    var m = NEG;
    var l = 0.0;
    for (var j0 = lo; j0 < hi; j0 += WG) {
        let j = j0 + lid;
        var s = NEG;
        if (j < hi) {
            let kb = j * nkt + g * p.hd;
            var d = 0.0;
            for (var e = 0u; e < p.hd; e++) { d += q[qb + e] * kc[kb + e]; }
            s = d * p.scale;
            if (p.softcap > 0.0) {
                // tanh through the exponential, as the CPU computes it, clamped below
                // overflow where tanh is already -1.
                let e = exp(min(-2.0 * (s * p.inv_cap), 88.0));
                s = p.softcap * (2.0 / (1.0 + e) - 1.0);
            }
        }
        red[lid] = s;
        workgroupBarrier();
        for (var k = WG / 2u; k > 0u; k >>= 1u) {
            if (lid < k) { red[lid] = max(red[lid], red[lid + k]); }
            workgroupBarrier();
        }
        let m_new = max(m, red[0]);
        workgroupBarrier();
        let pj = select(0.0, exp(s - m_new), j < hi);
        probs[lid] = pj;
        red[lid] = pj;
        workgroupBarrier();
        for (var k = WG / 2u; k > 0u; k >>= 1u) {
            if (lid < k) { red[lid] += red[lid + k]; }
            workgroupBarrier();
        }
        let corr = exp(m - m_new);
        l = l * corr + red[0];
        m = m_new;
        let n = min(WG, hi - j0);
        for (var r = 0u; r < 4u; r++) {
            let dim = lid + r * WG;
            if (dim < p.hd) {
                var acc = o[r] * corr;
                for (var jj = 0u; jj < n; jj++) {
                    acc += probs[jj] * vc[(j0 + jj) * nkt + g * p.hd + dim];
                }
                o[r] = acc;
            }
        }
        workgroupBarrier();
    }
    let ob = t * p.n_head * p.hd + h * p.hd;
    for (var r = 0u; r < 4u; r++) {
        let dim = lid + r * WG;
        if (dim < p.hd) { y[ob + dim] = o[r] / l; }
    }
}
