// Rotary embedding in place (the host copies the input into the output first), one
// thread per rotated pair. The angle of pair i is pos * theta_scale^i built by repeated
// multiplication, the running product the CPU kernel uses, so both round alike.
// interleaved: pairs (2i, 2i + 1) (Llama); else (i, i + n_dims / 2) (NEOX, Qwen).

extern "C" __global__ void rope_f32(const i32* pos, float* y, u32 nt, u32 n_head, u32 hd,
                                    u32 n_dims, u32 stride, u32 interleaved, float freq_scale,
                                    float theta_scale) {
    u32 half = n_dims / 2;
    u32 idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= nt * n_head * half) return;
    u32 i = idx % half;
    u32 h = (idx / half) % n_head;
    u32 t = idx / (half * n_head);
    float theta = (float)pos[t];
    for (u32 k = 0; k < i; k++) theta *= theta_scale;
    float a = freq_scale * theta;
    float c = cosf(a), s = sinf(a);
    size_t base = (size_t)t * stride + h * hd;
    size_t i0 = base + i, i1 = base + i + half;
    if (interleaved) {
        i0 = base + 2 * i;
        i1 = i0 + 1;
    }
    float x0 = y[i0], x1 = y[i1];
    y[i0] = x0 * c - x1 * s;
    y[i1] = x0 * s + x1 * c;
}
