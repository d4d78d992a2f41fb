#!/usr/bin/env python3
"""Speculative decoding against plain decode, minfer and llama.cpp, on the same prompts.

For every prompt file (scripts/spec_prompts/*.txt, ChatML already rendered) and source:

- minfer: `minfer bench --lookup|--draft D -f PROMPT -p 0 -n N -r R -o json`, which
  greedy-decodes the prompt plainly and speculatively in alternating repetitions (ABBA)
  and reports both; the ratio is taken per repetition pair.
- llama.cpp (with --llama-bin): `llama-lookup` / `llama-speculative -md D` (their own
  "decoded ... speed" line) against `llama-bench -p 0 -n N -d PROMPT_TOKENS` (plain
  decode at the prompt's depth), R rounds of A B B A, a ratio per pair.

Every ratio column is the median of the paired ratios and their interquartile range
(q1-q3): on a shared machine absolute speeds drift, paired ratios much less.

Usage:
  python3 scripts/bench_spec.py --target T.gguf --draft D.gguf \\
      [--minfer target/release/minfer] [--llama-bin DIR] [-t 2] [-n 96] [-r 8] \\
      [--prompts scripts/spec_prompts] [--only edit-,free-] [--sources lookup,draft] \\
      [--json out.json]

Prints one Markdown table, one row per prompt and source; `--json` also writes every
sample.
"""

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys


def run(cmd, timeout=1800):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return p.stdout, p.stderr


def median_iqr(xs):
    """The median and the quartiles q1, q3 of `xs` (q1 = q3 = the value for one)."""
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q2, q1, q3


def fmt_ratio(xs):
    m, q1, q3 = median_iqr(xs)
    return f"{m:.2f}x ({q1:.2f}-{q3:.2f})"


def minfer_pair(args, prompt, source):
    """Plain and speculative t/s per repetition, and the acceptance rate."""
    cmd = [args.minfer, "bench", "-m", args.target, "-t", str(args.threads),
           "-p", "0", "-n", str(args.n_gen), "-r", str(args.reps), "-f", prompt,
           "-o", "json"]
    cmd += ["--lookup"] if source == "lookup" else ["--draft", args.draft]
    out, _ = run(cmd)
    rows = json.loads(out)
    plain = next(r for r in rows if r["test"].endswith(" plain"))
    spec = next(r for r in rows if r["test"].endswith(" " + ("lookup" if source == "lookup" else "draft model")))
    return plain["samples_ts"], spec["samples_ts"], spec.get("acceptance", 0.0), plain["n_prompt"]


SPEED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")


def llama_spec(args, prompt, source):
    tool = "llama-lookup" if source == "lookup" else "llama-speculative"
    cmd = [os.path.join(args.llama_bin, tool), "-m", args.target, "-f", prompt,
           "-n", str(args.n_gen), "-t", str(args.threads), "--temp", "0", "-c", "4096"]
    if source == "draft":
        cmd += ["-md", args.draft, "-td", str(args.threads)]
    out, err = run(cmd)
    text = out + err
    m = SPEED.search(text)
    a = ACCEPT.search(text)
    if not m:
        raise SystemExit(f"no speed line from {tool}")
    return float(m.group(3)), float(a.group(1)) / 100 if a else 0.0


def llama_plain(args, depth):
    cmd = [os.path.join(args.llama_bin, "llama-bench"), "-m", args.target, "-t",
           str(args.threads), "-p", "0", "-n", str(args.n_gen), "-d", str(depth),
           "-r", "1", "-o", "json"]
    out, _ = run(cmd)
    return json.loads(out)[0]["avg_ts"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--minfer", default="target/release/minfer")
    ap.add_argument("--llama-bin", default=None)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-gen", type=int, default=96)
    ap.add_argument("-r", "--reps", type=int, default=8,
                    help="minfer's ABBA repetitions (paired ratios) per row")
    ap.add_argument("--llama-rounds", type=int, default=0,
                    help="llama.cpp's ABBA rounds per row (default: -r)")
    ap.add_argument("--prompts", default=os.path.join(os.path.dirname(__file__), "spec_prompts"))
    ap.add_argument("--only", default="", help="comma-separated prompt name prefixes")
    ap.add_argument("--sources", default="lookup,draft")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    prompts = sorted(glob.glob(os.path.join(args.prompts, "*.txt")))
    if args.only:
        keep = args.only.split(",")
        prompts = [p for p in prompts if any(os.path.basename(p).startswith(k) for k in keep)]
    results = []
    print("| prompt | source | minfer plain t/s | minfer spec t/s | minfer ratio (IQR) | accept | "
          "llama plain t/s | llama spec t/s | llama ratio (IQR) | llama accept |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for prompt in prompts:
        name = os.path.basename(prompt)[:-4]
        for source in args.sources.split(","):
            plain, spec, acc, n_prompt = minfer_pair(args, prompt, source)
            ratios = [s / p for p, s in zip(plain, spec)]
            row = {"prompt": name, "source": source, "minfer_plain": plain,
                   "minfer_spec": spec, "minfer_ratios": ratios,
                   "minfer_ratio": median_iqr(ratios)[0], "minfer_accept": acc}
            cells = ["-"] * 4
            if args.llama_bin:
                lp, ls, lr, accs = [], [], [], []
                for _ in range(args.llama_rounds or args.reps):
                    # A B B A: plain, speculative, speculative, plain.
                    a1 = llama_plain(args, n_prompt)
                    b1, la1 = llama_spec(args, prompt, source)
                    b2, la2 = llama_spec(args, prompt, source)
                    a2 = llama_plain(args, n_prompt)
                    lp += [a1, a2]
                    ls += [b1, b2]
                    lr += [b1 / a1, b2 / a2]
                    accs += [la1, la2]
                la = statistics.median(accs)
                row.update({"llama_plain": lp, "llama_spec": ls, "llama_ratios": lr,
                            "llama_ratio": median_iqr(lr)[0], "llama_accept": la})
                cells = [f"{statistics.median(lp):.2f}", f"{statistics.median(ls):.2f}",
                         fmt_ratio(lr), f"{100 * la:.0f}%"]
            results.append(row)
            print(f"| {name} | {source} | {statistics.median(plain):.2f} | "
                  f"{statistics.median(spec):.2f} | {fmt_ratio(ratios)} | "
                  f"{100 * acc:.0f}% | " + " | ".join(cells) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
