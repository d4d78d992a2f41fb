#!/usr/bin/env python3
"""minfer against llama.cpp on one real GGUF file: tokenizer agreement, greedy continuations
(with llama.cpp's top-1 margin where they part) and perplexity the way llama-perplexity
computes it (chunks of 512, the second half of each scored, no BOS when the vocabulary
adds none). No golden file: it prints the comparison, for files too large to commit.

llama.cpp and its Python bindings as the header of scripts/gen_llama_reference.py says;
then, with a release build of minfer:

    PYTHONPATH=DIR/llama_cpp_python-0.3.36 \
    LLAMA_CPP_LIB_PATH=DIR/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin \
    python3 scripts/compare_llama_file.py MODEL.gguf target/release/minfer
"""
import os
import subprocess
import sys

import numpy as np
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
PPL_TEXT = os.path.join(HERE, "..", "crates", "runtime", "tests", "golden", "ppl_text.txt")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,"]
N_CTX = 512


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: compare_llama_file.py MODEL.gguf MINFER_BINARY")
    model, minfer = sys.argv[1:]
    llm = llama_cpp.Llama(model, n_ctx=N_CTX, n_batch=N_CTX, logits_all=True, verbose=False,
                          n_threads=2, n_threads_batch=2, flash_attn=False, type_k=0, type_v=0)
    text = open(PPL_TEXT, encoding="utf-8").read()
    for p in PROMPTS + [text[:3000]]:
        ref = llm.tokenize(p.encode(), add_bos=False, special=False)
        out = subprocess.run([minfer, "tokenize", "-m", model, p], capture_output=True, text=True)
        got = [int(x) for x in out.stdout.split()]
        print(f"tokens {'equal' if ref == got else 'DIFFER'}: {len(ref)} vs {len(got)} ({p[:24]!r})")
    for p in PROMPTS:
        ids = llm.tokenize(p.encode(), add_bos=False, special=False)
        llm.reset()
        llm.eval(ids)
        toks, margins = [], []
        for _ in range(32):
            logits = np.array(llm.scores[llm.n_tokens - 1])
            order = np.argsort(-logits)
            toks.append(int(order[0]))
            margins.append(float(logits[order[0]] - logits[order[1]]))
            llm.eval([toks[-1]])
        out = subprocess.run([minfer, "run", "-m", model, "--temp", "0", "-n", "32", "-t", "2", p],
                             capture_output=True, text=True).stdout
        # Compared as text: minfer stops at an end-of-generation token, the loop above
        # does not. A token agrees when the texts agree past its end (or minfer's text ends
        # exactly there), so " king" against minfer's " kingdom" is a disagreement.
        ref = llm.detokenize(toks).decode(errors="replace")
        if out.endswith("\n") and ref[len(out) - 1:len(out)] != "\n":
            out = out[:-1]  # the newline `minfer run` ends its output with
        common = next((i for i, (a, b) in enumerate(zip(ref, out)) if a != b), min(len(ref), len(out)))
        agree = 0
        while agree < len(toks):
            end = len(llm.detokenize(toks[:agree + 1]).decode(errors="replace"))
            if end < common or (end == common == len(out)):
                agree += 1
            else:
                break
        if agree == len(toks):
            where = ""
        elif common == len(out):
            where = ", then minfer stopped at end of generation"
        else:
            where = f", llama.cpp margin there {margins[agree]:.4f}"
        same = agree
        print(f"greedy {p[:24]!r}: {same} of 32 tokens agree{where}")
    toks = llm.tokenize(text.encode(), add_bos=llm.add_bos_token() if hasattr(llm, "add_bos_token") else False,
                        special=False)
    nll, count = 0.0, 0
    for c in range(len(toks) // N_CTX):
        chunk = toks[c * N_CTX:(c + 1) * N_CTX]
        llm.reset()
        llm.eval(chunk)
        logits = np.array(llm.scores[:N_CTX], dtype=np.float64)
        for i in range(N_CTX // 2, N_CTX - 1):
            row = logits[i]
            top = row.max()
            nll += top + np.log(np.exp(row - top).sum()) - row[chunk[i + 1]]
            count += 1
    print(f"llama.cpp PPL {np.exp(nll / count):.4f} over {len(toks) // N_CTX} chunks of {N_CTX}")
    out = subprocess.run([minfer, "perplexity", "-m", model, "-c", str(N_CTX), "-t", "2", "-f", PPL_TEXT],
                         capture_output=True, text=True)
    print("minfer", " ".join(l for l in (out.stdout + out.stderr).splitlines() if "PPL" in l))


if __name__ == "__main__":
    main()
