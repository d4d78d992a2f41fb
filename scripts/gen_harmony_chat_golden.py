#!/usr/bin/env python3
"""Reference renderings of gpt-oss's harmony chat template, with Jinja2 as transformers
uses it (`apply_chat_template`: trim_blocks, lstrip_blocks, `raise_exception`,
`strftime_now`), written with the template into
crates/tokenizer/tests/golden/harmony_chat.json:

  {"source", "date", "renders": [{"messages", "tools", "add_generation_prompt", "text"}]}

TEMPLATE is the template the gpt-oss GGUF files carry as `tokenizer.chat_template`
(llama.cpp keeps a copy as models/templates/openai-gpt-oss-120b.jinja). `strftime_now`
returns the fixed date `date` here; the test puts the same date in place of the one its
render writes, so the comparison does not depend on the day it runs.

Rerun (needs: pip install jinja2; no network):
  python3 scripts/gen_harmony_chat_golden.py TEMPLATE
"""

import json
import os
import sys

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "crates", "tokenizer", "tests", "golden", "harmony_chat.json")
DATE = "2026-01-01"

CASES = [
    ([{"role": "user", "content": "Hello!"}], None),
    (
        [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "What is 2+2? 谢谢"},
            {"role": "assistant", "content": "Four."},
            {"role": "user", "content": "And 3+3?"},
        ],
        None,
    ),
    (
        [{"role": "user", "content": "Weather in Paris?"}],
        [{"type": "function", "function": {
            "name": "get_weather", "description": "Current weather of a city.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "The city."},
                "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"]}}}],
    ),
]


def raise_exception(message):
    raise TemplateError(message)


def tojson(value, indent=None, ensure_ascii=False, sort_keys=False):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_harmony_chat_golden.py TEMPLATE")
    with open(sys.argv[1], encoding="utf-8") as f:
        source = f.read()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: DATE
    env.filters["tojson"] = tojson
    tmpl = env.from_string(source)
    renders = []
    for messages, tools in CASES:
        for gen in (False, True):
            text = tmpl.render(messages=messages, tools=tools, add_generation_prompt=gen,
                               bos_token="<|startoftext|>", eos_token="<|return|>")
            renders.append({"messages": messages, "tools": tools,
                            "add_generation_prompt": gen, "text": text})
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"source": source, "date": DATE, "renders": renders}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(renders)} renders")


if __name__ == "__main__":
    main()
