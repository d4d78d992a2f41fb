#!/usr/bin/env python3
"""End-to-end check of `minfer serve` with the official ollama Python client.

Usage: e2e_ollama.py --host http://127.0.0.1:PORT
Lists the model (/api/tags), shows it, lists running models, reads the version, then
runs chat and generate greedily, streaming and not, and checks that both modes agree
and that the counts and durations are filled in; `format` with held-out JSON schemas
(validated with `jsonschema`) and `"json"`; and a tool call round trip (the call in
ollama's shape, read with the client's types, streamed and not; its result as a `tool`
message through the client; the model's answer).
"""

import argparse
import json
import sys

try:
    import httpx
    import jsonschema
    import ollama
except ImportError as e:
    sys.exit(f"a Python package is missing ({e}): python3 -m pip install ollama jsonschema")


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
    # The default model's template renders tools and it has FIM tokens; it does not think.
    check(shown.capabilities == ["completion", "tools", "insert"],
          f"capabilities {shown.capabilities}")
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
    # The client checks `format` itself; the server's refusal, sent raw.
    bad = httpx.post(f"{args.host}/api/chat",
                     json={"model": model, "messages": messages, "format": "xml"})
    check(bad.status_code == 400 and "format" in bad.json()["error"], f"format: {bad.text}")
    structured(client, model)
    tool_round_trip(client, args.host, model)
    print("e2e ok")


# Schemas the server's own tests do not use, as a client would write them.
SCHEMAS = [
    ("Describe a book.", {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40}, "pages": {"type": "integer", "minimum": 1},
        "genre": {"enum": ["novel", "poetry", "essay"]}},
        "required": ["title", "pages", "genre"], "additionalProperties": False}),
    ("List two planets with their moons.", {"type": "object", "properties": {
        "planets": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                             "moons": {"type": "integer", "minimum": 0}},
            "required": ["name", "moons"], "additionalProperties": False}}},
        "required": ["planets"], "additionalProperties": False}),
]


def structured(client, model):
    options = {"temperature": 0, "num_predict": 80}
    for prompt, schema in SCHEMAS:
        msgs = [{"role": "user", "content": prompt}]
        r = client.chat(model=model, messages=msgs, format=schema, options=options)
        jsonschema.validate(json.loads(r.message.content), schema)
        parts = list(client.chat(model=model, messages=msgs, format=schema, options=options,
                                 stream=True))
        streamed = "".join(p.message.content or "" for p in parts)
        check(streamed == r.message.content, f"streamed {streamed!r} == {r.message.content!r}")
    r = client.generate(model=model, prompt="Describe a cat as JSON.", format="json",
                        options=options)
    check(isinstance(json.loads(r.response), dict), f"format json: {r.response!r}")
    r = client.generate(model=model, prompt=SCHEMAS[0][0], format=SCHEMAS[0][1], options=options)
    jsonschema.validate(json.loads(r.response), SCHEMAS[0][1])


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def raw_chat(host, body):
    """An /api/chat request with this server's `tool_choice` extension, which ollama's
    client cannot send; the answers are read with the client's own types."""
    r = httpx.post(f"{host}/api/chat", json=body, timeout=120)
    check(r.status_code == 200, f"/api/chat: {r.status_code} {r.text}")
    if not body.get("stream", True):
        return ollama.ChatResponse.model_validate(r.json())
    return [ollama.ChatResponse.model_validate(json.loads(line)) for line in r.text.splitlines()]


def tool_round_trip(client, host, model):
    options = {"temperature": 0, "num_predict": 60}
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    # Left to decide (`auto`, ollama's only mode), the model may answer or call.
    r = client.chat(model=model, messages=msgs, tools=[WEATHER], options=options)
    check(r.message.content or r.message.tool_calls, f"an answer or a call: {r.message}")
    # This small model answers in text: the call is asked for with `tool_choice`.
    body = {"model": model, "messages": msgs, "tools": [WEATHER], "tool_choice": "required",
            "options": options, "stream": False}
    r = raw_chat(host, body)
    calls = r.message.tool_calls or []
    check(len(calls) >= 1 and calls[0].function.name == "get_weather", f"a tool call: {r.message}")
    check(isinstance(calls[0].function.arguments, dict), f"arguments {calls[0].function.arguments}")
    jsonschema.validate(dict(calls[0].function.arguments), WEATHER["function"]["parameters"])
    parts = raw_chat(host, {**body, "stream": True})
    check(parts[-1].done, "the streamed call ends done")
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    check([c.function.arguments for c in streamed[:1]] == [calls[0].function.arguments],
          f"streamed calls {streamed}")
    # The call goes back through the client as history, with its result.
    msgs.append(r.message)
    msgs.append({"role": "tool", "content": "18 degrees and sunny", "tool_name": "get_weather"})
    r2 = client.chat(model=model, messages=msgs, options=options)
    check((r2.message.content or "").strip(), f"an answer to the tool result: {r2.message}")
    print(f"tool round trip: get_weather({calls[0].function.arguments}) -> {r2.message.content!r}")


if __name__ == "__main__":
    main()
