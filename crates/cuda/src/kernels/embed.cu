// Token embedding: row ids[t] of a table in its GGUF layout, dequantized; one block per
// token, each thread decoding whole sub-blocks of 32 values. Ids were range checked on
// the host.

#define EMBED(NAME, DQ)                                                                   \
    extern "C" __global__ void NAME(const u8* table, const i32* ids, float* y, u32 d,     \
                                    u32 row_bytes) {                                      \
        const u8* row = table + (size_t)ids[blockIdx.x] * row_bytes;                      \
        float* yr = y + (size_t)blockIdx.x * d;                                           \
        float v[32];                                                                      \
        for (u32 s = threadIdx.x; s < d / 32; s += blockDim.x) {                          \
            DQ(row, s, v);                                                                \
            for (int l = 0; l < 32; l++) yr[32 * s + l] = v[l];                           \
        }                                                                                 \
    }

EMBED(embed_f32, dq32_f32)
EMBED(embed_f16, dq32_f16)
EMBED(embed_q8_0, dq32_q8_0)
EMBED(embed_q5_0, dq32_q5_0)
EMBED(embed_q4_k, dq32_q4_k)
EMBED(embed_q6_k, dq32_q6_k)
EMBED(embed_iq4_nl, dq32_iq4_nl)
EMBED(embed_iq4_xs, dq32_iq4_xs)
