// Element-wise kernels, one thread per output value. `b` broadcasts over tokens:
// element i reads b[i % nb].

extern "C" __global__ void add_f32(const float* a, const float* b, float* y, u32 n, u32 nb) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i % nb];
}

extern "C" __global__ void mul_f32(const float* a, const float* b, float* y, u32 n, u32 nb) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] * b[i % nb];
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

extern "C" __global__ void silu_f32(const float* a, float* y, u32 n) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = silu(a[i]);
}

extern "C" __global__ void swiglu_f32(const float* g, const float* u, float* y, u32 n) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = silu(g[i]) * u[i];
}

// The fused FFN's epilogue, in place over rows [gate | up] of 2 nf values: the gate half
// becomes silu(gate) * up; the down matmul reads only that half.
extern "C" __global__ void swiglu_rows_f32(float* y, u32 n, u32 nf) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u32 t = i / nf, c = i % nf;
    float* r = y + (size_t)t * 2 * nf;
    r[c] = silu(r[c]) * r[nf + c];
}

// Row gather: y[r] = x[sel[r]] over rows of d values (indices checked on the host).
extern "C" __global__ void gather_f32(const float* x, const i32* sel, float* y, u32 d, u32 rows) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d * rows) return;
    u32 r = i / d, c = i % d;
    y[i] = x[(size_t)sel[r] * d + c];
}

// y = a * s (the embedding scale).
extern "C" __global__ void scale_f32(const float* a, float* y, u32 n, float s) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] * s;
}

// x times the sigmoid of its row's gate (one gate per row of d values; Qwen2-MoE's
// shared expert), the sigmoid rounded once as the CPU rounds it: 1 / (1 + e^-g).
extern "C" __global__ void mul_sigmoid_f32(const float* x, const float* g, float* y, u32 n,
                                           u32 d) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * (1.0f / (1.0f + expf(-g[i / d])));
}
