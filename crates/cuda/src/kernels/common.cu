// Shared definitions of every kernel module: fixed-width types, f16 conversions through
// PTX (NVRTC has no toolkit headers to include), warp reductions, and the GGUF block
// decoders. A "sub-block" is 32 consecutive values of a row; every weight type decodes
// one sub-block at a time, so the mat-vec kernels share one loop for all types.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Blocks of 34, 22, 18 and 210 bytes leave 16-bit fields only 2-byte aligned.
__device__ __forceinline__ u16 ld16(const u8* p) { return (u16)p[0] | ((u16)p[1] << 8); }

__device__ __forceinline__ u32 ld32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ i32 dp4a(i32 a, i32 b, i32 c) {
    i32 r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

__device__ __forceinline__ i32 pack4(i32 a, i32 b, i32 c, i32 d) {
    return (i32)((u32)(a & 0xff) | ((u32)(b & 0xff) << 8) | ((u32)(c & 0xff) << 16) |
                 ((u32)(d & 0xff) << 24));
}

// ---- f32 decoders: out[0..32] = values 32 s .. 32 s + 32 of the row -------------------

__device__ __forceinline__ void dq32_f32(const u8* row, int s, float* out) {
    const float* r = (const float*)row + 32 * s;
    for (int l = 0; l < 32; l++) out[l] = r[l];
}

__device__ __forceinline__ void dq32_f16(const u8* row, int s, float* out) {
    const u16* r = (const u16*)row + 32 * s;
    for (int l = 0; l < 32; l++) out[l] = h2f(r[l]);
}

// Q8_0: f16 d, 32 x i8.
__device__ __forceinline__ void dq32_q8_0(const u8* row, int s, float* out) {
    const u8* b = row + 34 * s;
    float d = h2f(ld16(b));
    const i8* q = (const i8*)(b + 2);
    for (int l = 0; l < 32; l++) out[l] = d * (float)q[l];
}

// Q5_0: f16 d, 32 high bits, 16 bytes of nibble pairs (value j low, j + 16 high).
__device__ __forceinline__ void dq32_q5_0(const u8* row, int s, float* out) {
    const u8* b = row + 22 * s;
    float d = h2f(ld16(b));
    u32 qh = ld32(b + 2);
    const u8* qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int x0 = (qs[j] & 0x0f) | (((qh >> j) << 4) & 0x10);
        int x1 = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
        out[j] = d * (float)(x0 - 16);
        out[j + 16] = d * (float)(x1 - 16);
    }
}

