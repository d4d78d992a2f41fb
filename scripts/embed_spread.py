#!/usr/bin/env python3
"""How far apart independent engines' embeddings of the default model are.

    python3 scripts/embed_spread.py --minfer target/release/minfer \
        --ik-embedding IK_BUILD/bin/llama-embedding [--model MODEL.gguf] \
        [--other-llama-lib OTHER_BUILD/bin]

crates/runtime/tests/golden/embed_reference.json holds llama.cpp's embeddings of four
texts (mean and last-token pooling, f32 KV cache, no flash attention; made by
scripts/gen_embed_reference.py). This script embeds the same texts

- with llama.cpp again, through its Python bindings (set up as that script says), with
  an f16 KV cache;
- with minfer (`minfer embed`), with f32 and with f16 K/V;
- with ik_llama.cpp's `llama-embedding` (f16 K/V: its CPU build refuses an f32 V cache
  without flash attention and aborts on an f32 K cache with it);

- with --other-llama-lib, with a second build of the same llama.cpp source (e.g. a
  native build against the golden file's portable AVX2 one), f32 K/V as the golden file:
  llama.cpp against itself, only the instruction set differing;

all with 2 threads, L2-normalised, and prints cosine distances per text and pooling.
ik_llama.cpp is a third implementation of the same model on the same file, so its
distance from llama.cpp at the same KV format is the spread two correct engines show
on this quantized model. Run ik_llama.cpp's binary with its own library folders on
LD_LIBRARY_PATH (they are not llama.cpp's).
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "crates", "runtime", "tests", "golden",
                      "embed_reference.json")
SEP = "<#minfer-sep#>"


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def dist(a, b):
    return 1.0 - float(np.dot(unit(a), unit(b)))


def ik(args, text, pooling):
    out = subprocess.run(
        [args.ik_embedding, "-m", args.model, "-p", text, "--pooling", pooling,
         "--embd-normalize", "2", "--embd-output-format", "json", "--embd-separator", SEP,
         "-ctk", "f16", "-ctv", "f16", "-no-fa", "-t", "2", "-c", "512"],
        capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["data"][0]["embedding"]


def llama_f16(args, poolings):
    """llama.cpp's embeddings with an f16 KV cache: {(text, pooling): vector}."""
    import llama_cpp

    ptypes = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
              "last": llama_cpp.LLAMA_POOLING_TYPE_LAST}
    out = {}
    for pooling, texts in poolings.items():
        llm = llama_cpp.Llama(model_path=args.model, embedding=True,
                              pooling_type=ptypes[pooling], n_ctx=512, n_batch=512,
                              n_threads=2, flash_attn=False, type_k=1, type_v=1,
                              verbose=False)
        for text in texts:
            out[(text, pooling)] = llm.embed(text, normalize=False)
        del llm
    return out


def llama_other(args, golden):
    """The golden file's embeddings (f32 K/V) from the llama.cpp build in
    `--other-llama-lib`, in a child process (the bindings load their library once):
    {(text, pooling): vector}."""
    code = (
        "import json, sys, llama_cpp\n"
        "req = json.load(sys.stdin)\n"
        "pt = {'mean': llama_cpp.LLAMA_POOLING_TYPE_MEAN, 'last': llama_cpp.LLAMA_POOLING_TYPE_LAST}\n"
        "out = []\n"
        "for pooling, text in req['items']:\n"
        "    llm = llama_cpp.Llama(model_path=req['model'], embedding=True, pooling_type=pt[pooling],\n"
        "        n_ctx=512, n_batch=512, n_threads=2, flash_attn=False, type_k=0, type_v=0, verbose=False)\n"
        "    out.append(llm.embed(text, normalize=False))\n"
        "    del llm\n"
        "json.dump(out, sys.stdout)\n")
    items = [[g["pooling"], g["text"]] for g in golden]
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=args.other_llama_lib)
    res = subprocess.run([sys.executable, "-c", code], input=json.dumps(
        {"model": args.model, "items": items}), capture_output=True, text=True, check=True,
        env=env)
    return {(t, p): v for (p, t), v in zip(items, json.loads(res.stdout))}


def minfer(args, text, pooling, kv):
    out = subprocess.run(
        [args.minfer, "embed", "-m", args.model, "-t", "2", "-c", "512", "--pooling",
         pooling, "--cache-type-k", kv, "--cache-type-v", kv, text],
        capture_output=True, text=True, check=True)
    v = json.loads(out.stdout)
    # One text: either the vector itself or a list holding it.
    return v[0] if v and isinstance(v[0], list) else v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minfer", required=True)
    ap.add_argument("--ik-embedding", required=True)
    ap.add_argument("--other-llama-lib", help="library folder of a second llama.cpp build")
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/minfer/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    args = ap.parse_args()
    golden = json.load(open(GOLDEN))["entries"]
    poolings = {}
    for g in golden:
        poolings.setdefault(g["pooling"], []).append(g["text"])
    l16 = llama_f16(args, poolings)
    other = llama_other(args, golden) if args.other_llama_lib else None
    print("| pooling | text | minfer / llama.cpp, f32 KV | minfer / llama.cpp, f16 KV "
          "| ik_llama.cpp / llama.cpp, f16 KV | llama.cpp f16 KV / f32 KV |"
          + (" other llama.cpp build / llama.cpp, f32 KV |" if other else ""))
    print("|---|---|---:|---:|---:|---:|" + ("---:|" if other else ""))
    for g in golden:
        ref32, ref16 = g["embedding"], l16[(g["text"], g["pooling"])]
        m32 = minfer(args, g["text"], g["pooling"], "f32")
        m16 = minfer(args, g["text"], g["pooling"], "f16")
        k16 = ik(args, g["text"], g["pooling"])
        label = g["text"][:28].replace("\n", " ").replace("|", "/")
        print(f"| {g['pooling']} | {label} | {dist(m32, ref32):.2e} | {dist(m16, ref16):.2e} "
              f"| {dist(k16, ref16):.2e} | {dist(ref16, ref32):.2e} |"
              + (f" {dist(other[(g['text'], g['pooling'])], ref32):.2e} |" if other else ""),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
