#!/usr/bin/env python3
"""Side-by-side throughput of minfer and llama.cpp on the same GGUF with the same threads.

The two programs alternate A B B A over several rounds (these machines drift by +-15% from
one run to the next, so only paired ratios are meaningful); the script prints, per test,
each program's median t/s and the median minfer/llama.cpp ratio with its interquartile range.

llama-bench comes from the sdist that pins llama.cpp (see gen_llama_reference.py for the
build); pass its path with --llama-bench or set LLAMA_BENCH. If neither is given, the script
builds it under ./target/llama.cpp from the sdist fetched with pip.

    python3 scripts/bench_compare.py [--model PATH] [--threads 2] [--rounds 10] \
        [--pp 512] [--tg 128] [--reps 1] [--llama-bench PATH] [--minfer-isa avx2] \
        [--baseline PATH [--baseline-env K=V ...] [--no-llama]]

--baseline adds a second minfer, e.g. a build of the previous commit, to every round: the
three programs then rotate through all six orders (A B C, C B A, B C A, ...), and the
script also prints the paired minfer/baseline ratio, which is how "does not regress
against the previous commit" is measured. --baseline-env sets variables for the
baseline's runs only (with --baseline pointing at the same binary it A/Bs a switch such
as MINFER_FUSE).
--no-llama (with --baseline) leaves llama.cpp out: minfer against the baseline alone.

--minfer-isa caps minfer's kernels (MINFER_ISA for its runs only: `avx2` against a
llama.cpp built for AVX2 alone compares like with like on an AVX-512 host); without it
minfer uses MINFER_ISA from the environment, or the best the CPU has.

Before the rounds it prints the instruction set each program runs with: minfer's from the
CPU backend line of `minfer info` (its matmul kernels: avx2, avx2+vnni or scalar, after
MINFER_ISA), llama.cpp's from the ggml CPU features line (system_info) that
llama-perplexity, built beside llama-bench, prints at start, or else from the GGML_*
instruction-set switches of the build's CMakeCache.txt.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SDIST = "llama-cpp-python==0.3.36"


def build_llama_bench():
    """Builds llama-bench from the pinned sdist, reusing an earlier build."""
    work = os.path.join(ROOT, "target", "llama.cpp")
    binary = os.path.join(work, "build", "bin", "llama-bench")
    if os.path.exists(binary):
        return binary
    os.makedirs(work, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                    "llama-cpp-python", "-d", work, SDIST], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "cmake", "ninja"], check=True)
    tarball = [f for f in os.listdir(work) if f.endswith(".tar.gz")][0]
    subprocess.run(["tar", "xzf", tarball], cwd=work, check=True)
    src = os.path.join(work, tarball[: -len(".tar.gz")], "vendor", "llama.cpp")
    build = os.path.join(work, "build")
    subprocess.run(["cmake", "-S", src, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"], check=True)
    subprocess.run(["cmake", "--build", build, "-j2", "--target", "llama-bench"], check=True)
    return binary


def run_llama(binary, model, threads, test, n, reps):
    p, g = (n, 0) if test == "pp" else (0, n)
    out = subprocess.run([binary, "-m", model, "-t", str(threads), "-p", str(p), "-n", str(g),
                          "-r", str(reps), "-o", "json"], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)[0]["avg_ts"]


def minfer_env(isa):
    """The environment of minfer's runs: MINFER_ISA set to `isa` when one is given."""
    env = dict(os.environ)
    if isa:
        env["MINFER_ISA"] = isa
    return env


def run_minfer(binary, model, threads, test, n, reps, isa=None, extra_env=()):
    p, g = (n, 0) if test == "pp" else (0, n)
    env = minfer_env(isa)
    env.update(extra_env)
    out = subprocess.run([binary, "bench", "-m", model, "-t", str(threads), "-p", str(p),
                          "-n", str(g), "-r", str(reps), "-o", "json"], capture_output=True,
                         text=True, check=True, env=env).stdout
    return json.loads(out)[0]["avg_ts"]


def minfer_isa(binary, model, isa=None):
    """The CPU backend's device line of `minfer info`, e.g. `host CPU (avx2+vnni)`."""
    out = subprocess.run([binary, "info", "-m", model, "--json"], capture_output=True,
                         text=True, check=True, env=minfer_env(isa)).stdout
    for b in json.loads(out).get("backends", []):
        if b.get("name") == "cpu":
            return b.get("device") or "unknown"
    return "unknown"


def llama_isa(bench_binary, model, threads):
    """ggml's CPU feature flags that are on, from llama-perplexity's system_info line."""
    ppl = os.path.join(os.path.dirname(bench_binary), "llama-perplexity")
    if not os.path.exists(ppl):
        return llama_build_isa(bench_binary)
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write("one two three four five six seven eight nine ten\n" * 4)
        f.flush()
        r = subprocess.run([ppl, "-m", model, "-f", f.name, "-t", str(threads), "-c", "8",
                            "--chunks", "1"], capture_output=True, text=True)
    for line in (r.stdout + r.stderr).splitlines():
        if "system_info" in line and "CPU :" in line:
            feats = line.split("CPU :", 1)[1].split("|")
            on = [x.split("=")[0].strip() for x in feats if x.strip().endswith("= 1")]
            return " ".join(on)
    return "unknown (no system_info line)"


