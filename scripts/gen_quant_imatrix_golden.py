#!/usr/bin/env python3
"""llama-quantize's output with an importance matrix on minfer's quantization-mix models,
the golden file of `minfer quantize --imatrix`'s test.

The models are those of scripts/gen_quant_mix_golden.py (written by
`cargo run --release -p minfer-models --example write_tiny_models -- DIR`, under DIR/mix).
Their importance matrices are committed in crates/cli/tests/golden/imatrix/, made by
llama.cpp's llama-imatrix (same llama.cpp, `--target llama-imatrix`) from the repository
root on the perplexity text, 4 chunks of 64 tokens:

    llama-imatrix -m DIR/mix/STEM.gguf -f crates/runtime/tests/golden/ppl_text.txt \\
        -c 64 --chunks 4 -t 1 -o crates/cli/tests/golden/imatrix/STEM.imatrix.gguf

plus the legacy format for mix-qwen2 (`--output-format dat -o .../mix-qwen2.imatrix.dat`).
Then, from the repository root:

    LLAMA_QUANTIZE=.../llama-quantize python3 scripts/gen_quant_imatrix_golden.py DIR/mix

runs `llama-quantize --imatrix FILE` for every model, matrix file and file type below and
records, per tensor, the type and the SHA-256 of its bytes, and the `quantize.imatrix.*`
keys llama-quantize writes (all but the file path). Writes
crates/cli/tests/golden/quant_imatrix.json.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
IMATRIX_DIR = os.path.join("crates", "cli", "tests", "golden", "imatrix")
GOLDEN = os.path.join(ROOT, "crates", "cli", "tests", "golden", "quant_imatrix.json")

# The file types that need an importance matrix, those whose rule changes with one, and a
# few that only weight their encoders by it.
FTYPES = [
    "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS",
    "IQ3_S", "IQ3_M", "Q2_K_S", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_S", "Q6_K", "IQ4_XS",
    "IQ4_NL", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
]
# The legacy-format file is checked on fewer types.
DAT_FTYPES = ["IQ2_XXS", "Q4_K_M", "IQ4_XS"]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_back(path):
    r = gguf.GGUFReader(path)
    tensors = {}
    for t in r.tensors:
        tensors[t.name] = [t.tensor_type.name, hashlib.sha256(bytes(t.data.tobytes())).hexdigest()]
    meta = {}
    for k, f in r.fields.items():
        if k.startswith("quantize.imatrix.") and k != "quantize.imatrix.file":
            v = f.contents()
            meta[k] = v
    return tensors, meta


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_quant_imatrix_golden.py DIR/mix  (run from the repository root)")
    src_dir = sys.argv[1]
    if not os.path.isdir(IMATRIX_DIR):
        sys.exit(f"run from the repository root ({IMATRIX_DIR} not found)")
    exe = os.environ.get("LLAMA_QUANTIZE", "llama-quantize")
    with open(os.path.join(src_dir, "manifest.json")) as f:
        manifest = json.load(f)
    golden = {"llama_quantize": exe.split(os.sep)[-1], "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for m in manifest:
            src = os.path.join(src_dir, m["file"])
            entry = {"source_sha256": sha256(src), "imatrix": {}}
            for ext, ftypes in [("gguf", FTYPES), ("dat", DAT_FTYPES)]:
                im_name = f"{m['name']}.imatrix.{ext}"
                im = os.path.join(IMATRIX_DIR, im_name)
                if not os.path.exists(im):
                    continue
                runs = {"sha256": sha256(im), "ftypes": {}}
                for ft in ftypes:
                    out = os.path.join(tmp, f"{m['name']}-{ft}.gguf")
                    p = subprocess.run([exe, "--imatrix", im, src, out, ft, "1"],
                                       capture_output=True, text=True)
                    if p.returncode != 0:
                        sys.exit(f"llama-quantize {m['name']} {ft} failed:\n{p.stderr[-2000:]}")
                    tensors, meta = read_back(out)
                    runs["ftypes"][ft] = {"tensors": tensors, "meta": meta}
                    os.remove(out)
                    print(m["name"], im_name, ft, "ok", file=sys.stderr)
                entry["imatrix"][im_name] = runs
            golden["models"][m["name"]] = entry
    with open(GOLDEN, "w") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
