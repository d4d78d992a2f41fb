// Int8 (dp4a) matrix product for prefill: the weight's sub-blocks decoded to int8 once
// per pass and dotted with activations quantized by quant.cu (Q8_0 groups of 32 for
// Q8_0/Q5_0/IQ4_NL weights, Q8_K groups of 256 for Q4_K/Q6_K/IQ4_XS), MQ_TOKENS tokens
// per pass.
// One warp per row, four rows per block of 128 threads, fixed-order warp sums.
// `group` is the activation group (32 or 256); scales sit at [t][in_dim / 32] stride.

#define MQ_TOKENS 8

#define MMQ(NAME, IQ)                                                                     \
    extern "C" __global__ void NAME(const u8* w, const i8* qx, const float* dx,           \
                                    const float* bias, float* y, u32 in_dim, u32 out_dim, \
                                    u32 nt, u32 row_bytes, u32 y_stride, u32 y_off,       \
                                    u32 has_bias, u32 group) {                            \
        u32 r = blockIdx.x * 4 + (threadIdx.x >> 5);                                      \
        u32 lane = threadIdx.x & 31;                                                      \
        u32 t0 = blockIdx.y * MQ_TOKENS;                                                  \
        if (r >= out_dim) return;                                                         \
        u32 nts = min((u32)MQ_TOKENS, nt - t0);                                           \
        const u8* row = w + (size_t)r * row_bytes;                                        \
        u32 ngs = in_dim / 32;                                                            \
        float acc[MQ_TOKENS];                                                             \
        for (int t = 0; t < MQ_TOKENS; t++) acc[t] = 0.0f;                                \
        i32 q[8];                                                                         \
        float sc[2], mt;                                                                  \
        for (u32 s = lane; s < ngs; s += 32) {                                            \
            IQ(row, s, q, sc, &mt);                                                       \
            for (u32 t = 0; t < nts; t++) {                                               \
                const i32* xs = (const i32*)(qx + (size_t)(t0 + t) * in_dim + 32 * s);    \
                i32 s0 = 0, s1 = 0, sq = 0;                                               \
                for (int k = 0; k < 4; k++) s0 = dp4a(q[k], xs[k], s0);                   \
                for (int k = 4; k < 8; k++) s1 = dp4a(q[k], xs[k], s1);                   \
                float ds = dx[(size_t)(t0 + t) * ngs + (32 * s) / group];                 \
                float a = ds * (sc[0] * (float)s0 + sc[1] * (float)s1);                   \
                if (mt != 0.0f) {                                                         \
                    for (int k = 0; k < 8; k++) sq = dp4a(0x01010101, xs[k], sq);         \
                    a -= mt * ds * (float)sq;                                             \
                }                                                                         \
                acc[t] += a;                                                              \
            }                                                                             \
        }                                                                                 \
        for (u32 t = 0; t < nts; t++) {                                                   \
            float sum = warp_sum(acc[t]);                                                 \
            if (lane == 0) {                                                              \
                if (has_bias) sum += bias[r];                                             \
                y[(size_t)(t0 + t) * y_stride + y_off + r] = sum;                         \
            }                                                                             \
        }                                                                                 \
    }

MMQ(mmq_q8_0, iq32_q8_0)
MMQ(mmq_q5_0, iq32_q5_0)
MMQ(mmq_q4_k, iq32_q4_k)
MMQ(mmq_q6_k, iq32_q6_k)
MMQ(mmq_iq4_nl, iq32_iq4_nl)
MMQ(mmq_iq4_xs, iq32_iq4_xs)
