#!/usr/bin/env python3
"""llama.cpp reference outputs for minfer's tiny random-weight models.

The models are written by minfer's own GGUF writer (crates/models, testing::golden_models):

    cargo run -p minfer-models --example write_tiny_models -- DIR

llama.cpp and its Python bindings come from the llama-cpp-python 0.3.36 sdist, fetched and
unpacked as the header of scripts/gen_llama_reference.py describes, but built for a portable
x86-64 with AVX2 rather than for the build host (the committed outputs come from this build;
a native build's F16 logits differ from it by about 4e-3, well inside their tolerance):

    cd DIR/llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX=ON \
        -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    cmake --build build2 -j2 --target llama
    PYTHONPATH=DIR/llama_cpp_python-0.3.36 \
    LLAMA_CPP_LIB_PATH=DIR/llama_cpp_python-0.3.36/vendor/llama.cpp/build2/bin \
    python3 scripts/gen_tiny_reference.py MODEL_DIR

For every model of MODEL_DIR/manifest.json it feeds PROMPT_IDS as token ids (no tokenizer
involved), records the logits of the last prompt position (all n_vocab of them) and a
N_GREEDY-token greedy continuation with, for each step, the TOP highest logits and their
ids and the top-1 minus top-2 margin; then writes crates/models/tests/golden/tiny_reference.json (format: tests/golden/README.md).

llama.cpp runs on the CPU with 2 threads, an F32 KV cache and flash attention off, so the
only approximations on its side are its matmul paths (activations rounded to F16 against
F16 weights, quantized to Q8_0 / Q8_K against quantized weights).
"""
import hashlib
import json
import os
import sys

import numpy as np
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "crates", "models", "tests", "golden", "tiny_reference.json")

PROMPT_IDS = [72, 101, 108, 108, 111, 44, 32, 300]
N_GREEDY = 32
TOP = 8
GGML_TYPE_F32 = 0

# Allowed max |logit difference|, as a fraction of the standard deviation of llama.cpp's
# last-position logits, by matrix type. Both sides decode the same weight bytes, so the coding
# error of a type is not part of the difference; what is, is llama.cpp's matmul path: it rounds
# activations to F16 (F16 weights) or quantizes them to the type's partner, Q8_0 (Q8_0, IQ4_NL,
# MXFP4) or Q8_K (k-quants, IQ4_XS, the lattice i-quants, TQ1_0/TQ2_0), where an implementation
# that keeps activations in f32 differs by that rounding alone. The bound is set by the
# partner, since the weight type only scales the products the rounding error enters. Observed
# with minfer's graph on f32 reference kernels (max over prefill and teacher-forced decode):
# F32 2e-6, F16 1.4e-3, Q8_0 0.033-0.050, IQ4_NL 0.055, MXFP4 0.057; Q4_K 0.079, Q6_K 0.108,
# IQ4_XS 0.080, IQ3_S 0.082, IQ3_XXS 0.085, IQ2_S 0.095, IQ2_XS 0.093, IQ2_XXS 0.076,
# IQ1_M 0.073, IQ1_S 0.087, TQ2_0/TQ1_0 0.082.
Q8_0_PARTNER = 0.15
Q8_K_PARTNER = 0.25
TOLERANCE = {
    "F32": 1e-4, "F16": 1e-2,
    "Q8_0": Q8_0_PARTNER, "IQ4_NL": Q8_0_PARTNER, "MXFP4": Q8_0_PARTNER,
    "Q4_K": Q8_K_PARTNER, "Q6_K": Q8_K_PARTNER, "IQ4_XS": Q8_K_PARTNER,
    "IQ3_S": Q8_K_PARTNER, "IQ3_XXS": Q8_K_PARTNER, "IQ2_S": Q8_K_PARTNER,
    "IQ2_XS": Q8_K_PARTNER, "IQ2_XXS": Q8_K_PARTNER, "IQ1_M": Q8_K_PARTNER,
    "IQ1_S": Q8_K_PARTNER, "TQ2_0": Q8_K_PARTNER, "TQ1_0": Q8_K_PARTNER,
}
# llama.cpp's CPU GELU reads a table indexed by the input rounded to F16 and returns an F16
# value; minfer computes the tanh form in f32. The Gemma models (GELU-gated FFN) differ by
# that even with F32 weights: observed 1.0e-3 (gemma2-f32) and 1.2e-3 (gemma3-f32) of the
# logit std; with the reference kernel rounding GELU likewise, 5e-6.
GELU_TOLERANCE = 5e-3


def tolerance(spec):
    k = TOLERANCE[spec["wtype"]]
    if spec["arch"].startswith("gemma"):
        k = max(k, GELU_TOLERANCE)
    return k


def f32_list(values):
    """Shortest decimal forms that read back as the same f32 values."""
    return [float(str(np.float32(x))) for x in values]


def top(logits):
    ids = np.argsort(-logits, kind="stable")[:TOP]
    return [int(i) for i in ids], f32_list(logits[ids]), float(logits[ids[0]] - logits[ids[1]])


def run(path):
    llm = llama_cpp.Llama(path, n_ctx=64, n_batch=64, logits_all=True, verbose=False,
                          n_threads=2, n_threads_batch=2, flash_attn=False,
                          type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    llm.reset()
    llm.eval(PROMPT_IDS)
    last = np.array(llm.scores[len(PROMPT_IDS) - 1], dtype=np.float32)
    greedy, top_ids, top_logits, margins = [], [], [], []
    logits = last
    for _ in range(N_GREEDY):
        ids, vals, m = top(logits)
        greedy.append(ids[0])
        top_ids.append(ids)
        top_logits.append(vals)
        margins.append(m)
        llm.eval([ids[0]])
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return last, greedy, top_ids, top_logits, margins


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_tiny_reference.py MODEL_DIR")
    model_dir = sys.argv[1]
    with open(os.path.join(model_dir, "manifest.json")) as f:
        manifest = json.load(f)

    models = []
    for entry in manifest:
        path = os.path.join(model_dir, entry["file"])
        with open(path, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        last, greedy, top_ids, top_logits, margins = run(path)
        std = float(np.std(last.astype(np.float64)))
        models.append({
            "name": entry["name"],
            "spec": entry["spec"],
            "sha256": sha,
            "logit_std": float(str(np.float32(std))),
            "logit_tolerance": float(str(np.float32(tolerance(entry["spec"]) * std))),
            "last_logits": f32_list(last),
            "greedy": greedy,
            "greedy_top_ids": top_ids,
            "greedy_top_logits": top_logits,
            "greedy_margins": f32_list(margins),
        })
        print(f"{entry['name']}: argmax {greedy[0]}, greedy {greedy[:8]}..., "
              f"min margin {min(margins):.4f}")

    out = {
        "source": "llama.cpp 0c1e570 (llama-cpp-python 0.3.36 sdist, GGML_NATIVE=OFF with "
                  "AVX2/FMA/F16C), CPU, 2 threads, F32 KV cache, flash attention off",
        "prompt_ids": PROMPT_IDS,
        "n_greedy": N_GREEDY,
        "top": TOP,
        "models": models,
    }
    with open(GOLDEN, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
