#!/usr/bin/env python3
"""End-to-end check of `minfer serve` with the official openai client.

Usage: e2e_openai.py --base-url http://127.0.0.1:PORT/v1 [--api-key KEY]
Runs chat (streaming and not) and text completions (streaming and not) greedily and
checks that both modes agree, that usage adds up and that finish reasons are right.
"""

import argparse
import sys

try:
    import openai
except ImportError:
    sys.exit("the openai Python package is missing: python3 -m pip install openai")


def check(cond, what):
    if not cond:
        sys.exit(f"e2e failure: {what}")


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

    try:
        client.chat.completions.create(model=model, messages=messages, n=2)
        check(False, "n=2 is refused")
    except openai.BadRequestError as e:
        check("`n`" in str(e), f"n=2 error names the field: {e}")

    print(f"e2e ok: chat {answer!r}, completion {text!r}")


if __name__ == "__main__":
    main()
