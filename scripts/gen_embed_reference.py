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
    python3 scripts/gen_embed_reference.py --rerank DIR

For each text of TEXTS and each pooling of POOLINGS it records the token ids llama.cpp
embeds and the embedding llama.cpp computes (the library's embedding mode, as
`llama-embedding --pooling P --embd-normalize 2` computes it: f32 KV, no flash attention,
2 threads), L2-normalised, into crates/runtime/tests/golden/embed_reference.json.

With --tiny, DIR holds the tiny random-weight models written by
`cargo run -p minfer-models --example write_tiny_models -- DIR`; the F32 ones of TINY are
embedded with every pooling of TINY_POOLINGS (a Qwen3 with last-token pooling is how
Qwen3-Embedding is built), into crates/runtime/tests/golden/embed_tiny_reference.json;
then the tiny BERT encoders of DIR/bert (BERT: bert-f32 with mean and CLS pooling,
bert-q8_0 with mean) and the tiny nomic-berts (NOMIC: nomic-f32 and nomic-q8_0, with the
mean pooling their files state, as nomic-embed-text's do) on TEXTS and BERT_TEXTS, with a
128-token context (the BERTs' position table, the nomic-berts' context_length) and the
whole text in one batch, as an encoder needs.

With --rerank, DIR is the same directory; the tiny BERT reranker DIR/bert/bert-rerank-f32
(a classifier head, `pooling_type` 4) scores each (query, document) of RERANK_PAIRS with
rank pooling, into crates/runtime/tests/golden/rerank_tiny_reference.json. Each pair is
laid out twice from llama.cpp's own pieces (each text tokenized without specials, the
vocabulary's BOS/EOS/SEP ids and add flags): as llama-server's rerank joins it (BOS,
query, EOS if the vocabulary adds one, SEP if it adds one, document, EOS if it adds one)
and as llama-embedding joins a `query<TAB>document` line (the same, then the closing
tokens of a tokenization with specials: SEP for a WordPiece vocabulary). The score is the
first value of the sequence's pooled output, raw (no sigmoid, no normalisation), as
llama-server reports it.
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
OUT_RERANK = os.path.join(GOLDEN, "rerank_tiny_reference.json")
RERANK_PAIRS = [
    ("what is a quick fox?", "The quick brown fox jumps over the lazy dog."),
    ("what is a quick fox?", "SELECT name, COUNT(*) FROM users GROUP BY name;"),
    ("find similar passages", "Retrieval-augmented generation looks up passages similar to the question."),
    ("hello world", "Héllo, WORLD! The naïve café's résumé: playing & unplayable (3.14) 中文 zebra."),
]
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
NOMIC = {
    "nomic-f32": {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN},
    "nomic-q8_0": {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN},
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
    for stem, poolings in list(BERT.items()) + list(NOMIC.items()):
        path = os.path.join(d, "bert", stem + ".gguf")
        for row in embeddings(path, poolings, 128, TEXTS + BERT_TEXTS):
            row["model"] = stem
            out["entries"].append(row)
    with open(OUT_TINY, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(f"wrote {len(out['entries'])} embeddings to {OUT_TINY}")


def rank_score(llm, ids):
    """The first value of llama.cpp's rank-pooled output for one sequence of `ids`."""
    llm._batch.reset()
    llm._ctx.kv_cache_clear()
    llm._batch.add_sequence(ids, 0, False)
    llm._ctx.decode(llm._batch)
    llm._batch.reset()
    return float(llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)[0])


def main_rerank(d):
    path = os.path.join(d, "bert", "bert-rerank-f32.gguf")
    llm = llama_cpp.Llama(
        model_path=path,
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK,
        n_ctx=128,
        n_batch=128,
        n_ubatch=128,
        n_threads=2,
        flash_attn=False,
        type_k=GGML_TYPE_F32,
        type_v=GGML_TYPE_F32,
        verbose=False,
    )
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    bos, eos, sep = (llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_eos(vocab),
                     llama_cpp.llama_vocab_sep(vocab))
    add_bos = llama_cpp.llama_vocab_get_add_bos(vocab)
    add_eos = llama_cpp.llama_vocab_get_add_eos(vocab)
    add_sep = llama_cpp.llama_vocab_get_add_sep(vocab)
    if eos < 0:
        eos = sep  # llama-server's fallback for a vocabulary without EOS
    entries = []
    for query, doc in RERANK_PAIRS:
        q = llm.tokenize(query.encode("utf-8"), add_bos=False, special=False)
        t = llm.tokenize(doc.encode("utf-8"), add_bos=False, special=False)
        server = ([bos] if add_bos else []) + q + ([eos] if add_eos else []) \
            + ([sep] if add_sep else []) + t + ([eos] if add_eos else [])
        # llama-embedding tokenizes the joined line with specials: it ends in EOS where
        # the vocabulary adds one (as the server's layout does), else in SEP where it
        # adds that (a WordPiece vocabulary).
        embedding = server + ([sep] if add_sep and not add_eos else [])
        for layout, ids in (("server", server), ("embedding", embedding)):
            entries.append({"query": query, "document": doc, "layout": layout,
                            "ids": list(ids), "score": rank_score(llm, ids)})
    out = {"model": "bert-rerank-f32", "entries": entries}
    with open(OUT_RERANK, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {len(entries)} rank scores to {OUT_RERANK}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--tiny":
        return main_tiny(sys.argv[2])
    if len(sys.argv) == 3 and sys.argv[1] == "--rerank":
        return main_rerank(sys.argv[2])
    model = sys.argv[1]
    out = {"model": os.path.basename(model), "entries": embeddings(model, POOLINGS, 512)}
    with open(OUT, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(f"wrote {len(out['entries'])} embeddings to {OUT}")


if __name__ == "__main__":
    main()
