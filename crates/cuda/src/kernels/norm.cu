// RMS norm over rows of d values, one block of 256 threads per row; also the per-head
// q/k norm (rows of hd). The sum of squares is reduced in a fixed order, so every run
// gives the same bits.

extern "C" __global__ void rms_norm_f32(const float* x, const float* w, float* y, u32 d,
                                        float eps, u32 has_w) {
    __shared__ float part[8];
    const float* xr = x + (size_t)blockIdx.x * d;
    float* yr = y + (size_t)blockIdx.x * d;
    float s = 0.0f;
    for (u32 i = threadIdx.x; i < d; i += blockDim.x) s += xr[i] * xr[i];
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    float tot = 0.0f;
    for (int k = 0; k < (int)(blockDim.x >> 5); k++) tot += part[k];
    float scale = rsqrtf(tot / (float)d + eps);
    for (u32 i = threadIdx.x; i < d; i += blockDim.x) {
        float v = xr[i] * scale;
        yr[i] = has_w ? v * w[i] : v;
    }
}
