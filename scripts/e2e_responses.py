#!/usr/bin/env python3
"""OpenAI's Responses API of `minfer serve`, through the official openai client.

Usage: e2e_responses.py --base-url http://127.0.0.1:PORT/v1
`responses.create` with text, a JSON schema (validated with `jsonschema`) and a tool
call, each streamed and not (the streamed answers must equal the others: the model is
greedy); a tool round trip both by passing the items back and by
`previous_response_id` (the two must agree); retrieval; and a refusal naming its field.
"""

import argparse
import json
import sys

try:
    import jsonschema
    import openai
except ImportError as e:
    sys.exit(f"a Python package is missing ({e}): python3 -m pip install openai jsonschema")


def check(cond, what):
    if not cond:
        sys.exit(f"e2e failure: {what}")


CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                         "country": {"type": "string", "maxLength": 30}},
        "required": ["city", "country"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "The current weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}}


def events(stream):
    evs = list(stream)
    types = [e.type for e in evs]
    check(types[:2] == ["response.created", "response.in_progress"], f"first events {types[:3]}")
    check(types[-1] in ("response.completed", "response.incomplete"), f"last event {types[-1]}")
    check([e.sequence_number for e in evs] == list(range(len(evs))), "sequence numbers")
    return evs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused")
    base = dict(model="m", temperature=0)

    r = client.responses.create(input="What is the capital of France? One word.",
                                instructions="Answer briefly.", max_output_tokens=12, **base)
    check(r.object == "response" and r.id.startswith("resp_"), f"{r}")
    check("Paris" in r.output_text, f"text {r.output_text!r}")
    check(r.usage.input_tokens > 0 and r.usage.output_tokens > 0, f"usage {r.usage}")
    evs = events(client.responses.create(input="What is the capital of France? One word.",
                                         instructions="Answer briefly.", max_output_tokens=12,
                                         stream=True, **base))
    text = "".join(e.delta for e in evs if e.type == "response.output_text.delta")
    check(text == r.output_text, f"streamed {text!r} == {r.output_text!r}")
    check(evs[-1].response.output_text == text, "the completed response holds the text")
    check(client.responses.retrieve(r.id).output_text == r.output_text, "retrieve")

    fmt = {"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}}
    r = client.responses.create(input="Give a city and its country.", text=fmt,
                                max_output_tokens=60, **base)
    jsonschema.validate(json.loads(r.output_text), CITY)
    evs = events(client.responses.create(input="Give a city and its country.", text=fmt,
                                         max_output_tokens=60, stream=True, **base))
    done = [e.text for e in evs if e.type == "response.output_text.done"]
    check(done == [r.output_text], f"streamed schema output {done} == {r.output_text!r}")

    items = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.responses.create(input=items, tools=[WEATHER], tool_choice="required",
                                max_output_tokens=60, **base)
    calls = [o for o in r.output if o.type == "function_call"]
    check(len(calls) >= 1 and calls[0].name == "get_weather", f"output {r.output}")
    args_ = json.loads(calls[0].arguments)
    jsonschema.validate(args_, WEATHER["parameters"])
    evs = events(client.responses.create(input=items, tools=[WEATHER], tool_choice="required",
                                         max_output_tokens=60, stream=True, **base))
    streamed = [e.arguments for e in evs if e.type == "response.function_call_arguments.done"]
    check(streamed[:1] == [calls[0].arguments], f"streamed call {streamed} == {calls[0].arguments}")

    result = {"type": "function_call_output", "call_id": calls[0].call_id,
              "output": "18 degrees and sunny"}
    r2 = client.responses.create(input=items + list(r.output) + [result], tools=[WEATHER],
                                 tool_choice="none", max_output_tokens=40, **base)
    check(r2.output_text.strip(), f"an answer to the tool result: {r2.output}")
    r3 = client.responses.create(previous_response_id=r.id, input=[result], tools=[WEATHER],
                                 tool_choice="none", max_output_tokens=40, **base)
    check(r3.output_text == r2.output_text,
          f"previous_response_id {r3.output_text!r} == items {r2.output_text!r}")
    print(f"tool round trip: get_weather({args_}) -> {r2.output_text!r}")

    try:
        client.responses.create(input="hi", extra_body={"bogus_field": 1}, **base)
        check(False, "an unknown field is refused")
    except openai.BadRequestError as e:
        check("bogus_field" in str(e), f"error {e}")
    print("e2e ok")


if __name__ == "__main__":
    main()
