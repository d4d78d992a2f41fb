#!/usr/bin/env python3
"""End-to-end check of scale-out: minfer workers behind the SMG router (scale_out.py).

Usage: e2e_scale_out.py --minfer PATH -- [minfer serve arguments: the model, slots ...]

Starts two workers and the router with scale_out.py's recipe and talks to the router
with the official `openai` client, its own retries off (max_retries=0), so every success
is the router's doing. Which worker served a request is read from each worker's own
/metrics (`vllm:time_to_first_token_seconds_count`: one per request; prefix-cache hits in
`vllm:prefix_cache_hits_total`), never from the router. Checks, in order:
(a) requests sharing a long prefix all go to one worker, which reuses the prefix's KV;
(b) requests with different prefixes spread over both workers;
(c) a worker killed (SIGKILL) while four clients keep requests in flight costs no
    request: every client sees only successes;
(d) the killed worker, restarted on its port, is taken back and serves requests again.
Prints the time each part took, then `e2e ok`.
"""

import argparse
import os
import random
import re
import shutil
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale_out import Fleet, http_get  # noqa: E402

try:
    import openai
except ImportError as e:
    sys.exit(f"a Python package is missing ({e}): python3 -m pip install openai smg")


def check(cond, what):
    if not cond:
        raise AssertionError(f"e2e failure: {what}")


def metric(text, name):
    """The value of the unlabelled sample `name` in a Prometheus exposition, 0 if absent."""
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def served(fleet):
    """Per worker: (requests served, prompt tokens taken from the prefix cache); a dead
    worker counts as (0, 0)."""
    out = []
    for i in range(len(fleet.ports)):
        status, text = http_get(fleet.worker_url(i) + "/metrics")
        if status != 200:
            out.append((0, 0))
            continue
        out.append((int(metric(text, "vllm:time_to_first_token_seconds_count")),
                    int(metric(text, "vllm:prefix_cache_hits_total"))))
    return out


def router_retries(fleet):
    """Requests the router sent again to a worker after a failure (SMG's own counter)."""
    _, text = http_get(fleet.router_metrics_url)
    return sum(float(v) for v in re.findall(r"^smg_worker_retries_total\{[^}]*\} (\S+)$",
                                            text, re.M))


def delta(before, after):
    return [(a[0] - b[0], a[1] - b[1]) for b, a in zip(before, after)]


WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minfer", required=True, help="the minfer binary")
    ap.add_argument("serve_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    serve_args = a.serve_args[1:] if a.serve_args[:1] == ["--"] else a.serve_args
    rng = random.Random(34)
    t0 = time.monotonic()
    with Fleet(a.minfer, serve_args, workers=2) as fleet:
        try:
            run(fleet, rng, t0)
        except BaseException:
            for name in ("router.log", "worker0.log", "worker1.log"):
                path = os.path.join(fleet.log_dir, name)
                if os.path.exists(path):
                    with open(path, errors="replace") as f:
                        tail = f.read()[-3000:]
                    print(f"--- {name} (end) ---\n{tail}", file=sys.stderr)
            raise
        finally:
            fleet.close()
            shutil.rmtree(fleet.log_dir, ignore_errors=True)
    print(f"e2e ok in {time.monotonic() - t0:.1f} s")


def run(fleet, rng, t0):
    print(f"fleet up in {time.monotonic() - t0:.1f} s: router {fleet.router_url}", flush=True)
    client = openai.OpenAI(base_url=fleet.router_url + "/v1", api_key="none", max_retries=0,
                           timeout=60)
    model = client.models.list().data[0].id

    def complete(prompt, max_tokens=4):
        r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                      temperature=0)
        check(len(r.choices) == 1 and r.usage.completion_tokens >= 1, f"an answer: {r}")
        return r

    # (a) One long prefix (a system prompt), different questions after it.
    t = time.monotonic()
    prefix = text(rng, 30)
    before = served(fleet)
    for k in range(6):
        complete(f"{prefix}\nquestion {k}: {text(rng, 3)}")
    d = delta(before, served(fleet))
    counts = sorted(n for n, _ in d)
    check(counts == [0, 6], f"six requests sharing a prefix went to one worker: {d}")
    hits = max(d)[1]
    check(hits > 0, f"the worker that got the shared prefix reused its KV: {d}")
    print(f"(a) shared prefix sticks to one worker {d} in {time.monotonic() - t:.1f} s",
          flush=True)

    # (b) Different prefixes.
    t = time.monotonic()
    before = served(fleet)
    # A request that matches no worker's prefixes goes to the least loaded worker; sent
    # one at a time, both are idle and the tie falls either way (in a measured run of 120
    # such requests, every 24 in a row gave each worker at least 7). At least 4 of 24
    # each: a fair coin fails that once in about 3,600 runs.
    for k in range(24):
        complete(f"{text(rng, 20)}\nquestion {k}")
    d = delta(before, served(fleet))
    check(sum(n for n, _ in d) == 24 and min(n for n, _ in d) >= 4,
          f"24 requests with different prefixes spread over both workers: {d}")
    print(f"(b) different prefixes spread {d} in {time.monotonic() - t:.1f} s", flush=True)

    # (c) Four clients keep requests in flight; the busier worker is killed in the middle.
    t = time.monotonic()
    stop = threading.Event()
    results = {"ok": 0, "errors": []}
    lock = threading.Lock()
    prefixes = [text(rng, 20) for _ in range(4)]

    def client_loop(c):
        k = 0
        while not stop.is_set():
            k += 1
            try:
                complete(f"{prefixes[(c + k) % 4]}\nturn {c}.{k}", max_tokens=16)
                with lock:
                    results["ok"] += 1
            except Exception as e:  # every failure is reported, not only API errors
                with lock:
                    results["errors"].append(f"{type(e).__name__}: {e}")

    retries = router_retries(fleet)
    start = served(fleet)
    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(4)]
    for th in threads:
        th.start()
    try:
        time.sleep(2)
        busy = delta(start, served(fleet))
        # The worker with the most traffic (prefix affinity may have sent it all of it).
        victim = max(range(2), key=lambda i: busy[i][0])
        fleet.kill_worker(victim)
        killed_at = results["ok"]
        fleet.wait_healthy(victim, healthy=False, timeout=30)
        time.sleep(2)
    finally:
        stop.set()
        for th in threads:
            th.join()
    after_kill = results["ok"] - killed_at
    check(not results["errors"],
          f"no request failed with a worker killed: {len(results['errors'])} failures, "
          f"first {results['errors'][:3]}")
    check(busy[victim][0] > 0, f"worker {victim} had traffic before the kill: {busy}")
    check(after_kill > 0, "requests kept succeeding after the kill")
    retries = router_retries(fleet) - retries
    check(retries > 0, "the router retried requests that met the killed worker")
    print(f"(c) worker {victim} killed under load {busy}: {results['ok']} requests, all succeeded "
          f"({after_kill} after the kill, {retries:.0f} retried by the router) "
          f"in {time.monotonic() - t:.1f} s", flush=True)

    # (d) The killed worker restarted on its port: the router takes it back and routes to it.
    t = time.monotonic()
    fleet.start_worker(victim)
    fleet.wait_healthy(victim, timeout=30)
    # The router marks the worker healthy again on its own next probes (about a second
    # apart): until the first request reaches it, it gets none, so its share is counted
    # from there.
    deadline = time.monotonic() + 30
    first = served(fleet)[victim][0]
    k = 0
    while served(fleet)[victim][0] == first:
        check(time.monotonic() < deadline, f"the router sends to restarted worker {victim}")
        k += 1
        complete(f"{text(rng, 20)}\nwhile it rejoins {k}")
    before = served(fleet)
    for k in range(24):
        complete(f"{text(rng, 20)}\nafter the restart {k}")
    d = delta(before, served(fleet))
    check(sum(n for n, _ in d) == 24 and d[victim][0] >= 4,
          f"the restarted worker {victim} serves its share again: {d}")
    print(f"(d) restarted worker rejoined {d} in {time.monotonic() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main()
