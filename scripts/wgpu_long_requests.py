#!/usr/bin/env python3
"""Long requests against `minfer serve --backend wgpu`, checked against the CPU backend.

Usage: wgpu_long_requests.py [--minfer target/release/minfer] [-m MODEL] [--tokens 1000]
                             [--batch-tokens 500]

Starts two servers on the same model, one with `--backend wgpu` and one with
`--backend cpu`, and sends each:
  1. one `/completion` with a prompt of about --tokens tokens and `n_probs: 5`;
  2. four prompts of about --batch-tokens tokens (different texts) at once, so the
     slots prefill and decode as a batch.
Every answer must succeed, carry five probabilities per generated token, and (greedy)
match the CPU server's text. Too slow for CI on a software Vulkan driver (the prefill
of a 1,000-token prompt takes minutes there), so it is a script, not a test.
"""

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly judge "
    "boxing matches in the old library near the river where merchants sell maps "
    "of forgotten islands and sailors repeat stories about storms and lighthouses"
).split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(base, path, body, timeout=3700):
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode())


def start(minfer, model, backend, ctx):
    port = free_port()
    args = [minfer, "serve", "--port", str(port), "--slots", "4", "-c", str(ctx),
            "--backend", backend, "--timeout", "3600"]
    if model:
        args += ["-m", model]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{backend} server exited: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, base
        except OSError:
            time.sleep(1)
    proc.kill()
    sys.exit(f"{backend} server did not become healthy")


def prompt(base, seed, n_tokens):
    """A text of about `n_tokens` tokens (counted by the server's tokenizer)."""
    words, i = [], seed
    while True:
        words.extend(WORDS[(i * 7 + j) % len(WORDS)] for j in range(50))
        i += 1
        text = " ".join(words)
        n = len(post(base, "/tokenize", {"content": text})["tokens"])
        if n >= n_tokens:
            return text, n


def complete(base, text):
    body = {"prompt": text, "n_predict": 8, "temperature": 0, "n_probs": 5,
            "cache_prompt": False}
    out = post(base, "/completion", body)
    probs = out.get("completion_probabilities") or []
    if len(probs) != out["tokens_predicted"]:
        sys.exit(f"{len(probs)} probability entries for {out['tokens_predicted']} tokens")
    for p in probs:
        top = p.get("top_logprobs") or []
        if len(top) != 5:
            sys.exit(f"expected 5 probabilities per token, got {p}")
    return out["content"], out["timings"]["prompt_n"]


def run_all(base, long_prompt, prompts):
    one = complete(base, long_prompt)
    results = [None] * len(prompts)

    def worker(k):
        results[k] = complete(base, prompts[k])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(prompts))]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(r is None for r in results):
        sys.exit("a concurrent request failed")
    return one, results, time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minfer", default="target/release/minfer")
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--batch-tokens", type=int, default=500)
    a = ap.parse_args()
    ctx = 4 * (max(a.tokens, a.batch_tokens) + 64)
    servers = {b: start(a.minfer, a.model, b, ctx) for b in ("cpu", "wgpu")}
    try:
        base = servers["cpu"][1]
        long_text, n_long = prompt(base, 0, a.tokens)
        prompts = [prompt(base, seed, a.batch_tokens) for seed in range(1, 5)]
        print("prompt tokens:", n_long, "then four of", [n for _, n in prompts])
        texts = [t for t, _ in prompts]
        got = {}
        for b, (_, url) in servers.items():
            t0 = time.time()
            got[b] = run_all(url, long_text, texts)
            print(f"{b}: one request + four at once in {time.time() - t0:.1f} s "
                  f"(the four: {got[b][2]:.1f} s)")
        (c1, cs, _), (g1, gs, _) = got["cpu"], got["wgpu"]
        if g1[0] != c1[0]:
            sys.exit(f"greedy text differs: wgpu {g1[0]!r} cpu {c1[0]!r}")
        for k, (c, g) in enumerate(zip(cs, gs)):
            if c[0] != g[0]:
                sys.exit(f"batched request {k}: wgpu {g[0]!r} cpu {c[0]!r}")
        print("ok: n_probs over", g1[1], "prompt tokens and a batch of four agree with the CPU")
    finally:
        for proc, _ in servers.values():
            proc.terminate()


if __name__ == "__main__":
    main()
