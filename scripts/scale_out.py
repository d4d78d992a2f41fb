#!/usr/bin/env python3
"""N `minfer serve` workers behind one SMG router, all on this machine's loopback.

Usage: scale_out.py [--workers N] [--port PORT] [--minfer PATH] [--policy POLICY]
                    [--router-arg=ARG ...] -- [minfer serve arguments ...]

Starts N workers (`minfer serve ARGS --host 127.0.0.1 --port P`, each on a free port),
waits until every one answers /health with 200 (the model is loaded), then starts the
router (`python3 -m smg launch --backend vllm --policy cache_aware ...`) on PORT with the
workers' URLs, waits until it lists every worker as healthy, prints the router's URL and
keeps everything running until SIGINT or SIGTERM, which stop the router, then the
workers. Clients talk to the router exactly as to one minfer (OpenAI routes).

The router is SMG, the gateway of the SGLang project (`python3 -m pip install smg`). It
reads each worker's vLLM-named metrics (`/metrics`), routes requests that share a prefix
to the worker that already holds it (cache_aware), retries a failed request on another
worker, and probes /health to take a dead worker out and bring a restarted one back; the
probe, retry and circuit-breaker settings below are tuned for workers on one machine,
where a refused connection means the worker is gone, not slow. `--router-arg` passes
any other SMG option through (repeat it; `--router-arg=--log-level=debug`).

Imported, `Fleet` is the same recipe for tests: start, kill and restart single workers.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

# SMG options for workers on loopback: probe every second, take a worker out after two
# failed probes in a row and back after one good one; retry a failed request (on another worker,
# since the failed one is charged a failure) quickly; a worker's circuit breaker opens
# after 3 failures and half-opens after 2 s, so a restarted worker is tried again soon.
ROUTER_DEFAULTS = [
    "--backend", "vllm",
    "--disable-tokenizer-autoload",
    "--health-check-interval-secs", "1",
    "--health-check-timeout-secs", "3",
    "--health-failure-threshold", "2",
    "--health-success-threshold", "1",
    "--retry-max-retries", "5",
    "--retry-initial-backoff-ms", "50",
    "--retry-max-backoff-ms", "1000",
    "--cb-failure-threshold", "3",
    "--cb-timeout-duration-secs", "2",
    "--cb-success-threshold", "1",
    "--log-level", "warn",
]


def free_port(host):
    """A port nothing listens on now (the kernel's pick for a socket bound to 0)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_get(url, timeout=2.0):
    """(status, body) of GET url; status 0 where nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, ValueError):
        return 0, ""


def wait_until(what, cond, timeout, proc=None):
    """Polls cond() until true; fails naming `what` after `timeout` s or once proc exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with status {proc.returncode}")
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not within {timeout} s")


class Fleet:
    """N minfer workers and an SMG router on `host`. Logs go to files under `log_dir`."""

    def __init__(self, minfer, serve_args, workers, router_args=(), policy="cache_aware",
                 host="127.0.0.1", port=None, log_dir=None):
        if workers < 1:
            raise ValueError(f"--workers must be at least 1, not {workers}")
        self.minfer = minfer
        self.serve_args = list(serve_args)
        self.host = host
        self.port = port or free_port(host)
        self.policy = policy
        self.router_args = list(router_args)
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="minfer-scale-out-")
        self.ports = [free_port(host) for _ in range(workers)]
        # SMG's own Prometheus listener (its default port is fixed: two fleets would clash).
        self.metrics_port = free_port(host)
        self.procs = [None] * workers
        self.router = None

    @property
    def router_url(self):
        return f"http://{self.host}:{self.port}"

    @property
    def router_metrics_url(self):
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def worker_url(self, i):
        return f"http://{self.host}:{self.ports[i]}"

    def _log(self, name):
        return open(os.path.join(self.log_dir, name), "ab")

    def start_worker(self, i):
        """Starts worker i on its port (again, after a kill) and waits until it can serve."""
        cmd = [self.minfer, "serve", *self.serve_args,
               "--host", self.host, "--port", str(self.ports[i])]
        with self._log(f"worker{i}.log") as log:
            self.procs[i] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT)
        wait_until(f"worker {i} ({self.worker_url(i)}) ready",
                   lambda: http_get(self.worker_url(i) + "/health")[0] == 200,
                   300, self.procs[i])

    def kill_worker(self, i, sig=signal.SIGKILL):
        """Sends worker i `sig` (SIGKILL by default: a crash, no graceful drain) and reaps it."""
        p = self.procs[i]
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            p.wait()
        self.procs[i] = None

    def router_workers(self):
        """The router's view of its workers: {url: healthy}."""
        status, body = http_get(self.router_url + "/workers")
        if status != 200:
            return {}
        try:
            return {w["url"]: bool(w.get("is_healthy")) for w in json.loads(body)["workers"]}
        except (ValueError, KeyError, TypeError):
            return {}

    def wait_healthy(self, i, healthy=True, timeout=60):
        """Waits until the router reports worker i as healthy (or as not healthy)."""
        url = self.worker_url(i)
        wait_until(f"the router sees worker {i} ({url}) as {'' if healthy else 'un'}healthy",
                   lambda: self.router_workers().get(url) is healthy, timeout, self.router)

    def start(self):
        """Starts the workers (one after another: loading is memory-bound), then the router."""
        for i in range(len(self.ports)):
            self.start_worker(i)
        cmd = [sys.executable, "-m", "smg", "launch",
               "--host", self.host, "--port", str(self.port),
               "--worker-urls", *[self.worker_url(i) for i in range(len(self.ports))],
               "--prometheus-host", self.host, "--prometheus-port", str(self.metrics_port),
               "--policy", self.policy, *ROUTER_DEFAULTS, *self.router_args]
        with self._log("router.log") as log:
            self.router = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT)
        for i in range(len(self.ports)):
            self.wait_healthy(i, timeout=120)
        return self

    def close(self):
        """Stops the router, then every worker (SIGTERM: in-flight requests may finish)."""
        for p in [self.router, *self.procs]:
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc):
        self.close()


