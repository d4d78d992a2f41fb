// KV store: token row t of k and v lands in row cells[t] of the layer's regions. The
// cells were range checked on the host; KV positions are data, never launch arguments,
// so a captured graph stays valid for every step.

extern "C" __global__ void kv_store_f32(const float* k, const float* v, const i32* cells,
                                        float* kr, float* vr, u32 n_embd, u32 nt) {
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_embd * nt) return;
    u32 t = i / n_embd, j = i % n_embd;
    size_t row = (size_t)cells[t];
    kr[row * n_embd + j] = k[i];
    vr[row * n_embd + j] = v[i];
}
