// Activation quantizers for the int8 matmul, byte for byte the CPU's (ggml's reference):
// Q8_0 per 32 values (d = amax / 127, q = roundf(x / d), ties away from zero, d kept in
// f16 as the block stores it) and Q8_K per 256 (iscale = -127 / max for the signed value
// of largest magnitude, ties to even, d = 1 / iscale). Output: q as i8 [nt][in_dim] and
// one f32 scale per group, [nt][in_dim / group]. One warp per (group, token).

extern "C" __global__ void quant_q8_0_f32(const float* x, i8* q, float* d, u32 in_dim,
                                          u32 x_stride) {
    u32 g = blockIdx.x, t = blockIdx.y, lane = threadIdx.x;
    float v = x[(size_t)t * x_stride + 32 * g + lane];
    float amax = warp_max(fabsf(v));
    float dd = amax / 127.0f;
    float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    q[(size_t)t * in_dim + 32 * g + lane] = (i8)roundf(v * id);
    if (lane == 0) d[(size_t)t * (in_dim / 32) + g] = h2f(f2h(dd));
}

extern "C" __global__ void quant_q8_k_f32(const float* x, i8* q, float* d, u32 in_dim,
                                          u32 x_stride) {
    u32 g = blockIdx.x, t = blockIdx.y, lane = threadIdx.x;
    const float* xs = x + (size_t)t * x_stride + 256 * g;
    // The first value (in index order) of largest magnitude, as the reference scan finds.
    float amax = 0.0f;
    int at = 256;
    for (int k = 0; k < 8; k++) {
        int idx = lane + 32 * k;
        float ax = fabsf(xs[idx]);
        if (ax > amax) { amax = ax; at = idx; }
    }
    float wmax = warp_max(amax);
    int cand = (amax == wmax && amax > 0.0f) ? at : 256;
    for (int o = 16; o > 0; o >>= 1) cand = min(cand, __shfl_xor_sync(0xffffffffu, cand, o));
    i8* qs = q + (size_t)t * in_dim + 256 * g;
    if (wmax == 0.0f || cand >= 256) {
        for (int k = 0; k < 8; k++) qs[lane + 32 * k] = 0;
        if (lane == 0) d[(size_t)t * (in_dim / 32) + g] = 0.0f;
        return;
    }
    float mx = xs[cand];
    float iscale = -127.0f / mx;
    for (int k = 0; k < 8; k++) {
        int idx = lane + 32 * k;
        qs[idx] = (i8)min(127, __float2int_rn(iscale * xs[idx]));
    }
    if (lane == 0) d[(size_t)t * (in_dim / 32) + g] = 1.0f / iscale;
}
