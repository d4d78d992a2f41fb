#!/usr/bin/env python3
"""Anthropic's Messages API of `minfer serve`, through the official anthropic client.

Usage: e2e_anthropic.py --base-url http://127.0.0.1:PORT/v1
Runs a conversation with a tool call and its result, not streamed and streamed (the
streamed answers must equal the others: the model is greedy), checks the tool input
against its schema, a stop sequence, token counting, a JSON schema through
`output_config.format`, and a refusal in Anthropic's error shape.
"""

import argparse
import json
import sys

try:
    import anthropic
    import jsonschema
except ImportError as e:
    sys.exit(f"a Python package is missing ({e}): python3 -m pip install anthropic jsonschema")


def check(cond, what):
    if not cond:
        sys.exit(f"e2e failure: {what}")


WEATHER = {
    "name": "get_weather",
    "description": "The current weather of a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"},
                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
SYSTEM = [{"type": "text", "text": "You are a helpful assistant."},
          {"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral"}}]


def blocks(msg, kind):
    return [b for b in msg.content if b.type == kind]


def streamed(client, **kw):
    with client.messages.stream(**kw) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    check(kinds[0] == "message_start", f"first event {kinds[:3]}")
    check("content_block_start" in kinds and "message_stop" in kinds, f"events {kinds}")
    return final


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    args = ap.parse_args()
    # The client adds `/v1/messages` itself.
    client = anthropic.Anthropic(base_url=args.base_url.removesuffix("/v1"), api_key="unused")
    msgs = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    # Greedy: `temperature` goes in the body, as clients of older models send it.
    greedy = {"extra_body": {"temperature": 0}}
    common = dict(model="m", system=SYSTEM, tools=[WEATHER], **greedy)

    r = client.messages.create(max_tokens=80, messages=msgs,
                               tool_choice={"type": "tool", "name": "get_weather"}, **common)
    check(r.type == "message" and r.role == "assistant" and r.id.startswith("msg_"), f"{r}")
    check(r.stop_reason == "tool_use", f"stop_reason {r.stop_reason}")
    uses = blocks(r, "tool_use")
    check(len(uses) == 1 and uses[0].name == "get_weather", f"content {r.content}")
    jsonschema.validate(uses[0].input, WEATHER["input_schema"])
    check(r.usage.input_tokens > 0 and r.usage.output_tokens > 0, f"usage {r.usage}")
    s = streamed(client, max_tokens=80, messages=msgs,
                 tool_choice={"type": "tool", "name": "get_weather"}, **common)
    su = blocks(s, "tool_use")
    check(s.stop_reason == "tool_use" and len(su) == 1, f"streamed {s}")
    check(su[0].input == uses[0].input, f"streamed input {su[0].input} == {uses[0].input}")

    # The tool's result, and the model's answer to it (no further call allowed).
    msgs.append({"role": "assistant", "content": r.content})
    msgs.append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": uses[0].id, "content": "18 degrees and sunny"}]})
    r2 = client.messages.create(max_tokens=40, messages=msgs, tool_choice={"type": "none"},
                                **common)
    text = "".join(b.text for b in blocks(r2, "text"))
    check(text.strip(), f"an answer to the tool result: {r2}")
    check(r2.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {r2.stop_reason}")
    s2 = streamed(client, max_tokens=40, messages=msgs, tool_choice={"type": "none"}, **common)
    stext = "".join(b.text for b in blocks(s2, "text"))
    check(stext == text, f"streamed answer {stext!r} == {text!r}")
    print(f"tool round trip: get_weather({uses[0].input}) -> {text!r}")

    n = client.messages.count_tokens(model="m", system=SYSTEM, messages=msgs, tools=[WEATHER],
                                     tool_choice={"type": "none"})
    check(n.input_tokens == r2.usage.input_tokens, f"count {n.input_tokens} == {r2.usage.input_tokens}")

    # A stop sequence ends the answer and is named.
    r3 = client.messages.create(model="m", max_tokens=30,
                                messages=[{"role": "user", "content": "Count from 1 to 9 with commas."}],
                                stop_sequences=["5"], **greedy)
    check(r3.stop_reason == "stop_sequence" and r3.stop_sequence == "5", f"stop {r3}")
    check("5" not in "".join(b.text for b in blocks(r3, "text")), f"text {r3.content}")

    # Structured output: `output_config.format` with a JSON schema.
    city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                             "country": {"type": "string", "maxLength": 30}},
            "required": ["city", "country"], "additionalProperties": False}
    r4 = client.messages.create(model="m", max_tokens=60, messages=[
        {"role": "user", "content": "Give a city and its country."}],
        output_config={"format": {"type": "json_schema", "schema": city}}, **greedy)
    jsonschema.validate(json.loads("".join(b.text for b in blocks(r4, "text"))), city)

    try:
        client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}]}])
        check(False, "an image block is refused")
    except anthropic.BadRequestError as e:
        err = e.body.get("error", {}) if isinstance(e.body, dict) else {}
        check(err.get("type") == "invalid_request_error", f"error shape {e.body}")
        check("messages[0].content[0].type" in err.get("message", ""), f"error {e.body}")
    print("e2e ok")


if __name__ == "__main__":
    main()
