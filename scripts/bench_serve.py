#!/usr/bin/env python3
"""Aggregate serving throughput of minfer and llama-server, paired, at several client counts.

    python3 scripts/bench_serve.py --minfer target/release/minfer \
        --llama-server LLAMA_BIN/llama-server --model MODEL.gguf \
        --clients 4 8 --threads 2 --ctx-per-slot 2048 --requests 3 --tokens 128 --rounds 3

For every round and client count N, each server is started in turn (the order alternates
A B / B A between rounds, since these machines are noisy) with N slots (`--slots N` /
`-np N`), N x ctx-per-slot positions of context and the same threads, and N streaming
clients each send `--requests` completions one after another over loopback. Every
request is llama-server's native `POST /completion` with `ignore_eos`, so both servers
generate exactly `--tokens` tokens per request whatever the text; prompts differ per
request (no shared prefix to reuse) and are the same for both servers.

Reported per server and N: aggregate generated tokens per second (all tokens over the
wall time from the first request to the last answer) and the time to first token (the
first streamed chunk with text), median and p90 over the requests; the ratio is
minfer / llama-server per round, median and interquartile range over rounds. Each
server otherwise runs with its defaults (llama-server: f16 KV cache, flash attention
auto; minfer: its default KV format), as a user would start it.

Exit status: 0 when every run completed, 1 when a server failed or a request did not
generate its tokens.
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time

from local_server import free_port, start, stop, wait_ready

TOPICS = [
    "how a hash map handles collisions",
    "the steps of the TCP three-way handshake",
    "why the sky is blue",
    "how a compiler turns source code into machine code",
    "the difference between a process and a thread",
    "how public-key cryptography works",
    "what a B-tree is and why databases use it",
    "how garbage collection works in managed languages",
    "the causes of the French Revolution",
    "how photosynthesis stores energy",
    "the rules of chess for a beginner",
    "how a neural network learns from examples",
    "what makes a good unit test",
    "how DNS resolves a domain name",
    "the history of the printing press",
    "how vaccines train the immune system",
]


def prompt(i):
    """The i-th request's prompt: a chat-style instruction on its own topic."""
    t = TOPICS[i % len(TOPICS)]
    return f"Question {i}: explain {t}, in detail and step by step.\nAnswer:"


def server(kind, args, slots, port, log):
    ctx = str(slots * args.ctx_per_slot)
    if kind == "minfer":
        cmd = [args.minfer, "serve", "-m", args.model, "--slots", str(slots), "-c", ctx,
               "-t", str(args.threads), "--port", str(port)]
    else:
        cmd = [args.llama_server, "-m", args.model, "-np", str(slots), "-c", ctx,
               "-t", str(args.threads), "--port", str(port), "--host", "127.0.0.1"]
    return start(cmd, log)


def one(port, text, tokens):
    """One streamed /completion: (seconds to the first text chunk, tokens generated)."""
    body = json.dumps({"prompt": text, "n_predict": tokens, "ignore_eos": True,
                       "temperature": 0, "stream": True, "cache_prompt": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/completion", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]!r}")
    ttft, n = None, 0
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        v = json.loads(line[6:])
        if ttft is None and v.get("content"):
            ttft = time.perf_counter() - t0
        if v.get("stop"):
            n = v.get("tokens_predicted", 0)
    c.close()
    return (ttft if ttft is not None else time.perf_counter() - t0), n


def load(port, clients, args, base):
    """Runs `clients` streaming clients; (aggregate t/s, TTFTs, failures)."""
    ttfts, tokens, failures = [], [0], []
    lock = threading.Lock()

    def client(c):
        for j in range(args.requests):
            try:
                t, n = one(port, prompt(base + c * args.requests + j), args.tokens)
            except (OSError, RuntimeError, ValueError) as e:
                with lock:
                    failures.append(str(e))
                continue
            with lock:
                ttfts.append(t)
                tokens[0] += n
                if n != args.tokens:
                    failures.append(f"{n} of {args.tokens} tokens")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tokens[0] / (time.perf_counter() - t0), ttfts, failures


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, round((len(v) - 1) * p))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minfer", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--clients", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-per-slot", type=int, default=2048)
    ap.add_argument("--requests", type=int, default=3, help="requests per client")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per request")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args()

    runs = []  # (clients, round, kind, t/s, ttfts)
    ok = True
    logdir = tempfile.mkdtemp(prefix="bench_serve.")
    for r in range(args.rounds):
        for n in args.clients:
            order = ["minfer", "llama"] if r % 2 == 0 else ["llama", "minfer"]
            for kind in order:
                port = free_port()
                with open(os.path.join(logdir, f"{kind}-{n}-{r}.log"), "w") as log:
                    proc = server(kind, args, n, port, log)
                    try:
                        if not wait_ready(port, proc):
                            print(f"{kind}: the server did not become ready "
                                  f"(log in {log.name})", file=sys.stderr)
                            ok = False
                            continue
                        one(port, "Hello", 4)  # warm-up, not counted
                        tps, ttfts, bad = load(port, n, args, base=1000 * r)
                    finally:
                        stop(proc)
                if bad:
                    print(f"{kind} at {n} clients: {len(bad)} failures, first: {bad[0]}",
                          file=sys.stderr)
                    ok = False
                runs.append({"clients": n, "round": r, "server": kind, "tps": tps,
                             "ttft": ttfts})
                print(f"round {r} clients {n} {kind:>6}: {tps:7.1f} t/s, TTFT p50 "
                      f"{pct(ttfts, 0.5) * 1000:6.0f} ms", flush=True)

    print()
    print("| clients | minfer t/s | llama-server t/s | ratio (median) | IQR "
          "| minfer TTFT p50 / p90 | llama-server TTFT p50 / p90 |")
    print("|---:|---:|---:|---:|---|---:|---:|")
    for n in args.clients:
        def of(kind):
            return [x for x in runs if x["clients"] == n and x["server"] == kind]
        m, l = of("minfer"), of("llama")
        if not m or not l:
            continue
        ratios = sorted(a["tps"] / b["tps"] for a, b in zip(m, l))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        mt = [t for x in m for t in x["ttft"]]
        lt = [t for x in l for t in x["ttft"]]
        print(f"| {n} | {statistics.median(x['tps'] for x in m):.1f} "
              f"| {statistics.median(x['tps'] for x in l):.1f} "
              f"| **{statistics.median(ratios):.2f}x** | {q[0]:.2f}-{q[2]:.2f} "
              f"| {pct(mt, 0.5) * 1000:.0f} / {pct(mt, 0.9) * 1000:.0f} ms "
              f"| {pct(lt, 0.5) * 1000:.0f} / {pct(lt, 0.9) * 1000:.0f} ms |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
