#!/usr/bin/env python3
"""Compare a minfer trace with llama.cpp's per-tensor dump of the same prompt, node by node.

    MINFER_TRACE=m.json minfer run --backend cpu --temp 0 -n 1 -p PROMPT
    llama-eval-callback -m MODEL.gguf -p PROMPT -n 1 -t 2 > l.txt 2>&1
    scripts/trace_diff.py m.json l.txt [--bound 0.02] [--all]

llama-eval-callback prints, for every tensor of the prompt's batch, its name, op and
shape, the first and last three values along each dimension, and the sum. minfer's trace
holds, for every node of the same batch (its prefill phase, first step), statistics over
the whole tensor and a strided sample. minfer names its nodes as llama.cpp names its
tensors (attn_norm-3, ffn_out-3, l_out-3, ...); where a name covers several llama.cpp
tensors (Qcur-3 is the matmul, the bias add and the RoPE there) the op chooses
(minfer's Qcur_rope-3 is llama.cpp's ROPE). Nodes with no counterpart are skipped.

Two distances per matched pair, both relative to the minfer tensor's RMS:
  value: the largest difference over the elements both print;
  sum:   |sum difference| / (rms * sqrt(n)), the per-element error if errors were
         independent (not for the logits, whose common shift the softmax ignores).
Run llama-eval-callback with the settings minfer's references use (-fa off -ctk f32
-ctv f32): its defaults store the KV cache in f16, which alone parts the attention.
The first node, in build order, where either exceeds --bound is where the two part.
Exit status 0 when they never part, 1 when they do, 2 on bad input.
"""

import argparse
import json
import math
import re
import sys

HEADER = re.compile(
    r"^\S*cb_eval:\s+(?P<name>.+?) = \((?P<type>\w+)\)\s+(?P<op>\w+)\(.*\) = \{(?P<shape>[\d, ]+)\}\s*$"
)
SUM = re.compile(r"^\s*sum\s*=\s*(?P<sum>\S+)\s*$")
NUM = re.compile(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)", re.I)
EDGE = 3  # values llama.cpp prints at each end of a dimension


def parse_llama(path):
    """The tensors of an eval-callback dump: [{name, op, shape, sum, values{flat: v}}]."""
    tensors = []
    cur = None
    # One counter per open bracket: the index of its next child. The outermost bracket
    # is one entry of dim 3 (counted in i3), the next one of dim 2, rows are dim 1.
    stack, i3 = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = HEADER.match(line)
            if m:
                shape = [int(x) for x in m["shape"].split(",")]
                cur = {"name": m["name"].strip(), "op": m["op"], "shape": shape,
                       "sum": None, "values": {}}
                tensors.append(cur)
                stack, i3 = [], 0
                continue
            if cur is None:
                continue
            s = line.strip()
            m = SUM.match(line)
            if m:
                cur["sum"] = float(m["sum"])
                cur = None
                continue
            ne0, ne1, ne2, ne3 = cur["shape"]
            if s == "[":
                stack.append(0)
            elif s.startswith("]"):
                if stack:
                    stack.pop()
                if stack:
                    stack[-1] += 1
                else:
                    i3 += 1
            elif s.startswith("..."):
                # Skipped entries: the next one is EDGE from the end of its dimension.
                if not stack:
                    i3 = ne3 - EDGE
                else:
                    stack[-1] = cur["shape"][3 - len(stack)] - EDGE
            elif s.startswith("[") and s.rstrip(",").endswith("]") and len(stack) == 2:
                i2, i1 = stack
                base = ((i3 * ne2 + i2) * ne1 + i1) * ne0
                col = 0
                for p in (p.strip() for p in s.strip("[],").split(",")):
                    if not p:
                        continue
                    if p == "...":
                        col = ne0 - EDGE
                        continue
                    if NUM.fullmatch(p):
                        cur["values"][base + col] = float(p)
                    col += 1
                stack[-1] += 1
    return tensors


def flat_shape(shape):
    return math.prod(shape)


def minfer_prefill(doc):
    """The graph nodes and the first step's entries of the trace's first phase."""
    if doc.get("format") != "minfer-trace":
        raise ValueError("not a minfer-trace file")
    phase = doc["phases"][0]
    step = phase["steps"][0]
    return phase["graph"]["nodes"], {e["id"]: e for e in step["nodes"]}


