#!/usr/bin/env python3
"""Structured output and tool calls of `minfer serve`, through the official openai client.

Usage: e2e_structured.py --base-url http://127.0.0.1:PORT/v1 [--api-key KEY]
Sends JSON schemas of increasing difficulty through `response_format` (chat, streaming
and not) and `/v1/completions`, validating every answer with `jsonschema`; checks greedy
determinism; runs a tool-calling round trip (the model calls a tool with arguments valid
for its schema, a `tool` message answers, the model replies), also with `tool_choice`
naming the function and streamed; and checks that a schema that cannot compile is a 400
with the reason, and llama-server's `grammar` field.
"""

import argparse
import json
import sys
import time

try:
    import jsonschema
    import openai
except ImportError as e:
    sys.exit(f"a Python package is missing ({e}): python3 -m pip install openai jsonschema")


def check(cond, what):
    if not cond:
        sys.exit(f"e2e failure: {what}")


def obj(props, required=None, **extra):
    s = {"type": "object", "properties": props, "additionalProperties": False}
    s["required"] = list(props) if required is None else required
    s.update(extra)
    return s


# (prompt, schema), easiest first.
SCHEMAS = [
    ("Is water wet?", obj({"answer": {"type": "boolean"}})),
    ("Pick a number from 1 to 10.", obj({"n": {"type": "integer", "minimum": 1, "maximum": 10}})),
    ("Name a color.", obj({"color": {"type": "string", "enum": ["red", "green", "blue"]}})),
    ("Give a city and its country.", obj({"city": {"type": "string"}, "country": {"type": "string"}})),
    ("Describe a cat.", obj({"name": {"type": "string"}, "age": {"type": "integer"},
                             "indoor": {"type": "boolean"}}, required=["name"])),
    ("List three fruits.", obj({"fruits": {"type": "array", "items": {"type": "string"},
                                           "minItems": 3, "maxItems": 3}})),
    ("List prime numbers below 12.", obj({"primes": {"type": "array", "items": {"type": "integer"},
                                                     "minItems": 1, "maxItems": 5}})),
    ("Give the temperature in Paris.", obj({"celsius": {"type": "number"},
                                            "unit": {"const": "C"}})),
    ("Write a date.", obj({"date": {"type": "string", "format": "date"}})),
    ("Give an email address for Bob.", obj({"email": {"type": "string", "format": "email"}})),
    ("Make up a product code.", obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}})),
    ("Describe a person with an address.", obj({
        "name": {"type": "string", "maxLength": 20},
        "address": obj({"street": {"type": "string", "maxLength": 30},
                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}),
    })),
    ("Give two books with their years.", obj({"books": {"type": "array", "minItems": 1, "maxItems": 2,
        "items": obj({"title": {"type": "string", "maxLength": 30},
                      "year": {"type": "integer", "minimum": 1000, "maximum": 2100}})}})),
    ("Answer: a status or an error.", obj({"result": {"anyOf": [
        obj({"ok": {"const": True}, "value": {"type": "integer"}}),
        obj({"ok": {"const": False}, "error": {"type": "string", "maxLength": 20}})]}})),
    ("Describe a tiny task list.", obj({
        "owner": {"type": "string", "maxLength": 12},
        "tasks": {"type": "array", "minItems": 1, "maxItems": 2, "items": obj({
            "id": {"type": "integer", "minimum": 0},
            "state": {"enum": ["todo", "done"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
        }, required=["id", "state"])},
        "meta": {"type": ["object", "null"], "properties": {"v": {"type": "integer"}},
                 "additionalProperties": False},
    }, required=["owner", "tasks"])),
    ("Give a point.", {"$defs": {"coord": {"type": "number", "minimum": -90, "maximum": 90}},
                       **obj({"lat": {"$ref": "#/$defs/coord"}, "lon": {"$ref": "#/$defs/coord"}})}),
]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": obj({"city": {"type": "string"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                          required=["city"]),
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "Current time in a time zone",
                 "parameters": obj({"zone": {"type": "string"}})},
}


def schema_format(name, schema, strict=True):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}


def validate(text, schema, what):
    try:
        v = json.loads(text)
    except json.JSONDecodeError as e:
        sys.exit(f"e2e failure: {what}: not JSON ({e}): {text!r}")
    try:
        jsonschema.validate(v, schema, format_checker=jsonschema.FormatChecker())
    except jsonschema.ValidationError as e:
        sys.exit(f"e2e failure: {what}: invalid for its schema ({e.message}): {text!r}")
    return v


