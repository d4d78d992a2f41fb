#!/usr/bin/env python3
"""llama-quantize's choice of tensor types (and the bytes it writes) for minfer's
quantization-mix models, the golden file of `minfer quantize`'s mix test.

The models are F32 files written by minfer's own GGUF writer (testing::quant_mix_models):

    cargo run --release -p minfer-models --example write_tiny_models -- DIR
    LLAMA_QUANTIZE=.../llama-quantize python3 scripts/gen_quant_mix_golden.py DIR/mix

llama-quantize comes from the llama.cpp of the llama-cpp-python 0.3.36 sdist, built as the
header of scripts/gen_tiny_reference.py describes (`--target llama-quantize`). For every
model of DIR/mix/manifest.json and every file type below it runs llama-quantize with no
importance matrix and records, per tensor, the type and the SHA-256 of the tensor's bytes
(read back with the `gguf` package). Writes crates/cli/tests/golden/quant_mix.json.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "crates", "cli", "tests", "golden", "quant_mix.json")

# The file types llama-quantize writes without an importance matrix. (IQ1_*, IQ2_*,
# IQ3_XXS, IQ3_XS and Q2_K_S put types on some tensors that it refuses to write without one.)
FTYPES = [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
    "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ3_S", "IQ3_M", "IQ4_NL",
    "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4_MOE", "F16", "BF16",
]


def tensors(path):
    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        data = bytes(t.data.tobytes())
        out[t.name] = [t.tensor_type.name, hashlib.sha256(data).hexdigest()]
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_quant_mix_golden.py DIR/mix")
    src_dir = sys.argv[1]
    exe = os.environ.get("LLAMA_QUANTIZE", "llama-quantize")
    with open(os.path.join(src_dir, "manifest.json")) as f:
        manifest = json.load(f)
    golden = {"llama_quantize": exe.split(os.sep)[-1], "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for m in manifest:
            src = os.path.join(src_dir, m["file"])
            with open(src, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            entry = {"source_sha256": digest, "ftypes": {}}
            for ft in FTYPES:
                out = os.path.join(tmp, f"{m['name']}-{ft}.gguf")
                p = subprocess.run([exe, src, out, ft, "1"], capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(f"llama-quantize {m['name']} {ft} failed:\n{p.stderr[-2000:]}")
                entry["ftypes"][ft] = tensors(out)
                os.remove(out)
                print(m["name"], ft, "ok", file=sys.stderr)
            golden["models"][m["name"]] = entry
    with open(GOLDEN, "w") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