def main():
    ap = argparse.ArgumentParser(
        description="N minfer workers behind an SMG router on loopback",
        usage="%(prog)s [options] -- [minfer serve arguments ...]")
    ap.add_argument("--workers", type=int, default=2, help="number of minfer workers (2)")
    ap.add_argument("--port", type=int, default=8080, help="the router's port (8080)")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address of the router and the workers (127.0.0.1)")
    ap.add_argument("--minfer", default="minfer", help="the minfer binary (from PATH)")
    ap.add_argument("--policy", default="cache_aware", help="SMG's routing policy (cache_aware)")
    ap.add_argument("--router-arg", action="append", default=[],
                    help="one more SMG option, passed through (repeatable)")
    ap.add_argument("--log-dir", help="where the logs go (a new temporary directory)")
    ap.add_argument("serve_args", nargs=argparse.REMAINDER,
                    help="after --: arguments of every `minfer serve` (model, slots, ...)")
    a = ap.parse_args()
    serve_args = a.serve_args[1:] if a.serve_args[:1] == ["--"] else a.serve_args
    if a.workers < 1:
        ap.error(f"--workers must be at least 1, not {a.workers}")
    for fixed in ("--host", "--port"):
        if fixed in serve_args:
            ap.error(f"{fixed} after -- is chosen by the launcher; use --host/--port before --")
    try:
        import smg  # noqa: F401  (only to fail early with the remedy)
    except ImportError:
        sys.exit("the SMG router is not installed: python3 -m pip install smg")
    fleet = Fleet(a.minfer, serve_args, a.workers, a.router_arg, a.policy, a.host, a.port,
                  a.log_dir)
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    try:
        with fleet:
            workers = " ".join(fleet.worker_url(i) for i in range(a.workers))
            print(f"scale_out: router on {fleet.router_url} (its metrics on "
                  f"{fleet.router_metrics_url}), workers {workers}, logs in {fleet.log_dir}",
                  flush=True)
            while not stop.is_set():
                dead = [i for i, p in enumerate(fleet.procs) if p.poll() is not None]
                if fleet.router.poll() is not None:
                    sys.exit(f"scale_out: the router exited (see {fleet.log_dir}/router.log)")
                for i in dead:
                    print(f"scale_out: worker {i} exited; restarting it", flush=True)
                    fleet.start_worker(i)
                stop.wait(1)
    except RuntimeError as e:
        sys.exit(f"scale_out: {e} (logs in {fleet.log_dir})")


if __name__ == "__main__":
    main()