def chat_json(client, prompt, schema, stream, max_tokens=96):
    msgs = [{"role": "user", "content": prompt + " Answer in JSON."}]
    fmt = schema_format("answer", schema)
    if not stream:
        r = client.chat.completions.create(model="m", messages=msgs, temperature=0,
                                           max_tokens=max_tokens, response_format=fmt)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = "", None
    for ch in client.chat.completions.create(model="m", messages=msgs, temperature=0,
                                             max_tokens=max_tokens, response_format=fmt,
                                             stream=True):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
    return text, finish


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default="none")
    a = ap.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0)
    t0 = time.time()

    valid = 0
    for i, (prompt, schema) in enumerate(SCHEMAS):
        jsonschema.Draft202012Validator.check_schema(schema)
        text, finish = chat_json(client, prompt, schema, stream=False)
        check(finish == "stop", f"schema {i}: finish {finish}: {text!r}")
        validate(text, schema, f"schema {i}")
        # Streaming gives the same greedy answer, and so does asking again.
        s_text, s_finish = chat_json(client, prompt, schema, stream=True)
        check((s_text, s_finish) == (text, finish), f"schema {i}: stream {s_text!r} != {text!r}")
        valid += 1
    again, _ = chat_json(client, SCHEMAS[-2][0], SCHEMAS[-2][1], stream=False)
    first, _ = chat_json(client, SCHEMAS[-2][0], SCHEMAS[-2][1], stream=True)
    check(again == first, "greedy constrained output is deterministic")
    print(f"schemas: {valid}/{len(SCHEMAS)} valid, streaming and not")

    # json_object, and a schema on /v1/completions (streaming and not).
    r = client.chat.completions.create(model="m", temperature=0, max_tokens=60,
                                       response_format={"type": "json_object"},
                                       messages=[{"role": "user",
                                                  "content": "A dog's name and age, in JSON."}])
    check(r.choices[0].finish_reason == "stop", f"json_object: {r.choices[0]}")
    check(isinstance(json.loads(r.choices[0].message.content), dict), "json_object")
    schema = SCHEMAS[5][1]
    fmt = schema_format("fruits", schema)
    r = client.completions.create(model="m", prompt="Three fruits as JSON:", temperature=0,
                                  max_tokens=60, extra_body={"response_format": fmt})
    text = r.choices[0].text
    validate(text, schema, "completion")
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="m", prompt="Three fruits as JSON:", temperature=0, max_tokens=60, stream=True,
        extra_body={"response_format": fmt}) if c.choices)
    check(streamed == text, f"completion stream {streamed!r} != {text!r}")

    # llama-server's fields on the OpenAI routes: `grammar` (GBNF) and `json_schema`.
    r = client.chat.completions.create(model="m", temperature=0, max_tokens=8,
                                       messages=[{"role": "user", "content": "Is fire hot?"}],
                                       extra_body={"grammar": 'root ::= "yes" | "no"'})
    check(r.choices[0].message.content in ("yes", "no"), f"grammar: {r.choices[0].message.content!r}")
    r = client.chat.completions.create(model="m", temperature=0, max_tokens=30,
                                       messages=[{"role": "user", "content": "Pick a color."}],
                                       extra_body={"json_schema": SCHEMAS[2][1]})
    validate(r.choices[0].message.content, SCHEMAS[2][1], "json_schema field")

    # A schema that cannot compile is a 400 that says why.
    try:
        client.chat.completions.create(model="m", max_tokens=5,
                                       messages=[{"role": "user", "content": "x"}],
                                       response_format=schema_format("bad", {"type": "strnig"}))
        sys.exit("e2e failure: a bad schema was accepted")
    except openai.BadRequestError as e:
        check("strnig" in str(e) and "response_format" in str(e), f"bad schema error: {e}")

    # Tool calls: the model calls, a tool message answers, the model replies.
    msgs = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    r = client.chat.completions.create(model="m", messages=msgs, tools=[WEATHER, TIME],
                                       tool_choice="required", temperature=0, max_tokens=80)
    c = r.choices[0]
    check(c.finish_reason == "tool_calls", f"finish {c.finish_reason}")
    call = c.message.tool_calls[0]
    check(call.type == "function" and call.function.name in ("get_weather", "get_time"),
          f"call {call}")
    params = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    validate(call.function.arguments, params["function"]["parameters"], "tool arguments")
    msgs.append(c.message.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": call.id,
                 "content": "It is 21 degrees Celsius and sunny in Paris."})
    # The default model is small: left to `auto` after a tool response, it writes further
    # calls without their tags. `none` asks it for the answer in words.
    r = client.chat.completions.create(model="m", messages=msgs, tools=[WEATHER, TIME],
                                       tool_choice="none", temperature=0, max_tokens=60)
    answer = r.choices[0].message.content or ""
    check(r.choices[0].finish_reason == "stop" and "21" in answer, f"answer {answer!r}")
    print(f"tool round trip: {call.function.name}({call.function.arguments}) -> {answer!r}")

    # A named function, streamed as OpenAI deltas; it agrees with the one-shot answer.
    named = {"type": "function", "function": {"name": "get_time"}}
    msgs = [{"role": "user", "content": "What time is it in Tokyo?"}]
    r = client.chat.completions.create(model="m", messages=msgs, tools=[WEATHER, TIME],
                                       tool_choice=named, temperature=0, max_tokens=60)
    one = r.choices[0].message.tool_calls
    check(len(one) == 1 and one[0].function.name == "get_time", f"named {one}")
    validate(one[0].function.arguments, TIME["function"]["parameters"], "named arguments")
    name, args, finish, ids = "", "", None, set()
    for ch in client.chat.completions.create(model="m", messages=msgs, tools=[WEATHER, TIME],
                                             tool_choice=named, temperature=0, max_tokens=60,
                                             stream=True):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        for tc in d.tool_calls or []:
            check(tc.index == 0, f"index {tc.index}")
            if tc.id:
                ids.add(tc.id)
            name += tc.function.name or ""
            args += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    check((name, args, finish) == ("get_time", one[0].function.arguments, "tool_calls"),
          f"streamed call {name} {args} {finish}")
    check(len(ids) == 1, f"one id in the first delta: {ids}")
    print(f"named call streamed: get_time({args}) in {time.time() - t0:.1f} s")
    print("e2e ok")


if __name__ == "__main__":
    main()
