#!/usr/bin/env bash
# The whole test suite, from a fresh clone: checks formatting and lints, installs the
# `openai` and `ollama` Python clients and `jsonschema` (the server's end-to-end tests use them) and tmux
# if absent (the chat test drives a terminal), builds minfer, pulls the default model
# through minfer's own `pull` (verified by size and sha256), runs every test in the
# workspace, then runs the graph, models and runtime tests again under the `checked`
# profile (optimised, with debug assertions and overflow checks, so the graph invariant
# checks and integer overflow traps run too). The wgpu backend's tests need a Vulkan
# adapter; on a machine without a GPU, Mesa's software driver (lavapipe) provides one,
# installed here when absent. Those tests fail, not skip, when no adapter is found.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v dpkg >/dev/null && ! dpkg -s mesa-vulkan-drivers >/dev/null 2>&1; then
    sudo_if_needed=""
    [ "$(id -u)" -ne 0 ] && sudo_if_needed="sudo"
    $sudo_if_needed apt-get update -q
    $sudo_if_needed apt-get install -y -q mesa-vulkan-drivers
fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
python3 -m pip install -q --disable-pip-version-check openai ollama jsonschema
# The chat test drives `minfer chat` in a real terminal through tmux.
if ! command -v tmux >/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
    $sudo apt-get update -q && $sudo apt-get install -y -q tmux
fi
cargo build --release --locked --bin minfer
./target/release/minfer pull
cargo test --release --locked --workspace
# Without the runtime's default wgpu feature: the checked pass is for the graph invariants,
# which the CPU tests exercise, and skips compiling the wgpu stack a second time.
cargo test --profile checked --locked --no-default-features -p minfer-graph -p minfer-models -p minfer-runtime
