#!/usr/bin/env python3
"""End-to-end check of `minfer serve` with the official ollama Python client.

Usage: e2e_ollama.py --host http://127.0.0.1:PORT
Lists the model (/api/tags), shows it, lists running models, reads the version, then
runs chat and generate greedily, streaming and not, and checks that both modes agree
and that the counts and durations are filled in.
"""

import argparse
import sys

try:
    import httpx
    import ollama
except ImportError:
    sys.exit("the ollama Python package is missing: python3 -m pip install ollama")


def check(cond, what):
    if not cond:
        sys.exit(f"e2e failure: {what}")


def check_final(r, what):
    check(r.done, f"{what}: the last object is done")
    check(r.done_reason in ("stop", "length"), f"{what}: done_reason {r.done_reason!r}")
    check((r.eval_count or 0) > 0, f"{what}: eval_count {r.eval_count}")
    check((r.prompt_eval_count or 0) > 0, f"{what}: prompt_eval_count {r.prompt_eval_count}")
    check((r.total_duration or 0) >= (r.eval_duration or 0) > 0, f"{what}: durations {r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True)
    args = ap.parse_args()
    client = ollama.Client(host=args.host)

    models = client.list().models
    check(len(models) == 1, f"one model listed, got {models}")
    model = models[0].model
    check(model.endswith(":latest"), f"an ollama-style name, got {model!r}")
    check(models[0].details.format == "gguf", f"details {models[0].details}")
    check(models[0].size > 0 and models[0].digest, f"size and digest {models[0]}")

    shown = client.show(model)
    check(shown.modelinfo["general.architecture"] == "qwen2", f"model_info {shown.modelinfo}")
    check("insert" in (shown.capabilities or []), f"capabilities {shown.capabilities}")
    running = client.ps().models
    check(len(running) == 1 and running[0].model == model, f"ps {running}")
    version = httpx.get(f"{args.host}/api/version").json()
    check(isinstance(version.get("version"), str), f"version {version}")

    options = {"temperature": 0, "num_predict": 12}
    messages = [{"role": "user", "content": "What is the capital of France? One word."}]
    chat = client.chat(model=model, messages=messages, options=options)
    check_final(chat, "chat")
    answer = chat.message.content
    check("Paris" in answer, f"chat answer {answer!r}")
    parts = list(client.chat(model=model, messages=messages, options=options, stream=True))
    check(all(not p.done for p in parts[:-1]), "only the last chunk is done")
    check_final(parts[-1], "chat stream")
    streamed = "".join(p.message.content or "" for p in parts)
    check(streamed == answer, f"chat stream {streamed!r} == {answer!r}")

    gen = client.generate(model=model, prompt="Write the number after 41.", options=options)
    check_final(gen, "generate")
    check(gen.response, "generate answered")
    check(len(gen.context or []) > gen.prompt_eval_count, "generate returns its context")
    parts = list(
        client.generate(
            model=model, prompt="Write the number after 41.", options=options, stream=True
        )
    )
    check_final(parts[-1], "generate stream")
    streamed = "".join(p.response for p in parts)
    check(streamed == gen.response, f"generate stream {streamed!r} == {gen.response!r}")

    try:
        client.chat(model="no-such-model", messages=messages)
        check(False, "an unknown model is refused")
    except ollama.ResponseError as e:
        check(e.status_code == 404, f"unknown model: {e.status_code} {e.error}")
    try:
        client.chat(model=model, messages=messages, format="json")
        check(False, "format is refused")
    except ollama.ResponseError as e:
        check(e.status_code == 400 and "format" in e.error, f"format: {e.error}")
    print("e2e ok")


if __name__ == "__main__":
    main()
