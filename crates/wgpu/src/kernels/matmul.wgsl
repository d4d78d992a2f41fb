// y[t, r] = dot(W[r, :], x[t, :]) (+ bias[r]) for the rows row0..row0+rows held by one
// weight buffer (a weight larger than the adapter's largest binding is split by rows
// into several buffers, one dispatch each).
//
// One workgroup per 16 weight rows and per tile of TT tokens (1, 4 or 8): 4 row groups
// of LANES threads, each thread holding a register tile of 4 rows by TT tokens (NV
// vec4s of tokens a row). A thread takes the 32-value chunks lane, lane + LANES, ...
// of its rows; per chunk it decodes each row's values four at a time (`chunk_at` and
// `group` of the type's file) and applies each to the TT tokens, so a decoded weight
// serves TT tokens and a loaded activation 4 rows, with no per-thread arrays (which
// some drivers, CPU emulations among them, keep in memory). The lanes' partial sums
// then meet in workgroup memory. The lines at the {{...}} markers are written out per
// tile width by kernels/matmul.rs.
//
// Each output is summed in one fixed order: the products of a chunk's 32 values in
// order (a multiply, then an add), the chunk sums of a lane in order, then the lanes
// in a fixed tree. The order depends on neither the tile width nor the number of
// tokens nor a token's place in the tile, so a token's row is bitwise the same
// whatever other tokens share the dispatch (a batched request matches the same
// request alone; decode is the nt = 1 case of the narrow tile).

const WG: u32 = 64u;
const LANES: u32 = 16u;
// Row groups per workgroup (WG / LANES), each of 4 rows.
const GROUPS: u32 = 4u;
const TT: u32 = {{TT}}u;
const NV: u32 = {{NV}}u;

// One chunk's decoding state, filled by the weight type's `chunk_at` (each file says
// what its fields hold).
struct Chunk {
    o: u32,
    o2: u32,
    e: u32,
    e2: u32,
    a: f32,
    b: f32,
}

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

// Binding 1, the activations, is declared by the input's file (xs_*.wgsl).
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: P;

// Per thread, 4 rows of NV vec4s of tokens.
var<workgroup> part: array<vec4<f32>, {{PART}}>; // 4 * NV * WG

@compute @workgroup_size(64)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let lane = lid % LANES;
    let g = lid / LANES;
    let row0 = ((wid.y * nwg.x + wid.x) * GROUPS + g) * 4u;
    let t0 = wid.z * TT;
    let tn = min(TT, p.nt - t0);
    // Rows past the buffer's and tokens past the dispatch's repeat the last one (valid
    // memory); their sums are never written.
    let last = p.rows - 1u;
    let r0 = min(row0, last);
    let r1 = min(row0 + 1u, last);
    let r2 = min(row0 + 2u, last);
    let r3 = min(row0 + 3u, last);
    // {{SETUP}}: token j's row tk{j} and its activations' base b{j}; accumulators
    // a{r}_{v} (row r, tokens 4v..4v + 4).
{{SETUP}}
    let chunks = (p.k + 31u) / 32u;
    for (var c = lane; c < chunks; c += LANES) {
        let m0 = chunk_at(r0, c);
        let m1 = chunk_at(r1, c);
        let m2 = chunk_at(r2, c);
        let m3 = chunk_at(r3, c);
        // {{SCALES}}: token j's activation scale sc{j} for this chunk, and the
        // chunk's sums s{r}_{v}, zero.
{{SCALES}}
        for (var q = 0u; q < 8u; q++) {
            // Past `p.k` (an f32/f16 row tail) the weight is zero, and a read past the
            // end of x is clamped into the buffer by the bounds checks.
            let e = c * 32u + 4u * q;
            let w0 = group(m0, q);
            let w1 = group(m1, q);
            let w2 = group(m2, q);
            let w3 = group(m3, q);
            // {{PRODUCTS}}: token j's four values x{j}, then for each of the four in order
            // s{r}_{v} += weight * the tokens' value.
{{PRODUCTS}}
        }
        // {{SUMS}}: a{r}_{v} += s{r}_{v}.
{{SUMS}}
    }
    // {{PARTS}}: part[(r * NV + v) * WG + lid] = a{r}_{v}.
{{PARTS}}
    workgroupBarrier();
    for (var k = LANES / 2u; k > 0u; k >>= 1u) {
        if (lane < k) {
            for (var j = 0u; j < 4u * NV; j++) { part[j * WG + lid] += part[j * WG + lid + k]; }
        }
        workgroupBarrier();
    }
    for (var j = lane; j < 4u * TT; j += LANES) {
        let r = j / TT;
        let t = j % TT;
        let row = row0 + r;
        if (t < tn && row < p.rows) {
            var v = part[(r * NV + t / 4u) * WG + lid - lane][t % 4u];
            if (p.has_bias == 1u) { v += bias[p.row0 + row]; }
            y[(t0 + t) * p.y_stride + p.y_off + p.row0 + row] = v;
        }
    }
}
