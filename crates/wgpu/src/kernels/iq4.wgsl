// Shared by the IQ4_NL and IQ4_XS kernels: the 16 levels both index, as signed bytes
// packed four to a word (written out from the CPU's table by kernels/mod.rs), and an
// IQ4_XS sub-block's scale.
const IQ4_LEVELS: vec4<u32> = vec4<u32>({{IQ4_LEVELS}});

// Level `q` (0..16) of the table.
fn iq4_level(q: u32) -> f32 {
    let t = IQ4_LEVELS;
    return f32(i8_of((t[q >> 2u] >> (8u * (q & 3u))) & 0xffu));
}

// The scale d * (ls - 32) of sub-block s of the IQ4_XS super-block at byte `off`: ls is
// nibble s % 2 of scales_l[s / 2] (byte 4 on) with bits 2s..2s + 2 of scales_h (byte 2)
// above it.
fn iq4_xs_scale(off: u32, s: u32) -> f32 {
    let lo = (byte_at(off + 4u + s / 2u) >> (4u * (s % 2u))) & 0x0fu;
    let hi = (u16_at(off + 2u) >> (2u * s)) & 3u;
    return f16_at(off) * f32(i32(lo | (hi << 4u)) - 32);
}
