// Shared by the matmul and embedding kernels: the weight bytes exactly as the GGUF file
// stores them, padded to whole words, plus byte and half-float readers. Every block
// layout below is dequantized from these bytes inside the shader; nothing is
// converted on the host.

@group(0) @binding(0) var<storage, read> w: array<u32>;

// One 32-value chunk of a weight row, filled by `load_chunk` of the type's file.
var<private> v: array<f32, 32>;

fn byte_at(off: u32) -> u32 {
    return (w[off >> 2u] >> ((off & 3u) * 8u)) & 0xffu;
}

// A little-endian u16 at an even byte offset.
fn u16_at(off: u32) -> u32 {
    return (w[off >> 2u] >> ((off & 2u) * 8u)) & 0xffffu;
}

fn f16_at(off: u32) -> f32 {
    return unpack2x16float(u16_at(off)).x;
}

// Four bytes starting at any byte offset, little-endian (two word loads at most).
fn word_at(off: u32) -> u32 {
    let i = off >> 2u;
    let sh = (off & 3u) * 8u;
    if (sh == 0u) { return w[i]; }
    return (w[i] >> sh) | (w[i + 1u] << (32u - sh));
}

// Sign-extends a byte.
fn i8_of(b: u32) -> i32 {
    return i32(b << 24u) >> 24u;
}
