// The tanh-form activations of Gemma's graphs, one thread per output value, in the CPU's
// forms (cpu/src/ops/act.rs): GELU as x / (1 + e^(-2u)) with u = sqrt(2/pi) x (1 +
// 0.044715 x^2) (no 1 + tanh cancellation in the negative tail), GeGLU as gelu(gate) *
// up, and the soft-cap as c tanh(x / c) with tanh(v) = 2 / (1 + e^(-2v)) - 1. The
// exponential's argument is clamped below f32's overflow, where both forms have already
// reached their limit. `tanh_exp` is shared with the attention kernel's score cap.

// 2 sqrt(2/pi): the f32 of sqrt(2/pi), doubled (exact), as the CPU holds it.
#define GELU_2C 1.5957691216057308f
#define GELU_A 0.044715f
#define EXP_ARG_MAX 88.0f

__device__ __forceinline__ float gelu(float x) {
    float q = GELU_A * (x * x) + 1.0f;
    return x / (1.0f + expf(fminf(-((GELU_2C * x) * q), EXP_ARG_MAX)));
}

__device__ __forceinline__ float tanh_exp(float v) {
    return 2.0f / (1.0f + expf(fminf(-2.0f * v, EXP_ARG_MAX))) - 1.0f;
}

extern "C" __global__ void gelu_f32(const float* a, float* y, u32 n) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = gelu(a[i]);
}

extern "C" __global__ void geglu_f32(const float* g, const float* u, float* y, u32 n) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = gelu(g[i]) * u[i];
}

// c tanh(x inv_c), inv_c = 1 / c rounded once on the host as the CPU rounds it.
extern "C" __global__ void softcap_f32(const float* a, float* y, u32 n, float c, float inv_c) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = c * tanh_exp(a[i] * inv_c);
}