def llama_build_isa(bench_binary):
    """The instruction-set switches that are on in the CMakeCache.txt of llama-bench's build
    (`bin/` sits in the build directory), for a build without llama-perplexity."""
    cache = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(bench_binary))),
                         "CMakeCache.txt")
    if not os.path.exists(cache):
        return "unknown (no llama-perplexity and no CMakeCache.txt beside llama-bench)"
    on, native = [], False
    with open(cache) as f:
        for line in f:
            name, _, value = line.strip().partition("=")
            key = name.split(":")[0]
            if key == "GGML_NATIVE":
                native = value.upper() in ("ON", "1", "TRUE")
            elif key.startswith("GGML_") and value.upper() in ("ON", "1", "TRUE"):
                feat = key[len("GGML_"):]
                if feat.startswith(("AVX", "FMA", "F16C", "BMI2", "SSE", "AMX")):
                    on.append(feat)
    if native:
        return "native build (GGML_NATIVE=ON: the host's instruction sets)"
    return "build flags: " + (" ".join(on) or "none")


def quartiles(xs):
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return q[0], q[1], q[2]


def paired(xs, ys):
    """Quartiles of the per-round ratios xs[i] / ys[i]."""
    return quartiles([x / y for x, y in zip(xs, ys)])


def round_order(programs, r):
    """The order of round `r`: rotated by one every two rounds and reversed on odd ones, so
    two programs run A B, B A, B A, A B and three run through all six orders."""
    k = (r // 2) % len(programs)
    order = programs[k:] + programs[:k]
    return order[::-1] if r % 2 else order


def env_pairs(items):
    """`K=V` strings as (K, V) pairs; exits with a message naming a malformed one."""
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            sys.exit(f"--baseline-env {item!r}: expected NAME=VALUE")
        pairs.append((key, value))
    return pairs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"))
    ap.add_argument("--minfer", default=os.path.join(ROOT, "target", "release", "minfer"))
    ap.add_argument("--minfer-isa", default=None, choices=["avx2", "scalar"],
                    help="MINFER_ISA for minfer's runs (e.g. avx2 against an AVX2-only "
                         "llama.cpp build)")
    ap.add_argument("--baseline", default=None,
                    help="a second minfer binary (e.g. the previous commit's) run in every "
                         "round; prints minfer/baseline ratios too")
    ap.add_argument("--baseline-env", action="append", default=[], metavar="K=V",
                    help="environment for the baseline's runs only (repeatable)")
    ap.add_argument("--no-llama", action="store_true",
                    help="with --baseline: pair minfer against the baseline only, without "
                         "building or running llama-bench")
    a = ap.parse_args()
    base_env = env_pairs(a.baseline_env)
    if base_env and a.baseline is None:
        sys.exit("--baseline-env needs --baseline (it may name the same binary as --minfer)")
    if a.no_llama and a.baseline is None:
        sys.exit("--no-llama needs --baseline (there is nothing else to pair minfer with)")
    if a.model is None:
        a.model = subprocess.run([a.minfer, "pull"], capture_output=True, text=True,
                                 check=True).stdout.strip()
    llama = None if a.no_llama else (a.llama_bench or build_llama_bench())
    print(f"isa: minfer {minfer_isa(a.minfer, a.model, a.minfer_isa)}"
          + ("" if llama is None else f"; llama.cpp {llama_isa(llama, a.model, a.threads)}"))
    if a.baseline:
        print(f"isa: baseline {minfer_isa(a.baseline, a.model, a.minfer_isa)}")
    tests = [(t, n) for t, n in (("pp", a.pp), ("tg", a.tg)) if n > 0]
    programs = (["minfer"] + ([] if llama is None else ["llama.cpp"])
                + (["baseline"] if a.baseline else []))
    # The ratio each round prints: against llama.cpp, else against the baseline.
    other = "baseline" if llama is None else "llama.cpp"
    for test, n in tests:
        runs = {p: [] for p in programs}
        for r in range(a.rounds):
            row = {}
            for prog in round_order(programs, r):
                if prog == "minfer":
                    row[prog] = run_minfer(a.minfer, a.model, a.threads, test, n, a.reps,
                                           a.minfer_isa)
                elif prog == "baseline":
                    row[prog] = run_minfer(a.baseline, a.model, a.threads, test, n, a.reps,
                                           a.minfer_isa, base_env)
                else:
                    row[prog] = run_llama(llama, a.model, a.threads, test, n, a.reps)
            for prog in programs:
                runs[prog].append(row[prog])
            line = "  ".join(f"{p} {row[p]:8.2f}" for p in programs)
            print(f"  round {r + 1:2d} {test}{n}: {line}  ratio "
                  f"{row['minfer'] / row[other]:.3f}", file=sys.stderr)
        ms = runs["minfer"]
        if llama is None:
            bs = runs["baseline"]
            q1, med, q3 = paired(ms, bs)
            print(f"{test}{n}: minfer {statistics.median(ms):.2f} t/s, baseline "
                  f"{statistics.median(bs):.2f} t/s, minfer/baseline {med:.3f} "
                  f"(IQR {q1:.3f}-{q3:.3f}, {a.rounds} rounds, -t {a.threads})")
            continue
        ls = runs["llama.cpp"]
        q1, med, q3 = paired(ms, ls)
        print(f"{test}{n}: minfer {statistics.median(ms):.2f} t/s, llama.cpp "
              f"{statistics.median(ls):.2f} t/s, ratio {med:.3f} (IQR {q1:.3f}-{q3:.3f}, "
              f"{a.rounds} rounds, -t {a.threads})")
        if a.baseline:
            bs = runs["baseline"]
            q1, med, q3 = paired(ms, bs)
            lq1, lmed, lq3 = paired(bs, ls)
            print(f"{test}{n}: baseline {statistics.median(bs):.2f} t/s; minfer/baseline "
                  f"{med:.3f} (IQR {q1:.3f}-{q3:.3f}); baseline/llama.cpp {lmed:.3f} "
                  f"(IQR {lq1:.3f}-{lq3:.3f})")


if __name__ == "__main__":
    main()
