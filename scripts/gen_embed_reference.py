#!/usr/bin/env python3
"""llama.cpp's embeddings of the default model, for minfer's embedding check.

llama.cpp and its Python bindings come from the llama-cpp-python 0.3.36 sdist (llama.cpp
build 0c1e570), built as the header of scripts/gen_llama_reference.py describes (a
`-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON` build runs on every
host of this kind); then:

    PYTHONPATH=DIR/llama_cpp_python-0.3.36 \
    LLAMA_CPP_LIB_PATH=DIR/llama_cpp_python-0.3.36/vendor/llama.cpp/build2/bin \
    python3 scripts/gen_embed_reference.py MODEL.gguf
    python3 scripts/gen_embed_reference.py --tiny DIR

For each text of TEXTS and each pooling of POOLINGS it records the token ids llama.cpp
embeds and the embedding llama.cpp computes (the library's embedding mode, as
`llama-embedding --pooling P --embd-normalize 2` computes it: f32 KV, no flash attention,
2 threads), L2-normalised, into crates/runtime/tests/golden/embed_reference.json.

With --tiny, DIR holds the tiny random-weight models written by
`cargo run -p minfer-models --example write_tiny_models -- DIR`; the F32 ones of TINY are
embedded with every pooling of TINY_POOLINGS (a Qwen3 with last-token pooling is how
Qwen3-Embedding is built), into crates/runtime/tests/golden/embed_tiny_reference.json;
then the tiny BERT encoders of DIR/bert (BERT: bert-f32 with mean and CLS pooling,
bert-q8_0 with mean) on TEXTS and BERT_TEXTS, with a 128-token context (their position
table) and the whole text in one batch, as an encoder needs.
"""
import json
import os
import sys

import numpy as np
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "crates", "runtime", "tests", "golden")
OUT = os.path.join(GOLDEN, "embed_reference.json")
OUT_TINY = os.path.join(GOLDEN, "embed_tiny_reference.json")
TINY = ["qwen3-f32", "qwen2-f32", "llama-f32"]

TEXTS = [
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "The quick brown fox jumps over the lazy dog.",
    "Retrieval-augmented generation looks up passages similar to the question.",
    "SELECT name, COUNT(*) FROM users GROUP BY name ORDER BY 2 DESC;",
]
GGML_TYPE_F32 = 0
POOLINGS = {
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
}
TINY_POOLINGS = dict(POOLINGS, cls=llama_cpp.LLAMA_POOLING_TYPE_CLS)
BERT = {
    "bert-f32": {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS},
    "bert-q8_0": {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN},
}
# WordPiece's normalization on the way: accents, CJK, unknown words, punctuation.
BERT_TEXTS = [
    "Héllo, WORLD! The naïve café's résumé: playing & unplayable (3.14) 中文 zebra.",
]


def embeddings(model, poolings, n_ctx, texts=TEXTS):
    """(text, pooling, ids, normalised embedding) for every text and pooling."""
    rows = []
    for name, ptype in poolings.items():
        llm = llama_cpp.Llama(
            model_path=model,
            embedding=True,
            pooling_type=ptype,
            n_ctx=n_ctx,
            n_batch=n_ctx,
            n_threads=2,
            flash_attn=False,
            type_k=GGML_TYPE_F32,
            type_v=GGML_TYPE_F32,
            verbose=False,
        )
        for text in texts:
            ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
            v = np.array(llm.embed(text, normalize=False), dtype=np.float64)
            v = v / np.linalg.norm(v)
            rows.append({"text": text, "pooling": name, "ids": list(ids),
                         "embedding": [float(x) for x in v]})
        del llm
    return rows


def main_tiny(d):
    out = {"entries": []}
    for stem in TINY:
        for row in embeddings(os.path.join(d, stem + ".gguf"), TINY_POOLINGS, 256):
            row["model"] = stem
            out["entries"].append(row)
    for stem, poolings in BERT.items():
        path = os.path.join(d, "bert", stem + ".gguf")
        for row in embeddings(path, poolings, 128, TEXTS + BERT_TEXTS):
            row["model"] = stem
            out["entries"].append(row)
    with open(OUT_TINY, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(f"wrote {len(out['entries'])} embeddings to {OUT_TINY}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--tiny":
        return main_tiny(sys.argv[2])
    model = sys.argv[1]
    out = {"model": os.path.basename(model), "entries": embeddings(model, POOLINGS, 512)}
    with open(OUT, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(f"wrote {len(out['entries'])} embeddings to {OUT}")


if __name__ == "__main__":
    main()
