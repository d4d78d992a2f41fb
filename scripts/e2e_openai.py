#!/usr/bin/env python3
"""End-to-end check of `minfer serve` with the official openai client.

Usage: e2e_openai.py --base-url http://127.0.0.1:PORT/v1 [--api-key KEY]
Runs chat (streaming and not) and text completions (streaming and not) greedily and
checks that both modes agree, that usage adds up and that finish reasons are right; then
`n=2` choices from one prefill, `logit_bias` removing and forcing a token, the stream's
chunk shape, `system_fingerprint`, and OpenAI's `context_length_exceeded` error.
"""

import argparse
import json
import sys
import urllib.request

try:
    import openai
except ImportError:
    sys.exit("the openai Python package is missing: python3 -m pip install openai")


def check(cond, what):
    if not cond:
        sys.exit(f"e2e failure: {what}")


def raw(root, path, key, body=None):
    """GET (or POST `body` as JSON to) the server's own routes outside /v1."""
    req = urllib.request.Request(root + path, headers={"Authorization": f"Bearer {key}"})
    if body is not None:
        req.data = json.dumps(body).encode()
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req) as r:
        return r.read().decode()


def prefilled(root, key):
    for line in raw(root, "/metrics", key).splitlines():
        if line.startswith("minfer_prefill_tokens_total "):
            return int(line.split()[1])
    sys.exit("e2e failure: minfer_prefill_tokens_total missing from /metrics")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default="unused")
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0)

    models = client.models.list().data
    check(len(models) == 1, f"one model listed, got {models}")
    model = models[0].id

    messages = [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is the capital of France? Answer in one word."},
    ]
    chat = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=16
    )
    choice = chat.choices[0]
    answer = choice.message.content
    check(choice.message.role == "assistant", "assistant role")
    check("Paris" in answer, f"chat answer mentions Paris: {answer!r}")
    check(choice.finish_reason == "stop", f"chat finish_reason {choice.finish_reason}")
    u = chat.usage
    check(u.prompt_tokens > 10 and u.completion_tokens > 0, f"chat usage {u}")
    check(u.total_tokens == u.prompt_tokens + u.completion_tokens, "usage adds up")

    pieces, finish, usage = [], None, None
    stream = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=16,
        stream=True, stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    check("".join(pieces) == answer, f"streamed chat {''.join(pieces)!r} == {answer!r}")
    check(finish == "stop", f"streamed finish_reason {finish}")
    check(usage is not None and usage.completion_tokens == u.completion_tokens,
          f"streamed usage {usage}")

    prompt = "def fibonacci(n):"
    comp = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=12)
    text = comp.choices[0].text
    check(len(text) > 0, "completion text")
    check(comp.choices[0].finish_reason == "length", "completion stops at max_tokens")
    check(comp.usage.completion_tokens == 12, f"completion usage {comp.usage}")
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=model, prompt=prompt, temperature=0, max_tokens=12, stream=True
        )
        if c.choices
    )
    check(streamed == text, f"streamed completion {streamed!r} == {text!r}")
    # A batch of prompts, as evaluation harnesses send them: one choice per prompt, in
    # order, each the prompt's own completion; the usage counts both prompts.
    other = "class Stack:"
    alone = client.completions.create(model=model, prompt=other, temperature=0, max_tokens=12)
    batch = client.completions.create(
        model=model, prompt=[prompt, other], temperature=0, max_tokens=12
    )
    check([c.index for c in batch.choices] == [0, 1], f"batch indices {batch.choices}")
    check([c.text for c in batch.choices] == [text, alone.choices[0].text],
          f"batch texts {[c.text for c in batch.choices]}")
    check(batch.usage.prompt_tokens == comp.usage.prompt_tokens + alone.usage.prompt_tokens,
          f"batch usage {batch.usage}")

    root = args.base_url.rstrip("/").removesuffix("/v1")
    fp = chat.system_fingerprint
    check(fp and fp.startswith("fp_"), f"system_fingerprint {fp!r}")
    check(comp.system_fingerprint == fp, "one fingerprint for one model")

    # The stream's shape: the role in the first delta only, finish_reason in the last
    # choice chunk, the usage chunk with no choices last; one id and fingerprint.
    chunks = list(client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=4,
        stream=True, stream_options={"include_usage": True},
    ))
    check(chunks[0].choices[0].delta.role == "assistant", "role in the first delta")
    check(all(c.choices[0].delta.role is None for c in chunks[1:-1]), "role only first")
    check(chunks[-2].choices[0].finish_reason is not None, "finish in the last choice chunk")
    check(all(c.choices[0].finish_reason is None for c in chunks[:-2]), "finish only last")
    check(chunks[-1].choices == [] and chunks[-1].usage is not None, "usage chunk last")
    check(all(c.usage is None for c in chunks[:-1]), "usage null before the last chunk")
    check(len({c.id for c in chunks}) == 1, "one id across the chunks")
    check({c.system_fingerprint for c in chunks} == {fp}, "fingerprint on every chunk")

    # n=2 with a fixed seed: two different choices from a single prefill.
    story = [{"role": "user", "content": "Invent a name for a new fruit. Reply with the name."}]
    before = prefilled(root, args.api_key)
    two = client.chat.completions.create(
        model=model, messages=story, n=2, seed=11, temperature=1.0, max_tokens=12
    )
    after = prefilled(root, args.api_key)
    a, b = (c.message.content for c in two.choices)
    check([c.index for c in two.choices] == [0, 1], "choice indices")
    check(a != b, f"two different choices: {a!r} {b!r}")
    cached = two.usage.prompt_tokens_details.cached_tokens
    check(after - before == two.usage.prompt_tokens - cached,
          f"one prefill: {after - before} prompt tokens ran for {two.usage}")
    again = client.chat.completions.create(
        model=model, messages=story, n=2, seed=11, temperature=1.0, max_tokens=12
    )
    check([c.message.content for c in again.choices] == [a, b], "a fixed seed repeats")

    # logit_bias on greedy output: -100 removes the token the answer starts with,
    # +100 forces another one at every step.
    ids = json.loads(raw(root, "/tokenize", args.api_key, {"content": answer}))["tokens"]
    first = ids[0]
    piece = json.loads(raw(root, "/detokenize", args.api_key, {"tokens": [first]}))["content"]
    banned = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=8, logprobs=True,
        logit_bias={str(first): -100},
    )
    toks = [t.token for t in banned.choices[0].logprobs.content]
    check(piece not in toks, f"token {first} {piece!r} banned, got {toks}")
    forced_id = json.loads(raw(root, "/tokenize", args.api_key, {"content": " banana"}))["tokens"][0]
    forced_piece = json.loads(
        raw(root, "/detokenize", args.api_key, {"tokens": [forced_id]}))["content"]
    forced = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=3, logprobs=True,
        logit_bias={str(forced_id): 100},
    )
    toks = [t.token for t in forced.choices[0].logprobs.content]
    check(toks == [forced_piece] * 3, f"token {forced_id} {forced_piece!r} forced, got {toks}")

    # OpenAI's error for a prompt past the context, through the client's exception.
    try:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello " * 3000}], max_tokens=4
        )
        check(False, "an over-long prompt is refused")
    except openai.BadRequestError as e:
        check(e.code == "context_length_exceeded", f"error code {e.code!r}: {e}")
        check("maximum context length is" in str(e), f"error message: {e}")

    # A final assistant message is continued (prefill), as llama-server does.
    cont = client.chat.completions.create(
        model=model, temperature=0, max_tokens=6,
        messages=[{"role": "user", "content": "Count from 1 to 10."},
                  {"role": "assistant", "content": "1, 2, 3,"}],
    )
    said = cont.choices[0].message.content
    check(said.lstrip().startswith("4"), f"the prefill is continued: {said!r}")

    print(f"e2e ok: chat {answer!r}, completion {text!r}")


if __name__ == "__main__":
    main()
