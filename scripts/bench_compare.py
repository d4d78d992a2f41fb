#!/usr/bin/env python3
"""Side-by-side throughput of minfer and llama.cpp on the same GGUF with the same threads.

The two programs alternate A B B A over several rounds (these machines drift by +-15% from
one run to the next, so only paired ratios are meaningful); the script prints, per test,
each program's median t/s and the median minfer/llama.cpp ratio with its interquartile range.

llama-bench comes from the sdist that pins llama.cpp (see gen_llama_reference.py for the
build); pass its path with --llama-bench or set LLAMA_BENCH. If neither is given, the script
builds it under ./target/llama.cpp from the sdist fetched with pip.

    python3 scripts/bench_compare.py [--model PATH] [--threads 2] [--rounds 10] \
        [--pp 512] [--tg 128] [--depth 0] [--reps 1] [--llama-bench PATH] \
        [--ik-bench PATH [--ik-arg=-rtr --ik-arg=1]] [--minfer-isa avx2] \
        [--baseline PATH [--baseline-env K=V ...] [--no-llama]]

--depth N measures pp and tg after N tokens already in the context: `minfer bench -d N`
beside `llama-bench -d N` (its --n-depth).

--ik-bench adds ik_llama.cpp's llama-bench (or set IK_LLAMA_BENCH) to every round, and
the script prints the paired minfer/ik_llama.cpp ratio too. --ik-arg passes one more
argument to its runs (repeatable: `--ik-arg=-rtr --ik-arg=1` for run-time repacking).
Its llama-bench has no depth option: at a depth, tg runs as `-gp N,TG` (TG tokens
generated after an N-token prompt, the same measurement), and pp at a depth, which it
cannot measure, is left to the other programs.

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


def run_llama(binary, model, threads, test, n, reps, depth=0):
    p, g = (n, 0) if test == "pp" else (0, n)
    extra = ["-d", str(depth)] if depth else []
    out = subprocess.run([binary, "-m", model, "-t", str(threads), "-p", str(p), "-n", str(g),
                          "-r", str(reps), "-o", "json"] + extra, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)[0]["avg_ts"]


def ik_measures(test, depth):
    """Whether ik_llama.cpp's llama-bench can run `test` at `depth` (it has tg at a depth,
    as -gp, but no pp at one)."""
    return depth == 0 or test == "tg"


def run_ik(binary, model, threads, test, n, reps, depth=0, extra=()):
    """ik_llama.cpp's llama-bench: -p/-n as llama-bench, tg at a depth as `-gp DEPTH,N`."""
    if depth:
        sizes = ["-p", "0", "-n", "0", "-gp", f"{depth},{n}"]
    else:
        p, g = (n, 0) if test == "pp" else (0, n)
        sizes = ["-p", str(p), "-n", str(g)]
    out = subprocess.run([binary, "-m", model, "-t", str(threads)] + sizes
                         + ["-r", str(reps), "-o", "json"] + list(extra),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[0]["avg_ts"]


def minfer_env(isa):
    """The environment of minfer's runs: MINFER_ISA set to `isa` when one is given."""
    env = dict(os.environ)
    if isa:
        env["MINFER_ISA"] = isa
    return env


def run_minfer(binary, model, threads, test, n, reps, isa=None, extra_env=(), depth=0):
    p, g = (n, 0) if test == "pp" else (0, n)
    env = minfer_env(isa)
    env.update(extra_env)
    # -d only when asked: a baseline built before it existed still runs at depth 0.
    extra = ["-d", str(depth)] if depth else []
    out = subprocess.run([binary, "bench", "-m", model, "-t", str(threads), "-p", str(p),
                          "-n", str(g), "-r", str(reps), "-o", "json"] + extra,
                         capture_output=True, text=True, check=True, env=env).stdout
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
    ap.add_argument("--depth", type=int, default=0,
                    help="tokens already in the context when pp and tg start (minfer "
                         "bench -d, llama-bench -d, ik_llama.cpp -gp for tg)")
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"))
    ap.add_argument("--ik-bench", default=os.environ.get("IK_LLAMA_BENCH"),
                    help="ik_llama.cpp's llama-bench, run in every round beside the others")
    ap.add_argument("--ik-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for ik_llama.cpp's runs (repeatable)")
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
    if a.depth < 0:
        sys.exit(f"--depth {a.depth}: expected 0 or more tokens")
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
    if a.ik_bench:
        print(f"isa: ik_llama.cpp {llama_isa(a.ik_bench, a.model, a.threads)}")
    tests = [(t, n) for t, n in (("pp", a.pp), ("tg", a.tg)) if n > 0]
    at = f" @ d{a.depth}" if a.depth else ""
    # The ratio each round prints: against llama.cpp, else against the baseline.
    other = "baseline" if llama is None else "llama.cpp"
    for test, n in tests:
        with_ik = a.ik_bench is not None and ik_measures(test, a.depth)
        if a.ik_bench and not with_ik:
            print(f"{test}{n}{at}: ik_llama.cpp's llama-bench has no pp at a depth; "
                  "it sits this test out", file=sys.stderr)
        programs = (["minfer"] + ([] if llama is None else ["llama.cpp"])
                    + (["baseline"] if a.baseline else [])
                    + (["ik_llama.cpp"] if with_ik else []))
        runs = {p: [] for p in programs}
        for r in range(a.rounds):
            row = {}
            for prog in round_order(programs, r):
                if prog == "minfer":
                    row[prog] = run_minfer(a.minfer, a.model, a.threads, test, n, a.reps,
                                           a.minfer_isa, depth=a.depth)
                elif prog == "baseline":
                    row[prog] = run_minfer(a.baseline, a.model, a.threads, test, n, a.reps,
                                           a.minfer_isa, base_env, a.depth)
                elif prog == "ik_llama.cpp":
                    row[prog] = run_ik(a.ik_bench, a.model, a.threads, test, n, a.reps,
                                       a.depth, a.ik_arg)
                else:
                    row[prog] = run_llama(llama, a.model, a.threads, test, n, a.reps,
                                          a.depth)
            for prog in programs:
                runs[prog].append(row[prog])
            line = "  ".join(f"{p} {row[p]:8.2f}" for p in programs)
            print(f"  round {r + 1:2d} {test}{n}{at}: {line}  ratio "
                  f"{row['minfer'] / row[other]:.3f}", file=sys.stderr)
        ms = runs["minfer"]
        if with_ik:
            ks = runs["ik_llama.cpp"]
            q1, med, q3 = paired(ms, ks)
            print(f"{test}{n}{at}: ik_llama.cpp {statistics.median(ks):.2f} t/s, "
                  f"minfer/ik_llama.cpp {med:.3f} (IQR {q1:.3f}-{q3:.3f})")
        if llama is None:
            bs = runs["baseline"]
            q1, med, q3 = paired(ms, bs)
            print(f"{test}{n}{at}: minfer {statistics.median(ms):.2f} t/s, baseline "
                  f"{statistics.median(bs):.2f} t/s, minfer/baseline {med:.3f} "
                  f"(IQR {q1:.3f}-{q3:.3f}, {a.rounds} rounds, -t {a.threads})")
            continue
        ls = runs["llama.cpp"]
        q1, med, q3 = paired(ms, ls)
        print(f"{test}{n}{at}: minfer {statistics.median(ms):.2f} t/s, llama.cpp "
              f"{statistics.median(ls):.2f} t/s, ratio {med:.3f} (IQR {q1:.3f}-{q3:.3f}, "
              f"{a.rounds} rounds, -t {a.threads})")
        if a.baseline:
            bs = runs["baseline"]
            q1, med, q3 = paired(ms, bs)
            lq1, lmed, lq3 = paired(bs, ls)
            print(f"{test}{n}{at}: baseline {statistics.median(bs):.2f} t/s; minfer/baseline "
                  f"{med:.3f} (IQR {q1:.3f}-{q3:.3f}); baseline/llama.cpp {lmed:.3f} "
                  f"(IQR {lq1:.3f}-{lq3:.3f})")


if __name__ == "__main__":
    main()
