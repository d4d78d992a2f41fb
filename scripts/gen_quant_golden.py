#!/usr/bin/env python3
"""Generate golden vectors for minfer's ggml tensor-type (de)quantizers.

Rerun from the repository root (needs numpy and the `gguf` Python package, 0.19 or later):

    python3 scripts/gen_quant_golden.py

It rewrites crates/gguf/tests/golden/<type>.bin (e.g. q4_k.bin) deterministically (fixed
seed); crates/gguf/tests/quant_golden.rs checks minfer against them bit for bit.

What the references are:
  * Dequantization: `gguf.quants.dequantize` for every type except Q8_K, which gguf-py does
    not implement; Q8_K's reference is computed here from its definition
    (`y = d * qs` in f32; header flag bit 0 marks such files).
  * Quantization: `gguf.quants.quantize` where gguf-py implements it: F16 (numpy cast),
    BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, TQ1_0, TQ2_0 and MXFP4. gguf-py has no k-quant or
    i-quant quantizers, so those files carry no quantize section.

Inputs:
  * Random blocks: random bytes with the f16 scale fields (f32 for Q8_K) overwritten by
    finite values of varied magnitude (including zero, negatives and f16 subnormals).
    IQ1_M spreads its f16 scale over the top nibbles of four u16 words; those nibbles are
    overwritten the same way. MXFP4's E8M0 exponent byte takes every value 0..255.
    No real i-quant, MXFP4 or ternary model file is used: the blocks are synthetic.
  * For types gguf-py can quantize, also blocks it produced from random f32 data.
  * F32/BF16: random bit patterns (NaN payloads included) plus special values.
  * F16: every bit pattern except signalling NaNs. Those are left out on purpose: numpy
    keeps their payload bits verbatim while minfer (like F16C hardware) quiets them.
  * Quantize inputs avoid NaN; F16 narrowing of NaN differs the same way as above.

File format (all integers little-endian u32, floats little-endian f32):
    magic b"MQGV", version (1), ggml type id, block_size (elements per block),
    type_size (bytes per block), n_deq, n_q, flags (bit 0: dequantize reference computed
    in this script rather than by gguf.quants)
    n_deq * type_size   bytes  raw blocks
    n_deq * block_size  f32    their dequantization
    n_q * block_size    f32    quantizer input
    n_q * type_size     bytes  the reference quantizer's output
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants

OUT = Path(__file__).resolve().parent.parent / "crates" / "gguf" / "tests" / "golden"

# (type, file stem, byte ranges of f16 scale fields; Q8_K's f32 scale is handled apart)
TYPES = [
    (T.F32, "f32", []),
    (T.F16, "f16", []),
    (T.BF16, "bf16", []),
    (T.Q4_0, "q4_0", [(0, 2)]),
    (T.Q4_1, "q4_1", [(0, 2), (2, 4)]),
    (T.Q5_0, "q5_0", [(0, 2)]),
    (T.Q5_1, "q5_1", [(0, 2), (2, 4)]),
    (T.Q8_0, "q8_0", [(0, 2)]),
    (T.Q2_K, "q2_k", [(80, 82), (82, 84)]),
    (T.Q3_K, "q3_k", [(108, 110)]),
    (T.Q4_K, "q4_k", [(0, 2), (2, 4)]),
    (T.Q5_K, "q5_k", [(0, 2), (2, 4)]),
    (T.Q6_K, "q6_k", [(208, 210)]),
    (T.Q8_K, "q8_k", []),
    (T.IQ2_XXS, "iq2_xxs", [(0, 2)]),
    (T.IQ2_XS, "iq2_xs", [(0, 2)]),
    (T.IQ3_XXS, "iq3_xxs", [(0, 2)]),
    (T.IQ1_S, "iq1_s", [(0, 2)]),
    (T.IQ4_NL, "iq4_nl", [(0, 2)]),
    (T.IQ3_S, "iq3_s", [(0, 2)]),
    (T.IQ2_S, "iq2_s", [(0, 2)]),
    (T.IQ4_XS, "iq4_xs", [(0, 2)]),
    (T.IQ1_M, "iq1_m", []),
    (T.TQ1_0, "tq1_0", [(52, 54)]),
    (T.TQ2_0, "tq2_0", [(64, 66)]),
    (T.MXFP4, "mxfp4", []),
]

# Types gguf-py can quantize (F32 is an identity cast and not worth storing).
QUANTIZABLE = {T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.TQ1_0, T.TQ2_0, T.MXFP4}

# Types added after the first set get fewer blocks, to keep the golden files small.
NEWER = {T.IQ2_XXS, T.IQ2_XS, T.IQ3_XXS, T.IQ1_S, T.IQ4_NL, T.IQ3_S, T.IQ2_S, T.IQ4_XS,
         T.IQ1_M, T.TQ1_0, T.TQ2_0, T.MXFP4}

RANDOM_BLOCKS_SMALL = 256  # 32-element types
RANDOM_BLOCKS_K = 128  # 256-element types
RANDOM_BLOCKS_NEWER_K = 48  # 256-element types of NEWER
QUANT_BLOCKS_K = 32  # quantize section, 256-element types
QUANTIZED_BLOCKS = 64  # gguf-quantized blocks added to the dequantize section
QUANT_BLOCKS_SMALL = 128  # quantize section, 32-element types
FLOAT_ELEMS = 4096


def scale_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite, varied f32 scale values: mostly normal-ish magnitudes, some edge cases."""
    mag = 10.0 ** rng.uniform(-4.0, 0.5, n)
    vals = (rng.standard_normal(n) * mag).astype(np.float32)
    kind = rng.integers(0, 20, n)
    vals[kind == 0] = 0.0
    vals[kind == 1] = np.float32(3e-7) * rng.integers(-20, 20, (kind == 1).sum())  # f16 subnormals
    vals[kind == 2] = rng.uniform(-60000, 60000, (kind == 2).sum())
    return vals