// The 6-bit scale and min of sub-block j of a Q4_K block (ggml's get_scale_min_k4).
__device__ __forceinline__ void q4k_scale_min(const u8* sc, int j, int* s, int* m) {
    if (j < 4) {
        *s = sc[j] & 63;
        *m = sc[j + 4] & 63;
    } else {
        *s = (sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4);
        *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

// Q4_K: 256 values per 144-byte block: f16 d, f16 dmin, 12 scale bytes, 128 nibble bytes.
// Sub-block j uses the low (even j) or high (odd j) nibbles of bytes 32 (j / 2) ...
__device__ __forceinline__ void dq32_q4_k(const u8* row, int s, float* out) {
    const u8* b = row + 144 * (s >> 3);
    int j = s & 7;
    float d = h2f(ld16(b));
    float dmin = h2f(ld16(b + 2));
    int sc, m;
    q4k_scale_min(b + 4, j, &sc, &m);
    float d1 = d * (float)sc;
    float m1 = dmin * (float)m;
    const u8* q = b + 16 + 32 * (j >> 1);
    int shift = (j & 1) * 4;
    for (int l = 0; l < 32; l++) out[l] = d1 * (float)((q[l] >> shift) & 0x0f) - m1;
}

// Q6_K: 256 values per 210-byte block: 128 bytes low nibbles, 64 bytes of 2-bit highs,
// 16 i8 scales (one per 16 values), f16 d. Sub-block j is quarter j % 4 of half j / 4.
__device__ __forceinline__ void dq32_q6_k(const u8* row, int s, float* out) {
    const u8* b = row + 210 * (s >> 3);
    int j = s & 7;
    int n = j >> 2, r = j & 3;
    const u8* ql = b + 64 * n + ((r & 1) ? 32 : 0);
    const u8* qh = b + 128 + 32 * n;
    const i8* sc = (const i8*)(b + 192) + 8 * n + 2 * r;
    float d = h2f(ld16(b + 208));
    int lshift = (r >> 1) * 4;
    int hshift = 2 * r;
    for (int l = 0; l < 32; l++) {
        int q = ((ql[l] >> lshift) & 0x0f) | (((qh[l] >> hshift) & 3) << 4);
        out[l] = d * (float)sc[l >> 4] * (float)(q - 32);
    }
}

// The 16 signed levels IQ4_NL and IQ4_XS indices select (ggml's kvalues_iq4nl; checked
// against the CPU's table by the kernel module's tests).
__constant__ i8 IQ4_LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};

// 32 values at scale d from 16 bytes of level indices: value j the low nibble of qs[j],
// value j + 16 its high nibble.
__device__ __forceinline__ void iq4_32(float d, const u8* qs, float* out) {
    for (int j = 0; j < 16; j++) {
        out[j] = d * (float)IQ4_LEVELS[qs[j] & 0x0f];
        out[j + 16] = d * (float)IQ4_LEVELS[qs[j] >> 4];
    }
}

// The scale d * (ls - 32) of sub-block j of the IQ4_XS block at b: ls is nibble j % 2 of
// scales_l[j / 2] (byte 4 on) with bits 2j..2j + 2 of scales_h (byte 2) above it.
__device__ __forceinline__ float iq4_xs_scale(const u8* b, int j) {
    int lo = (b[4 + (j >> 1)] >> (4 * (j & 1))) & 0x0f;
    int hi = (ld16(b + 2) >> (2 * j)) & 3;
    return h2f(ld16(b)) * (float)((lo | (hi << 4)) - 32);
}

// IQ4_NL: 32 values per 18-byte block: f16 d, 16 bytes of level indices.
__device__ __forceinline__ void dq32_iq4_nl(const u8* row, int s, float* out) {
    const u8* b = row + 18 * s;
    iq4_32(h2f(ld16(b)), b + 2, out);
}

// IQ4_XS: 256 values per 136-byte block: f16 d, u16 scales_h, 4 bytes scales_l, 128 bytes
// of level indices, sub-block j's 16 at 8 + 16 j packed as IQ4_NL's.
__device__ __forceinline__ void dq32_iq4_xs(const u8* row, int s, float* out) {
    const u8* b = row + 136 * (s >> 3);
    int j = s & 7;
    iq4_32(iq4_xs_scale(b, j), b + 8 + 16 * j, out);
}

// ---- int8 decoders for the dp4a kernels ------------------------------------------------
// value l of sub-block s = scale[l / 16] * q[l] - minterm, with q packed four per word.

__device__ __forceinline__ void iq32_q8_0(const u8* row, int s, i32* q, float* scale,
                                          float* minterm) {
    const u8* b = row + 34 * s;
    float d = h2f(ld16(b));
    const u8* qs = b + 2;
    for (int w = 0; w < 8; w++) q[w] = (i32)ld32(qs + 4 * w);
    scale[0] = d;
    scale[1] = d;
    *minterm = 0.0f;
}

__device__ __forceinline__ void iq32_q5_0(const u8* row, int s, i32* q, float* scale,
                                          float* minterm) {
    const u8* b = row + 22 * s;
    float d = h2f(ld16(b));
    u32 qh = ld32(b + 2);
    const u8* qs = b + 6;
    for (int w = 0; w < 4; w++) {
        int v[4], u[4];
        for (int k = 0; k < 4; k++) {
            int j = 4 * w + k;
            v[k] = ((qs[j] & 0x0f) | (((qh >> j) << 4) & 0x10)) - 16;
            u[k] = ((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
        }
        q[w] = pack4(v[0], v[1], v[2], v[3]);
        q[w + 4] = pack4(u[0], u[1], u[2], u[3]);
    }
    scale[0] = d;
    scale[1] = d;
    *minterm = 0.0f;
}

__device__ __forceinline__ void iq32_q4_k(const u8* row, int s, i32* q, float* scale,
                                          float* minterm) {
    const u8* b = row + 144 * (s >> 3);
    int j = s & 7;
    float d = h2f(ld16(b));
    float dmin = h2f(ld16(b + 2));
    int sc, m;
    q4k_scale_min(b + 4, j, &sc, &m);
    const u8* qs = b + 16 + 32 * (j >> 1);
    int shift = (j & 1) * 4;
    for (int w = 0; w < 8; w++) {
        u32 x = ld32(qs + 4 * w);
        q[w] = (i32)((x >> shift) & 0x0f0f0f0fu);
    }
    scale[0] = d * (float)sc;
    scale[1] = scale[0];
    *minterm = dmin * (float)m;
}

__device__ __forceinline__ void iq32_q6_k(const u8* row, int s, i32* q, float* scale,
                                          float* minterm) {
    const u8* b = row + 210 * (s >> 3);
    int j = s & 7;
    int n = j >> 2, r = j & 3;
    const u8* ql = b + 64 * n + ((r & 1) ? 32 : 0);
    const u8* qh = b + 128 + 32 * n;
    const i8* sc = (const i8*)(b + 192) + 8 * n + 2 * r;
    float d = h2f(ld16(b + 208));
    int lshift = (r >> 1) * 4;
    int hshift = 2 * r;
    for (int w = 0; w < 8; w++) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            int l = 4 * w + k;
            v[k] = (((ql[l] >> lshift) & 0x0f) | (((qh[l] >> hshift) & 3) << 4)) - 32;
        }
        q[w] = pack4(v[0], v[1], v[2], v[3]);
    }
    scale[0] = d * (float)sc[0];
    scale[1] = d * (float)sc[1];
    *minterm = 0.0f;
}

// The levels of 16 bytes of IQ4 indices, four per word: words 0-3 the low nibbles
// (values 0..16), words 4-7 the high ones (values 16..32).
__device__ __forceinline__ void iq4_levels_i8(const u8* qs, i32* q) {
    for (int w = 0; w < 4; w++) {
        u32 x = ld32(qs + 4 * w);
        q[w] = pack4(IQ4_LEVELS[x & 0x0f], IQ4_LEVELS[(x >> 8) & 0x0f],
                     IQ4_LEVELS[(x >> 16) & 0x0f], IQ4_LEVELS[(x >> 24) & 0x0f]);
        q[w + 4] = pack4(IQ4_LEVELS[(x >> 4) & 0x0f], IQ4_LEVELS[(x >> 12) & 0x0f],
                         IQ4_LEVELS[(x >> 20) & 0x0f], IQ4_LEVELS[x >> 28]);
    }
}

__device__ __forceinline__ void iq32_iq4_nl(const u8* row, int s, i32* q, float* scale,
                                            float* minterm) {
    const u8* b = row + 18 * s;
    iq4_levels_i8(b + 2, q);
    scale[0] = h2f(ld16(b));
    scale[1] = scale[0];
    *minterm = 0.0f;
}

__device__ __forceinline__ void iq32_iq4_xs(const u8* row, int s, i32* q, float* scale,
                                            float* minterm) {
    const u8* b = row + 136 * (s >> 3);
    int j = s & 7;
    iq4_levels_i8(b + 8 + 16 * j, q);
    scale[0] = iq4_xs_scale(b, j);
    scale[1] = scale[0];
    *minterm = 0.0f;
}
