#!/usr/bin/env python3
"""Time to first token of a second slot that finds a long system prompt in the shared cache.

    python3 scripts/bench_prefix_cache.py --minfer target/release/minfer --model MODEL.gguf \
        [--tokens 3000] [--runs 3]

Starts `minfer serve --slots 2` with the shared prompt cache on (its default budget) and,
per run, builds a new system prompt of about --tokens tokens (new words each run, so
nothing is cached before it), then sends two streamed chat requests one after the
other with the same system prompt and different questions: the first on slot 0
(`id_slot`), the second on slot 1. Slot 1 has never seen the prompt, so whatever it does
not prefill came from the cache that slot 0's request filled. Reported per run: both
times to first token (the first streamed text), their ratio, and the cache's hit
counter before and after. With --cache-ram 0 the same runs show the time without the
cache. Exit status 1 when a request fails or the median ratio is above --max-ratio
(0.25 by default).
"""
import argparse
import http.client
import json
import os
import random
import re
import statistics
import sys
import time

from local_server import free_port, start, stop, wait_ready

WORDS = ("alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega orbit "
         "vector matrix tensor kernel buffer socket thread queue router worker cache "
         "policy budget stream record index search engine planet river forest city").split()


def ttft(port, system, question, slot):
    body = json.dumps({"messages": [{"role": "system", "content": system},
                                    {"role": "user", "content": question}],
                       "max_tokens": 4, "temperature": 0, "stream": True, "id_slot": slot})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]!r}")
    first = None
    for line in r:
        line = line.strip()
        if first is None and line.startswith(b"data: {"):
            delta = json.loads(line[6:])["choices"][0]["delta"]
            if delta.get("content"):
                first = time.perf_counter() - t0
    c.close()
    return first if first is not None else time.perf_counter() - t0


def prompt_tokens(port, system):
    """Tokens of the system prompt alone (llama-server's `/tokenize`)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/tokenize", json.dumps({"content": system}),
              {"Content-Type": "application/json"})
    return len(json.loads(c.getresponse().read())["tokens"])


def hits(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    m = re.search(r"^minfer_prompt_cache_hit_tokens_total (\S+)$", body, re.M)
    return int(float(m.group(1))) if m else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minfer", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=3000, help="about this many prompt tokens")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-ram", type=int, help="MiB (default: the server's)")
    ap.add_argument("--max-ratio", type=float, default=0.25)
    args = ap.parse_args()

    port = free_port()
    cmd = [args.minfer, "serve", "-m", args.model, "--slots", "2",
           "-c", str(2 * (args.tokens + 1024)), "-t", str(args.threads), "--port", str(port)]
    if args.cache_ram is not None:
        cmd += ["--cache-ram", str(args.cache_ram)]
    proc = start(cmd)
    ratios, ok = [], True
    try:
        if not wait_ready(port, proc):
            raise SystemExit("the server did not become ready")
        print("| run | first request TTFT (slot 0) | second request TTFT (slot 1) "
              "| tokens from the cache (of the system prompt's) | ratio |")
        print("|---|---:|---:|---:|---:|")
        for run in range(args.runs):
            rng = random.Random(run)
            # About 1.04 tokens per word of this vocabulary (Qwen2's tokenizer); a run tag
            # keeps runs apart.
            words = [rng.choice(WORDS) for _ in range(int(args.tokens / 1.04))]
            system = f"Run {run} {os.getpid()}. " + " ".join(words)
            before = hits(port)
            a = ttft(port, system, "Summarise the text above in one line.", 0)
            b = ttft(port, system, "Which word appears most often above?", 1)
            got = hits(port) - before
            ratios.append(b / a)
            print(f"| {run} | {a:.2f} s | {b:.2f} s | {got} of {prompt_tokens(port, system)} "
                  f"| {b / a:.3f} |", flush=True)
    except (OSError, RuntimeError) as e:
        print(f"request failed: {e}", file=sys.stderr)
        ok = False
    finally:
        stop(proc)
    if ratios:
        print(f"median ratio {statistics.median(ratios):.3f} (bar {args.max_ratio})")
    return 0 if ok and ratios and statistics.median(ratios) <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
