#!/usr/bin/env python3
"""End-to-end check of `minfer serve`'s embedding routes with the official clients.

Usage: e2e_embed.py --host http://127.0.0.1:PORT --texts FILE --reference FILE
FILE of texts: one per line. The reference: `minfer embed -f FILE`'s JSON (one unit
vector per text, mean pooling on the default model). The `openai` client's
`embeddings.create` (one text, then every text in one request, as floats and as base64)
and the `ollama` client's `embed` (every text) and `embeddings` (one prompt) must give
the reference's vectors (cosine > 1 - 1e-6), unit length where the API normalises.
Rerank (the server runs with --rerank) ranks the document that answers the query first,
and its score equals the yes/no share of the next-token log-probabilities that
llama-server's `/completion` reports for the same judge prompt (built here from
Qwen3-Reranker's published template).
"""

import argparse
import json

import httpx
import math
import sys

try:
    import ollama
    import openai
except ImportError as e:
    sys.exit(f"a Python package is missing ({e}): python3 -m pip install openai ollama")


def check(cond, what):
    if not cond:
        sys.exit(f"e2e failure: {what}")


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb)


def same(got, want, what, unit=True):
    check(len(got) == len(want), f"{what}: {len(got)} dimensions, want {len(want)}")
    c = cosine(got, want)
    check(c > 1 - 1e-6, f"{what}: cosine {c} to `minfer embed`'s vector")
    if unit:
        n = math.sqrt(sum(x * x for x in got))
        check(abs(n - 1) < 1e-5, f"{what}: length {n}, want 1")


SYSTEM = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
ANSWER = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCT = "Given a web search query, retrieve relevant passages that answer the query"


def judged(host, query, doc):
    """P(yes) / (P(yes) + P(no)) from /completion's log-probabilities of the next token."""

    def tokens(text, special):
        r = httpx.post(f"{host}/tokenize", json={"content": text, "parse_special": special})
        return r.json()["tokens"]

    body = f"<Instruct>: {INSTRUCT}\n<Query>: {query}\n<Document>: {doc}"
    prompt = tokens(SYSTEM, True) + tokens(body, False) + tokens(ANSWER, True)
    req = {"prompt": prompt, "n_predict": 1, "n_probs": 100, "temperature": 0}
    r = httpx.post(f"{host}/completion", json=req, timeout=120).json()
    top = {c["token"]: c["logprob"] for c in r["completion_probabilities"][0]["top_logprobs"]}
    check("yes" in top and "no" in top, f"yes and no among the top tokens: {sorted(top)}")
    return 1 / (1 + math.exp(top["no"] - top["yes"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    ap.add_argument("--texts", required=True)
    ap.add_argument("--reference", required=True)
    args = ap.parse_args()
    with open(args.texts, encoding="utf-8") as f:
        texts = [line for line in f.read().splitlines() if line]
    with open(args.reference, encoding="utf-8") as f:
        want = json.load(f)
    check(len(texts) == len(want) == 64, f"64 texts and vectors, got {len(texts)}, {len(want)}")

    client = openai.OpenAI(base_url=f"{args.host}/v1", api_key="unused")
    model = client.models.list().data[0].id
    one = client.embeddings.create(model=model, input=texts[0], encoding_format="float")
    check(len(one.data) == 1 and one.data[0].index == 0, f"one input: {one.data}")
    check(one.usage.prompt_tokens > 0, f"usage {one.usage}")
    same(one.data[0].embedding, want[0], "openai, one text")
    # The client's default asks for base64 and decodes it itself.
    batch = client.embeddings.create(model=model, input=texts)
    check([d.index for d in batch.data] == list(range(64)), "64 vectors in order")
    for i, d in enumerate(batch.data):
        same(d.embedding, want[i], f"openai, batch input {i}")

    oc = ollama.Client(host=args.host)
    name = oc.list().models[0].model
    r = oc.embed(model=name, input=texts)
    check(len(r.embeddings) == 64, f"ollama embed: {len(r.embeddings)} vectors")
    check((r.prompt_eval_count or 0) > 0, f"prompt_eval_count {r.prompt_eval_count}")
    for i, v in enumerate(r.embeddings):
        same(v, want[i], f"ollama embed, input {i}")
    r = oc.embed(model=name, input=texts[1])
    same(r.embeddings[0], want[1], "ollama embed, one text")
    # The older route does not normalise, as ollama's does not.
    r = oc.embeddings(model=name, prompt=texts[2])
    same(list(r.embedding), want[2], "ollama embeddings", unit=False)

    docs = [
        "hi",
        "The giant panda is a bear species endemic to China.",
        "Rust is a programming language with ownership and borrowing.",
    ]
    body = {"query": "What is a panda?", "documents": docs, "top_n": 2, "return_documents": True}
    r = httpx.post(f"{args.host}/v1/rerank", json=body, timeout=120).json()
    res = r.get("results")
    check(isinstance(res, list) and len(res) == 2, f"rerank top_n 2: {r}")
    check(res[0]["index"] == 1 and res[0]["document"]["text"] == docs[1], f"rerank order: {r}")
    scores = [x["relevance_score"] for x in res]
    check(1 > scores[0] >= scores[1] > 0, f"rerank scores: {r}")
    want = judged(args.host, body["query"], docs[1])
    check(abs(scores[0] - want) < 1e-4, f"rerank score {scores[0]}, /completion's {want}")
    print("e2e ok")


if __name__ == "__main__":
    main()
