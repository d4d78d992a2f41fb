#!/usr/bin/env python3
"""Memory of `minfer serve` under a long mixed load with the shared prompt cache on.

    python3 scripts/soak_cache.py --minfer target/release/minfer --model MODEL.gguf \
        --minutes 10 --cache-ram 128 --slots 4 --clients 6

Starts one server with `--cache-ram` MiB for the prompt cache shared across slots, and
runs more clients than slots (so requests queue) for the given time. Each request is one
of, at random (seeded):
  - a shared system prompt (one of eight, of 600 to 1,500 tokens: together more than the
    cache can hold, so blocks are evicted all the time) with a new question, streamed;
  - a long prompt of its own (300 to 1,500 tokens), not streamed;
  - a short chat turn with a longer answer, streamed.
Every second it samples the server's resident set (VmRSS) and its `/metrics`
(`minfer_prompt_cache_bytes`, `minfer_prompt_cache_hit_tokens_total`).

The same load first runs for --baseline-minutes with the cache off (`--cache-ram 0`),
for the memory the server needs without it. Reported per run: RSS once the model is
loaded and idle, its peak and its value at the end, its slope over the run's second
half (a leak shows as a steady rise), the most bytes the cache held against its budget,
and requests served and failed; then the peak RSS with the cache minus the peak
without it. Exit status 1 when a request failed, the cache went over its budget, or
that difference exceeds the budget plus --slack MiB.
"""
import argparse
import http.client
import json
import random
import re
import sys
import threading
import time

from local_server import free_port, start, stop, wait_ready

WORDS = ("system user request data model cache token server client memory block "
         "prompt answer question context layer matrix vector kernel thread queue "
         "router worker budget policy latency stream record index search engine").split()


def text(rng, n_words):
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read().decode("utf-8", "replace")


def metric(body, name):
    m = re.search(rf"^{re.escape(name)} (\S+)$", body, re.M)
    return float(m.group(1)) if m else 0.0


def chat(port, messages, max_tokens, stream):
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       "stream": stream})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {data[:200]!r}")
    if stream and b"data: [DONE]" not in data:
        raise RuntimeError("stream ended without [DONE]")


def run(args, cache_ram, minutes):
    """One server under the mixed load: (command, idle RSS, samples, counts, errors)."""
    port = free_port()
    cmd = [args.minfer, "serve", "-m", args.model, "--slots", str(args.slots),
           "-c", str(args.slots * args.ctx_per_slot), "-t", str(args.threads),
           "--port", str(port), "--cache-ram", str(cache_ram),
           "--queue", str(4 * args.clients)]
    proc = start(cmd)
    counts = {"ok": 0, "failed": 0}
    errors = []
    samples = []  # (seconds, rss MiB, cache bytes, hit tokens)
    try:
        if not wait_ready(port, proc):
            raise SystemExit("the server did not become ready")
        rng = random.Random(args.seed)
        systems = [text(rng, rng.randint(450, 1100)) for _ in range(8)]
        idle = rss_mib(proc.pid)
        deadline = time.time() + minutes * 60
        lock = threading.Lock()

        def client(c):
            r = random.Random(args.seed * 1000 + c)
            while time.time() < deadline:
                kind = r.random()
                try:
                    if kind < 0.5:
                        chat(port, [{"role": "system", "content": r.choice(systems)},
                                    {"role": "user", "content": text(r, 12) + "?"}],
                             24, True)
                    elif kind < 0.75:
                        chat(port, [{"role": "user", "content": text(r, r.randint(220, 1100))}],
                             8, False)
                    else:
                        chat(port, [{"role": "user", "content": text(r, 10)}], 96, True)
                    with lock:
                        counts["ok"] += 1
                except (OSError, RuntimeError) as e:
                    with lock:
                        counts["failed"] += 1
                        errors.append(str(e))

        threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
        t0 = time.time()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            _, body = get(port, "/metrics")
            samples.append((time.time() - t0, rss_mib(proc.pid),
                            metric(body, "minfer_prompt_cache_bytes"),
                            metric(body, "minfer_prompt_cache_hit_tokens_total")))
            time.sleep(1)
        for t in threads:
            t.join()
    finally:
        stop(proc)
    return cmd, idle, samples, counts, errors


def slope(samples):
    """Least-squares RSS slope over the second half of the run, MiB per minute."""
    half = [s for s in samples if s[0] >= samples[-1][0] / 2]
    n = len(half)
    mx = sum(s[0] for s in half) / n
    my = sum(s[1] for s in half) / n
    var = sum((s[0] - mx) ** 2 for s in half)
    return 60 * sum((s[0] - mx) * (s[1] - my) for s in half) / var if var else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minfer", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--baseline-minutes", type=float, default=2,
                    help="the same load with the cache off first, for the RSS it needs")
    ap.add_argument("--cache-ram", type=int, default=128, help="MiB")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--ctx-per-slot", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slack", type=float, default=32, help="MiB allowed past the budget")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()

    bad = False
    peaks = {}
    for budget, minutes in ((0, args.baseline_minutes), (args.cache_ram, args.minutes)):
        cmd, idle, samples, counts, errors = run(args, budget, minutes)
        peak = max(s[1] for s in samples)
        cache_peak = max(s[2] for s in samples) / 2**20
        peaks[budget] = peak
        print(f"server: {' '.join(cmd[1:])}")
        print(f"  {samples[-1][0] / 60:.1f} min, {args.clients} clients, "
              f"{counts['ok']} requests served, {counts['failed']} failed")
        print(f"  RSS: idle {idle:.0f} MiB, peak {peak:.0f} MiB, end {samples[-1][1]:.0f} MiB, "
              f"slope over the second half {slope(samples):+.2f} MiB/min")
        print(f"  prompt cache: peak {cache_peak:.1f} MiB of {budget} MiB, "
              f"{samples[-1][3]:.0f} prompt tokens served from it", flush=True)
        if errors:
            print(f"  first failure: {errors[0]}", file=sys.stderr)
        bad |= counts["failed"] > 0 or cache_peak > budget
    over = peaks[args.cache_ram] - peaks[0]
    print(f"peak RSS with the cache minus without: {over:.0f} MiB "
          f"(budget {args.cache_ram} MiB)")
    bad |= over > args.cache_ram + args.slack
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