def random_blocks(rng: np.random.Generator, qtype: T, scale_fields, n: int) -> np.ndarray:
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n, type_size), dtype=np.uint8)
    for lo, hi in scale_fields:
        assert hi - lo == 2
        blocks[:, lo:hi] = scale_values(rng, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    if qtype == T.IQ1_M:
        # Scale words are bytes 48..56; bits 12..15 of word i hold nibble i of the f16 scale.
        h = scale_values(rng, n).astype(np.float16).view(np.uint16)
        words = blocks[:, 48:56].copy().view(np.uint16)
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((h >> (4 * i)) & 0xF) << 12)
        blocks[:, 48:56] = words.view(np.uint8)
    if qtype == T.MXFP4:
        blocks[: min(n, 256), 0] = np.arange(min(n, 256), dtype=np.uint8)
    if qtype == T.Q8_K:
        d = (rng.standard_normal(n) * 10.0 ** rng.uniform(-6.0, 0.0, n)).astype(np.float32)
        d[:4] = [0.0, -0.0, 1e-40, 1.0]
        blocks[:, 0:4] = d.view(np.uint8).reshape(n, 4)
    return blocks


def random_inputs(rng: np.random.Generator, n_blocks: int, block: int) -> np.ndarray:
    """Quantizer inputs: per block a different distribution and magnitude, plus edge cases."""
    out = np.empty((n_blocks, block), dtype=np.float32)
    for i in range(n_blocks):
        sigma = 10.0 ** rng.uniform(-6.0, 2.0)
        kind = i % 8
        if kind == 0:
            x = rng.standard_normal(block) * sigma
        elif kind == 1:
            x = rng.uniform(-sigma, sigma, block)
        elif kind == 2:
            x = rng.uniform(0, sigma, block) + sigma  # all positive, offset
        elif kind == 3:
            x = -rng.uniform(0, sigma, block)  # all negative
        elif kind == 4:
            x = rng.standard_normal(block) * sigma
            x[rng.integers(0, block)] *= 50.0  # one outlier
        elif kind == 5:
            x = np.round(rng.standard_normal(block) * 4) * 0.25  # on a coarse grid, ties likely
        elif kind == 6:
            x = np.zeros(block)
            x[rng.integers(0, block)] = rng.standard_normal()
        else:
            x = np.cos(np.arange(block) * 0.3 + i) * sigma + 0.1 * sigma
        out[i] = x
    out[0] = 0.0
    out[1] = 1.5  # constant block
    # Exact rounding ties for Q8_0 (amax 127 gives scale 1, so x * id = x).
    out[2] = (np.arange(block) % 32 - 16) + 0.5
    out[2, 0] = 127.0
    return out


