#!/usr/bin/env bash
# Every check of the CUDA backend that needs a GPU, in one run, on a fresh GPU machine
# with this repository and a CUDA driver (libcuda) installed: builds with the `cuda`
# feature, installs NVRTC from PyPI when the machine has none, pulls the default model,
# then runs, with MINFER_CUDA_TESTS=require (so a missing device fails instead of
# skipping):
#   1. the op-case table and the int8 prefill matmul on CUDA,
#   2. the default model: teacher-forced top-1 against the CPU (>= 99%), perplexity
#      (within 0.5%), CUDA Graph replay bit parity against direct launches,
#   3. the benchmark: decode and prefill tokens/s, decode's share of the H200's memory
#      bandwidth, batched throughput at 1/4/16 streams.
# Each step's output goes to target/gpu_check/<step>.log; the RESULT lines of all of them are
# collected in target/gpu_check/results.txt. Exits non-zero if any check fails (the others
# still run). Usage: scripts/gpu_check.sh [output-dir]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/gpu_check}"
mkdir -p "$out"
results="$out/results.txt"
: >"$results"
status=0

note() { echo "$*" | tee -a "$results"; }

note "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%FT%TZ)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$results"

# NVRTC compiles the kernels at run time; a driver-only machine gets it from PyPI.
if ! ldconfig -p 2>/dev/null | grep -q libnvrtc; then
    nvrtc_dir="${XDG_CACHE_HOME:-$HOME/.cache}/minfer-ci/nvrtc"
    if [ ! -e "$nvrtc_dir/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
        python3 -m pip install -q --disable-pip-version-check --target "$nvrtc_dir" nvidia-cuda-nvrtc-cu12 || status=1
    fi
    export LD_LIBRARY_PATH="$nvrtc_dir/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

export MINFER_CUDA_TESTS=require
unset MINFER_CUDA_GRAPHS MINFER_GRAPH_TRACE MINFER_PROFILE MINFER_BACKENDS

step() {
    local name="$1"
    shift
    local t0=$SECONDS
    if "$@" >"$out/$name.log" 2>&1; then
        note "PASS $name ($((SECONDS - t0)) s)"
    else
        note "FAIL $name ($((SECONDS - t0)) s): see $out/$name.log"
        tail -n 30 "$out/$name.log"
        status=1
    fi
    grep -h '^RESULT ' "$out/$name.log" | sed "s/^RESULT /  /" | tee -a "$results"
}

step build cargo build --release -p minfer-cli --features cuda
step pull ./target/release/minfer pull
step unit cargo test --release -p minfer-cuda --lib -- --nocapture
step op_cases cargo test --release -p minfer-cuda --test op_cases --test prefill --test engine --test model -- --nocapture
step default_model cargo test --release -p minfer-cuda --test default_model -- --nocapture --test-threads 1
step bench cargo test --release -p minfer-cuda --test bench -- --ignored --nocapture
step cli_bench ./target/release/minfer bench --backend cuda
cat "$out/cli_bench.log" >>"$results"
note "done: status $status"
exit $status
