#!/usr/bin/env python3
"""Weight bytes one decoded token must read, against the bytes minfer reads for it.

For a GGUF file, sums per class the bytes of the weights a single-token decode step
touches: every dense matrix whole, one row of the token embedding, the router and the
shared experts whole, `k` of the `n` stacked experts of each expert tensor
(`<arch>.expert_used_count` of `<arch>.expert_count`), and the lm head (`output.weight`,
or the token embedding when the two are tied). That sum is the active-parameter byte
count. Beside it, the bytes minfer's CPU backend reads for the same step: the same
tensors in the layout it reads them in (Q4_K and IQ4_XS matrices repacked into eight-row
tiles that carry unpacked scales: 32 bytes more per eight Q4_K super-blocks, 16 per
eight IQ4_XS ones; every other type as stored; stacked Q4_K, Q6_K and IQ4_XS experts
are repacked too). An expert-routed product reads each chosen expert's rows once per
call, so a step reads no expert twice.

    python3 scripts/decode_bytes.py FILE [--tps T] [--repack-off]

--tps T also prints the bandwidth a decode rate of T tokens/s implies for both counts.
--repack-off counts the stored layout (minfer with MINFER_REPACK=0).
"""

import argparse
import math
import sys

try:
    import gguf
except ImportError:
    sys.exit("decode_bytes.py needs the gguf python package (pip install gguf)")

# Repacked tiles by type name: (bytes of one stored super-block, extra bytes per tile of
# eight super-blocks).
TILE = {"Q4_K": (144, 32), "IQ4_XS": (136, 16)}


def field(reader, key):
    """A scalar or string metadata value, or None."""
    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    part = f.parts[f.data[0]]
    if f.types and f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(part).decode()
    return part.tolist()[0]


def classify(name, n_dims):
    if name == "token_embd.weight":
        return "embedding row"
    if name == "output.weight":
        return "lm head"
    if "_exps." in name:
        return "routed experts"
    if "ffn_gate_inp" in name and "shexp" not in name:
        return "router"
    if "shexp" in name:
        return "shared experts"
    if n_dims < 2 or name.endswith("_norm.weight") or name.endswith(".bias"):
        return "norms, biases, small vectors"
    if ".attn_" in name or ".ssm_" in name:
        return "attention / recurrent projections"
    if ".ffn_" in name:
        return "dense FFN"
    return "other matrices"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--tps", type=float, help="measured decode tokens/s")
    ap.add_argument("--repack-off", action="store_true", help="count the stored layout")
    a = ap.parse_args()

    r = gguf.GGUFReader(a.file)
    arch = field(r, "general.architecture")
    if arch is None:
        sys.exit(f"{a.file}: no general.architecture")
    n_exp = field(r, f"{arch}.expert_count") or 0
    k_exp = field(r, f"{arch}.expert_used_count") or 0
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names

    need = {}
    reads = {}

    def add(cls, n, factor):
        need[cls] = need.get(cls, 0) + n
        reads[cls] = reads.get(cls, 0) + n * factor

    for t in r.tensors:
        ty = t.tensor_type.name
        nbytes = int(t.n_bytes)
        dims = [int(d) for d in t.shape]
        cls = classify(t.name, len([d for d in dims if d > 1]))
        factor = 1.0
        if not a.repack_off and ty in TILE and len(dims) >= 2 and dims[1] > 1:
            block, extra = TILE[ty]
            factor = (8 * block + extra) / (8 * block)
        if cls == "embedding row":
            rows = math.prod(dims[1:])
            # The lookup reads the stored row; a tied lm head reads the matrix.
            add(cls, nbytes / rows, 1.0)
            if tied:
                add("lm head (tied to the embedding)", nbytes, factor)
            continue
        if cls == "routed experts":
            if not n_exp or not k_exp:
                sys.exit(f"{t.name}: no {arch}.expert_count / expert_used_count")
            add(cls, nbytes * k_exp / n_exp, factor)
            continue
        add(cls, nbytes, factor)

    order = sorted(need, key=lambda c: -need[c])
    total_need = sum(need.values())
    total_read = sum(reads.values())
    mb = 1e6
    print(f"{a.file}: {arch}" + (f", {k_exp} of {n_exp} experts per token" if n_exp else ""))
    print(f"{'class':<36} {'active MB':>10} {'minfer reads MB':>16} {'share':>7}")
    for c in order:
        print(f"{c:<36} {need[c] / mb:>10.1f} {reads[c] / mb:>16.1f} {100 * need[c] / total_need:>6.1f}%")
    print(f"{'total per token':<36} {total_need / mb:>10.1f} {total_read / mb:>16.1f}")
    # Gated DeltaNet layers also read and write their f32 state matrices every step.
    interval = field(r, f"{arch}.full_attention_interval")
    s_k = field(r, f"{arch}.ssm.state_size")
    h_v = field(r, f"{arch}.ssm.time_step_rank")
    n_layer = field(r, f"{arch}.block_count")
    if interval and s_k and h_v and n_layer:
        n_rec = n_layer - n_layer // interval
        state = n_rec * h_v * s_k * s_k * 4
        print(
            f"besides: {n_rec} recurrent layers' f32 state, {state / mb:.1f} MB read and "
            f"{state / mb:.1f} MB written per token"
        )
    if a.tps:
        print(
            f"at {a.tps:g} t/s: {total_need * a.tps / 1e9:.1f} GB/s of active weights, "
            f"{total_read * a.tps / 1e9:.1f} GB/s as minfer reads them"
        )


if __name__ == "__main__":
    main()
