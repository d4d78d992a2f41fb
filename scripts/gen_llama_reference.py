#!/usr/bin/env python3
"""Reference outputs of llama.cpp for minfer's end-to-end checks on the default model.

llama.cpp is built from the sdist of llama-cpp-python 0.3.36 (llama.cpp build 0c1e570):

    python3 -m pip download --no-deps --no-binary llama-cpp-python -d DIR llama-cpp-python==0.3.36
    tar xzf DIR/llama_cpp_python-0.3.36.tar.gz -C DIR && cd DIR/llama_cpp_python-0.3.36/vendor/llama.cpp
    python3 -m pip install cmake ninja
    cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    cmake --build build -j2 --target llama-bench llama-perplexity llama-tokenize llama-completion llama-server

The sdist's Python bindings then run against that build without another compile:

    python3 -m pip install numpy diskcache jinja2 typing_extensions
    PYTHONPATH=DIR/llama_cpp_python-0.3.36 \
    LLAMA_CPP_LIB_PATH=DIR/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin \
    python3 scripts/gen_llama_reference.py MODEL.gguf DIR/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin

It writes crates/runtime/tests/golden/llama_reference.json:
  - teacher_forced: per prompt, the token ids and, per position, llama.cpp's top-32 token ids
    with their logits (enough to check minfer's top-1 and to bound the logit difference),
    both evaluated token by token (top_ids, top_logits) and as one batch (batch_*);
  - greedy: per prompt, the prompt ids and llama.cpp's 64-token greedy continuation;
  - perplexity: llama-perplexity's PPL on ppl_text.txt with -c 512.

Every run uses an f32 KV cache and no flash attention, the configuration minfer computes.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "crates", "runtime", "tests", "golden")

TEACHER_PROMPTS = [
    "def quicksort(arr):\n    \"\"\"Sort a list of numbers using the quicksort algorithm.\"\"\"\n"
    "    if len(arr) <= 1:\n        return arr\n    pivot = arr[len(arr) // 2]\n"
    "    left = [x for x in arr if x < pivot]\n    middle = [x for x in arr if x == pivot]\n"
    "    right = [x for x in arr if x > pivot]\n    return quicksort(left) + middle + quicksort(right)\n",
    "The history of computing is longer than the history of computing hardware and modern "
    "computing technology and includes the history of methods intended for pen and paper or for "
    "chalk and slate, with or without the aid of tables. Digital computing is intimately tied to "
    "the representation of numbers. Early calculating devices such as the abacus were followed "
    "by mechanical calculators, and eventually by programmable electronic machines.",
    "#include <stdio.h>\n\nint main(void) {\n    int total = 0;\n    for (int i = 0; i < 100; i++) {\n"
    "        if (i % 3 == 0 || i % 5 == 0) {\n            total += i;\n        }\n    }\n"
    "    printf(\"%d\\n\", total);\n    return 0;\n}\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nExplain what a "
    "hash map is and when you would use one instead of a sorted array. Give one example in Rust."
    "<|im_end|>\n<|im_start|>assistant\nA hash map is a data structure that stores key-value pairs "
    "and gives average constant-time lookup, insertion and deletion by hashing each key to a bucket.",
]

GREEDY_PROMPTS = [
    "def fibonacci(n):",
    "The capital of France is",
    "// A function that reverses a string in JavaScript\nfunction reverse(s) {",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "Write a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "import numpy as np\n\n# Compute the mean of each column\n",
    "Once upon a time, in a small village,",
    "SELECT name, COUNT(*) FROM orders",
    "# Binary search in Python\ndef binary_search(items, target):",
    "<|im_start|>user\nWhat is the difference between a process and a thread?<|im_end|>\n"
    "<|im_start|>assistant\n",
    "fn main() {\n    let v = vec![3, 1, 2];",
    "The three primary colors are",
    "#include <iostream>\n\nint main() {",
]

TOP = 32
GGML_TYPE_F32 = 0
N_GREEDY = 64


def main():
    model_path, bin_dir = sys.argv[1], sys.argv[2]
    # minfer keeps its KV cache in f32, so the reference does too (llama.cpp's default is
    # f16, which alone flips near-tied greedy choices); flash attention stays off.
    llm = llama_cpp.Llama(model_path, n_ctx=1024, logits_all=True, verbose=False,
                          n_threads=2, n_batch=512, flash_attn=False,
                          type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)

    def top_of(scores):
        top_ids = np.argsort(-scores, axis=1, kind="stable")[:, :TOP]
        top_logits = np.take_along_axis(scores, top_ids, axis=1)
        return top_ids.astype(int).tolist(), [[float(x) for x in r] for r in top_logits]

    teacher = []
    for p in TEACHER_PROMPTS:
        ids = llm.tokenize(p.encode(), add_bos=False, special=True)
        assert len(ids) >= 64, (len(ids), p)
        # Token by token: the path llama.cpp generates with.
        llm.reset()
        rows = []
        for t in ids:
            llm.eval([t])
            rows.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
        top_ids, top_logits = top_of(np.array(rows))
        # One batched prefill: llama.cpp switches to other matmul kernels for batches,
        # which moves logits by about 0.1 and flips some near-ties against the above.
        llm.reset()
        llm.eval(ids)
        batch_ids, batch_logits = top_of(np.array(llm.scores[: len(ids)], dtype=np.float32))
        teacher.append({
            "prompt": p,
            "ids": [int(t) for t in ids],
            "top_ids": top_ids,
            "top_logits": top_logits,
            "batch_top_ids": batch_ids,
            "batch_top_logits": batch_logits,
        })

    greedy = []
    for p in GREEDY_PROMPTS:
        ids = llm.tokenize(p.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        out = []
        for _ in range(N_GREEDY):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            nxt = int(np.argmax(logits))
            out.append(nxt)
            llm.eval([nxt])
        greedy.append({"prompt": p, "prompt_ids": [int(t) for t in ids], "continuation": out})

    text = os.path.join(GOLDEN, "ppl_text.txt")
    res = subprocess.run(
        [os.path.join(bin_dir, "llama-perplexity"), "-m", model_path, "-f", text, "-c", "512",
         "-t", "2", "-b", "512", "-ctk", "f32", "-ctv", "f32", "-fa", "off"],
        capture_output=True, text=True, check=True)
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", res.stdout + res.stderr)
    chunks = re.search(r"calculating perplexity over (\d+) chunks", res.stdout + res.stderr)
    perplexity = {"text": "ppl_text.txt", "ctx": 512, "ppl": float(m.group(1)),
                  "stderr": float(m.group(2)), "chunks": int(chunks.group(1))}

    out = {"source": "llama.cpp 0c1e570 (llama-cpp-python 0.3.36 sdist), CPU, 2 threads, "
                     "f32 KV cache, flash attention off",
           "model_sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
           "teacher_forced": teacher, "greedy": greedy, "perplexity": perplexity}
    with open(os.path.join(GOLDEN, "llama_reference.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("teacher prompts:", [len(t["ids"]) for t in teacher])
    print("perplexity:", perplexity)


if __name__ == "__main__":
    main()