def float_dequant_inputs(rng: np.random.Generator, qtype: T) -> np.ndarray:
    """Raw element bytes for the float types."""
    if qtype == T.F32:
        bits = rng.integers(0, 2**32, FLOAT_ELEMS, dtype=np.uint64).astype(np.uint32)
        specials = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 1, 0x807FFFFF]
        bits[: len(specials)] = specials
        return bits.view(np.uint8)
    if qtype == T.BF16:
        bits = rng.integers(0, 2**16, FLOAT_ELEMS, dtype=np.uint32).astype(np.uint16)
        specials = [0, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 1, 0x807F]
        bits[: len(specials)] = specials
        return bits.view(np.uint8)
    assert qtype == T.F16
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    exp_all_ones = (bits & 0x7C00) == 0x7C00
    signalling = exp_all_ones & ((bits & 0x03FF) != 0) & ((bits & 0x0200) == 0)
    return bits[~signalling].view(np.uint8)


def dequant_reference(qtype: T, raw: np.ndarray) -> tuple[np.ndarray, int]:
    """Returns (f32 output, flags)."""
    if qtype == T.Q8_K:
        blocks = raw.reshape(-1, 292)
        d = blocks[:, 0:4].copy().view(np.float32)  # (n, 1)
        qs = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (d * qs).astype(np.float32).reshape(-1), 1
    out = quants.dequantize(raw, qtype)
    return np.ascontiguousarray(out, dtype=np.float32).reshape(-1), 0


def build(rng: np.random.Generator, qtype: T, scale_fields) -> bytes:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    is_float = qtype in (T.F32, T.F16, T.BF16)

    if is_float:
        raw = float_dequant_inputs(rng, qtype)
    else:
        n_random = RANDOM_BLOCKS_K if block_size == 256 else RANDOM_BLOCKS_SMALL
        if qtype in NEWER and block_size == 256:
            n_random = RANDOM_BLOCKS_NEWER_K
        parts = [random_blocks(rng, qtype, scale_fields, n_random)]
        if qtype in QUANTIZABLE:
            n_qb = QUANTIZED_BLOCKS // 4 if block_size == 256 else QUANTIZED_BLOCKS
            x = random_inputs(rng, n_qb, block_size)
            parts.append(np.asarray(quants.quantize(x, qtype), dtype=np.uint8).reshape(-1, type_size))
        raw = np.concatenate(parts).reshape(-1)
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    n_deq = raw.size // type_size
    deq, flags = dequant_reference(qtype, raw)
    assert deq.size == n_deq * block_size

    if qtype in QUANTIZABLE:
        if is_float:
            q_in = random_inputs(rng, FLOAT_ELEMS // 32, 32).reshape(-1)
            # Values near the f16/bf16 limits and rounding ties.
            q_in[:6] = [65504.0, 65520.0, -1e6, 5.9604645e-08, 1.0 + 2.0**-11, 1.0 + 2.0**-8]
        else:
            n_q_blocks = QUANT_BLOCKS_K if block_size == 256 else QUANT_BLOCKS_SMALL
            q_in = random_inputs(rng, n_q_blocks, block_size).reshape(-1)
        q_in = q_in.astype(np.float32)
        q_out = np.asarray(quants.quantize(q_in, qtype)).view(np.uint8).reshape(-1)
        n_q = q_in.size // block_size
        assert q_out.size == n_q * type_size
    else:
        q_in = np.zeros(0, dtype=np.float32)
        q_out = np.zeros(0, dtype=np.uint8)
        n_q = 0

    header = b"MQGV" + struct.pack("<7I", 1, int(qtype), block_size, type_size, n_deq, n_q, flags)
    return b"".join(
        [
            header,
            raw.tobytes(),
            deq.astype("<f4").tobytes(),
            q_in.astype("<f4").tobytes(),
            q_out.tobytes(),
        ]
    )


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    total = 0
    for i, (qtype, stem, fields) in enumerate(TYPES):
        rng = np.random.default_rng(0x5EED_0000 + i)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            data = build(rng, qtype, fields)
        (OUT / f"{stem}.bin").write_bytes(data)
        total += len(data)
        print(f"{stem:5s} {len(data):8d} bytes")
    print(f"total {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
