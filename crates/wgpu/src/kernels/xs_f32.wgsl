// The matmul's activations beside float weights: f32 token rows at `p.x_stride`.
@group(0) @binding(1) var<storage, read> x: array<f32>;

fn x_base(tok: u32) -> u32 {
    return tok * p.x_stride;
}

// Float activations carry no scale.
fn x_scale(tok: u32, c: u32) -> f32 {
    return 1.0;
}

// Values e..e + 4 of the token row at `base`.
fn x_group(base: u32, sc: f32, e: u32) -> vec4<f32> {
    return vec4<f32>(x[base + e], x[base + e + 1u], x[base + e + 2u], x[base + e + 3u]);
}
