// The matmul's activations beside quantized weights: the levels and scales quant_act.wgsl
// packs (token rows of `p.x_stride` = k values, dense), read back as f32(level) * scale.
@group(0) @binding(1) var<storage, read> x: array<u32>;

fn x_base(tok: u32) -> u32 {
    return tok * (p.x_stride / 4u);
}

// The scale of values 32c..32c + 32 of token `tok`.
fn x_scale(tok: u32, c: u32) -> f32 {
    return bitcast<f32>(x[p.nt * p.x_stride / 4u + tok * (p.x_stride / 32u) + c]);
}

// Values e..e + 4 (e a multiple of 4) of the token row at `base`, at scale `sc`.
fn x_group(base: u32, sc: f32, e: u32) -> vec4<f32> {
    let q = x[base + e / 4u];
    return vec4<f32>(f32(i8_of(q & 0xffu)), f32(i8_of((q >> 8u) & 0xffu)),
                     f32(i8_of((q >> 16u) & 0xffu)), f32(i8_of(q >> 24u))) * sc;
}
