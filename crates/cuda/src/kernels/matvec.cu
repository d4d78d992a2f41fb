// Quantized matrix-vector products for decode (and the f32/f16 matmul at any width):
// one warp per weight row, four rows per block of 128 threads, up to MV_TOKENS tokens
// per pass so each decoded sub-block is reused for all of them. Lanes stride over the
// row's 32-value sub-blocks, dequantizing from the GGUF layout in registers; the warp
// sum is reduced in a fixed order. y[t * y_stride + y_off + r] = W[r] . x[t] (+ b[r]).

#define MV_TOKENS 8

#define MATVEC(NAME, DQ)                                                                  \
    extern "C" __global__ void NAME(const u8* w, const float* x, const float* bias,       \
                                    float* y, u32 in_dim, u32 out_dim, u32 nt,            \
                                    u32 row_bytes, u32 x_stride, u32 y_stride, u32 y_off, \
                                    u32 has_bias) {                                       \
        u32 r = blockIdx.x * 4 + (threadIdx.x >> 5);                                      \
        u32 lane = threadIdx.x & 31;                                                      \
        u32 t0 = blockIdx.y * MV_TOKENS;                                                  \
        if (r >= out_dim) return;                                                         \
        u32 nts = min((u32)MV_TOKENS, nt - t0);                                           \
        const u8* row = w + (size_t)r * row_bytes;                                        \
        float acc[MV_TOKENS];                                                             \
        for (int t = 0; t < MV_TOKENS; t++) acc[t] = 0.0f;                                \
        float v[32];                                                                      \
        for (u32 s = lane; s < in_dim / 32; s += 32) {                                    \
            DQ(row, s, v);                                                                \
            for (u32 t = 0; t < nts; t++) {                                               \
                const float* xs = x + (size_t)(t0 + t) * x_stride + 32 * s;               \
                float a = 0.0f;                                                           \
                for (int l = 0; l < 32; l++) a += v[l] * xs[l];                           \
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

MATVEC(matvec_f32, dq32_f32)
MATVEC(matvec_f16, dq32_f16)
MATVEC(matvec_q8_0, dq32_q8_0)
MATVEC(matvec_q5_0, dq32_q5_0)
MATVEC(matvec_q4_k, dq32_q4_k)
MATVEC(matvec_q6_k, dq32_q6_k)
MATVEC(matvec_iq4_nl, dq32_iq4_nl)
MATVEC(matvec_iq4_xs, dq32_iq4_xs)
