#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs the `openai` Python client (the server's
# end-to-end test uses it), builds minfer, pulls the default model through minfer's own
# `pull` (verified by size and sha256), then runs every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install -q --disable-pip-version-check openai
cargo build --release --locked --bin minfer
./target/release/minfer pull
cargo test --release --locked --workspace