def counterpart(name, llama_by_name):
    """The llama.cpp tensor for minfer's node `name`, or None."""
    m = re.fullmatch(r"(?P<base>[A-Za-z_]+?)(?P<rope>_rope)?-(?P<layer>\d+)", name)
    simple = {"inp_embd": "embd", "result_norm": "result_norm", "result_output": "result_output"}
    if name in simple:
        cands = llama_by_name.get(simple[name], [])
        return cands[-1] if cands else None
    if not m:
        return None
    base, layer = m["base"], m["layer"]
    if base in ("Qcur", "Kcur", "Vcur"):
        cands = llama_by_name.get(f"{base}-{layer}", [])
        if m["rope"]:
            want = [t for t in cands if t["op"] == "ROPE"]
        else:
            # The projection with its bias: the last matmul or add before the reshape.
            want = [t for t in cands if t["op"] in ("MUL_MAT", "ADD")]
        return want[-1] if want else None
    rename = {"ffn_gate_par": "ffn_swiglu"}
    cands = llama_by_name.get(f"{rename.get(base, base)}-{layer}", [])
    return cands[-1] if cands else None


def compare(doc, tensors, bound):
    nodes, entries = minfer_prefill(doc)
    by_name = {}
    for t in tensors:
        by_name.setdefault(t["name"], []).append(t)
    rows = []
    for node in nodes:
        e = entries.get(node["id"])
        if e is None:
            continue
        t = counterpart(node["name"], by_name)
        if t is None:
            continue
        n = e["n"]
        if flat_shape(t["shape"]) != n:
            rows.append((node, t, None, None, f"shape {t['shape']} against {node['shape']}"))
            continue
        rms = e["stats"]["rms"] or 0.0
        scale = rms if rms > 0 else 1.0
        dv = None
        for k, v in enumerate(e["values"]):
            flat = k * e["stride"]
            if flat in t["values"] and v is not None:
                d = abs(v - t["values"][flat]) / scale
                dv = d if dv is None else max(dv, d)
        ds = None
        # A shift common to every logit leaves the softmax unchanged but moves their sum
        # by n times the shift: only the values count for the logits.
        if node["name"] != "result_output" and t["sum"] is not None and e["stats"]["mean"] is not None:
            ds = abs(e["stats"]["mean"] * n - t["sum"]) / (scale * math.sqrt(n))
        rows.append((node, t, dv, ds, None))
    first = None
    for node, t, dv, ds, problem in rows:
        if problem is None and ((dv or 0) > bound or (ds or 0) > bound):
            first = (node, t, dv, ds)
            break
    return rows, first


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="minfer trace (MINFER_TRACE file)")
    ap.add_argument("llama", help="llama-eval-callback output")
    ap.add_argument("--bound", type=float, default=0.02,
                    help="largest distance, relative to the tensor's RMS (default 0.02)")
    ap.add_argument("--all", action="store_true", help="print every matched node")
    a = ap.parse_args()
    try:
        with open(a.trace, encoding="utf-8") as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{a.trace}: not a JSON trace ({e})") from None
        tensors = parse_llama(a.llama)
        if not tensors:
            raise ValueError(f"{a.llama}: no tensors found (is it llama-eval-callback output?)")
        rows, first = compare(doc, tensors, a.bound)
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    fmt = lambda x: "-" if x is None else f"{x:.2e}"
    print(f"{len(rows)} nodes matched by name; bound {a.bound} of the tensor's RMS")
    for node, t, dv, ds, problem in rows:
        if a.all or problem:
            print(f"  #{node['id']:<4} {node['name']:<18} {t['op']:<9} value {fmt(dv):>9}  sum {fmt(ds):>9}"
                  + (f"  ({problem})" if problem else ""))
    if first is None:
        worst = max(rows, key=lambda r: max(r[2] or 0, r[3] or 0), default=None)
        if worst:
            print(f"no node parts beyond the bound; the largest distance is at #{worst[0]['id']} "
                  f"{worst[0]['name']}: value {fmt(worst[2])}, sum {fmt(worst[3])}")
        return 0
    node, t, dv, ds = first
    print(f"first node beyond the bound: #{node['id']} {node['name']} ({node['op']}, llama.cpp "
          f"{t['name']} {t['op']}): value {fmt(dv)}, sum {fmt(ds)}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
