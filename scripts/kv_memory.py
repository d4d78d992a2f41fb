#!/usr/bin/env python3
"""Peak memory of a long context, against the KV formula and against llama.cpp.

    python3 scripts/kv_memory.py --model MODEL.gguf --minfer target/release/minfer \
        [--llama-bench LLAMA_BUILD/bin/llama-bench] [--depth 32000] [--kv f16]

Each engine runs its bench twice on the same file with 2 threads: once with an empty
context and once after `--depth` tokens were prefilled (`-d`, then one generated
token), so the second run holds a context of depth + 1 tokens. Peak RSS is read from
the kernel's accounting of each child process (`wait4`), so pages an engine reserves
but never touches do not count: the difference between the two runs is what the
filled context costs in memory, KV cache and the compute buffers that grow with it.

The formula is the KV cache a sliding-window model needs (llama.cpp's iSWA layout):
global layers keep every position of the context, a sliding-window layer only the
window plus what one step adds. minfer's rings hold `window + step - 1` rows (step:
the prefill chunk, 512); llama.cpp's hold `window + ubatch` rows padded to 256. The
layer pattern is read as llama.cpp reads it: Gemma 3 makes every sixth layer global,
Gemma 2 and gpt-oss every second; other architectures have no windows.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import gguf

STEP = 512
DTYPE_BYTES = {"f32": 4.0, "f16": 2.0, "q8_0": 34.0 / 32.0}


def meta(path):
    r = gguf.GGUFReader(path)

    def get(key, default=None):
        f = r.fields.get(key)
        if f is None:
            return default
        v = f.parts[f.data[0]]
        return v.tobytes().decode() if f.types[0] == gguf.GGUFValueType.STRING else v[0]

    arch = get("general.architecture")
    n_embd = int(get(f"{arch}.embedding_length"))
    n_head = int(get(f"{arch}.attention.head_count"))
    m = {
        "arch": arch,
        "n_layer": int(get(f"{arch}.block_count")),
        "n_head_kv": int(get(f"{arch}.attention.head_count_kv", n_head)),
        "k_len": int(get(f"{arch}.attention.key_length", n_embd // n_head)),
        "v_len": int(get(f"{arch}.attention.value_length", n_embd // n_head)),
        "window": get(f"{arch}.attention.sliding_window"),
    }
    period = {"gemma3": 6, "gemma2": 2, "gpt-oss": 2}.get(arch)
    n = m["n_layer"]
    if m["window"] is None or period is None:
        m["local"] = 0
    else:
        m["local"] = sum(1 for il in range(n) if il % period < period - 1)
    return m


def kv_formula(m, ctx, kv, local_rows):
    """Bytes of K and V for `ctx` positions: global layers whole, local layers a ring."""
    row = m["n_head_kv"] * (m["k_len"] + m["v_len"]) * DTYPE_BYTES[kv]
    glob = m["n_layer"] - m["local"]
    local = min(ctx, local_rows) if m["local"] else 0
    return glob * ctx * row + m["local"] * local * row


def peak_rss(cmd, env=None):
    """Runs `cmd` and returns (exit status, peak RSS in MiB, output tail)."""
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        tail = out.read().decode(errors="replace").strip().splitlines()[-1:]
    return p.returncode, ru.ru_maxrss / 1024.0, tail[0] if tail else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--minfer", required=True)
    ap.add_argument("--llama-bench")
    ap.add_argument("--depth", type=int, default=32000)
    ap.add_argument("--kv", default="f16", choices=sorted(DTYPE_BYTES))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    m = meta(args.model)
    ctx = args.depth + 1
    mib = 1024.0 * 1024.0
    win = int(m["window"] or 0)
    print(f"model: {os.path.basename(args.model)}, {m['arch']}, {m['n_layer']} layers "
          f"({m['local']} with a {win}-row window), {m['n_head_kv']} KV heads of "
          f"{m['k_len']}+{m['v_len']}, K/V {args.kv}, context {ctx}")
    rows_minfer = win + STEP - 1
    rows_llama = -(-(win + STEP) // 256) * 256
    full = kv_formula({**m, "local": 0}, ctx, args.kv, 0) / mib
    print(f"KV formula: every layer whole {full:.1f} MiB; windowed, minfer's rings "
          f"({rows_minfer} rows) {kv_formula(m, ctx, args.kv, rows_minfer) / mib:.1f} MiB, "
          f"llama.cpp's ({rows_llama} rows) {kv_formula(m, ctx, args.kv, rows_llama) / mib:.1f} MiB")
    t = str(args.threads)
    runs = [("minfer", [args.minfer, "bench", "-m", args.model, "-t", t, "-r", "1", "-p", "0",
                        "-n", "1", "--cache-type-k", args.kv, "--cache-type-v", args.kv, "-d"])]
    if args.llama_bench:
        runs.append(("llama.cpp", [args.llama_bench, "-m", args.model, "-t", t, "-r", "1",
                                   "-p", "0", "-n", "1", "-ctk", args.kv, "-ctv", args.kv,
                                   "-d"]))
    print("| engine | peak RSS, empty context (MiB) | peak RSS at depth (MiB) | growth (MiB) |")
    print("|---|---:|---:|---:|")
    for name, cmd in runs:
        rc0, r0, _ = peak_rss(cmd + ["0"])
        rc1, r1, tail = peak_rss(cmd + [str(args.depth)])
        if rc0 or rc1:
            print(f"{name} failed ({rc0}, {rc1}): {tail}", file=sys.stderr)
            return 1
        print(f"| {name} | {r0:.0f} | {r1:.0f} | {r1 - r0:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
