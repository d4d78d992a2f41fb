// Grouped-query attention over the persistent KV regions, flash style: one block of
// ATTN_THREADS per (head, token); keys [lo, hi) come from the causal bound (0, pos + 1)
// or from the explicit span pair, read on the device (both checked on the host), so the
// launch does not change from step to step. The softmax runs online over chunks of
// ATTN_THREADS keys: each thread scores one key, the chunk max and sum are reduced in a
// fixed order, and each thread accumulates the output dims it owns (hd <= 2 x threads).
// A soft-cap (Gemma 2) bounds each scaled score first.
// Dynamic shared memory: q (hd floats), the chunk's probabilities, 8 reduction slots.

#define ATTN_THREADS 128
#define NEG_BIG -3.0e38f

__device__ __forceinline__ float block_reduce(float v, float* red, bool is_max) {
    v = is_max ? warp_max(v) : warp_sum(v);
    u32 w = threadIdx.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[w] = v;
    __syncthreads();
    float r = red[0];
    for (u32 k = 1; k < ATTN_THREADS / 32; k++) r = is_max ? fmaxf(r, red[k]) : r + red[k];
    return r;
}

extern "C" __global__ void attn_f32(const float* q, const float* kc, const float* vc,
                                    const i32* pos, const i32* span, float* y, u32 n_head,
                                    u32 n_head_kv, u32 hd, u32 n_ctx, u32 q_stride,
                                    float scale, u32 has_span, float softcap,
                                    float inv_cap) {
    extern __shared__ float sm[];
    float* qs = sm;
    float* probs = sm + hd;
    float* red = probs + ATTN_THREADS;
    u32 h = blockIdx.x, t = blockIdx.y, lid = threadIdx.x;
    u32 g = h / (n_head / n_head_kv);
    u32 nkt = n_head_kv * hd;
    u32 lo = 0, hi = (u32)max(pos[t], 0) + 1;
    if (has_span) {
        lo = (u32)max(span[2 * t], 0);
        hi = (u32)max(span[2 * t + 1], 0);
    }
    hi = min(hi, n_ctx);
    const float* qr = q + (size_t)t * q_stride + h * hd;
    for (u32 e = lid; e < hd; e += ATTN_THREADS) qs[e] = qr[e];
    __syncthreads();
    float o0 = 0.0f, o1 = 0.0f, m = NEG_BIG, l = 0.0f;
    for (u32 j0 = lo; j0 < hi; j0 += ATTN_THREADS) {
        u32 j = j0 + lid;
        float s = NEG_BIG;
        if (j < hi) {
            const float* kr = kc + (size_t)j * nkt + g * hd;
            float d = 0.0f;
            for (u32 e = 0; e < hd; e++) d += qs[e] * kr[e];
            s = d * scale;
            // Gemma 2's score cap (0: none), before the softmax, as the CPU applies it.
            if (softcap > 0.0f) s = softcap * tanh_exp(s * inv_cap);
        }
        float m_new = fmaxf(m, block_reduce(s, red, true));
        float p = j < hi ? expf(s - m_new) : 0.0f;
        probs[lid] = p;
        float csum = block_reduce(p, red, false);
        float corr = expf(m - m_new);
        l = l * corr + csum;
        m = m_new;
        u32 n = min((u32)ATTN_THREADS, hi - j0);
        const float* vb = vc + (size_t)j0 * nkt + g * hd;
        float a0 = o0 * corr, a1 = o1 * corr;
        for (u32 jj = 0; jj < n; jj++) {
            float pj = probs[jj];
            if (lid < hd) a0 += pj * vb[(size_t)jj * nkt + lid];
            if (lid + ATTN_THREADS < hd) a1 += pj * vb[(size_t)jj * nkt + lid + ATTN_THREADS];
        }
        o0 = a0;
        o1 = a1;
        __syncthreads();
    }
    float* yr = y + (size_t)t * n_head * hd + h * hd;
    if (lid < hd) yr[lid] = o0 / l;
    if (lid + ATTN_THREADS < hd) yr[lid + ATTN_THREADS] = o1 / l;
}
