"""Starting and stopping a server process on loopback, shared by the serving benchmarks
(bench_serve.py, bench_prefix_cache.py, soak_cache.py)."""
import http.client
import os
import signal
import socket
import subprocess
import time


def free_port():
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, log=subprocess.DEVNULL):
    """Starts `cmd` in a session of its own (so `stop` reaches its children too)."""
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(port, proc, timeout=300):
    """Waits until GET /health answers 200; False when the process exits or time runs out."""
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            return False
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.3)
    return False


def stop(proc):
    """SIGTERM to the process's session, SIGKILL after 20 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
