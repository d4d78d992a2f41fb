#!/usr/bin/env python3
"""Reference renderings of Qwen3.5's and Qwen3-Coder's chat templates, made with Jinja2
configured as Hugging Face transformers renders chat templates (`apply_chat_template`):
an ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loop-controls
extension, `raise_exception`, and transformers' own `tojson` filter (`json.dumps` with
ensure_ascii=False and keys in insertion order, not Jinja2's sorted, HTML-escaped one).
The template is rendered with `messages`, `tools` (None when the request has none),
`documents` (None), `add_generation_prompt`, the tokenizer's special tokens and the
extra keyword arguments (`enable_thinking`), as transformers passes them. Tool call
arguments are objects, as transformers expects them (an OpenAI request carries them as
JSON text, which minfer parses before rendering).

The templates are the ones the models ship in tokenizer_config.json, as llama.cpp keeps
them under models/templates/ (Qwen3.5-4B.jinja, Qwen3-Coder.jinja). Every case below is
rendered with each template and written, templates included, into
crates/tokenizer/tests/golden/qwen35_chat.json:

  {"templates": [{"name", "source", "bos_token", "eos_token"}],
   "renders": [{"template", "case", "messages", "tools", "add_generation_prompt",
                "kwargs", "text"} | {..., "error"}]}

A case a template refuses is recorded with "error": the message of its raise_exception.

Rerun (needs: pip install jinja2; no network):
  python3 scripts/gen_qwen35_chat_golden.py LLAMA_CPP/models/templates
"""

import json
import os
import sys

import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "crates", "tokenizer", "tests", "golden", "qwen35_chat.json")

TEMPLATES = [
    ("qwen35", "Qwen3.5-4B.jinja"),
    ("qwen3_coder", "Qwen3-Coder.jinja"),
]
# Qwen's tokenizers have no BOS token; transformers passes the special tokens it has.
SPECIAL = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.  ",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "days": {"type": "integer", "minimum": 1},
                    "units": {"type": ["string", "null"], "enum": ["metric", "imperial", None]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_sql",
            "description": "Runs a query.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "number"},
                    "dry_run": {"type": "boolean"},
                    "params": {"type": "object"},
                    "columns": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["query"],
            },
            "strict": True,
        },
    },
]

CALLS = [
    {"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}},
    {"id": "call_2", "type": "function",
     "function": {"name": "run_sql", "arguments": {
         "query": "SELECT *\nFROM t\nWHERE a < 3", "limit": 2.5, "dry_run": True,
         "params": {"a": [1, "x"], "b": None}, "columns": ["a", "b"]}}},
]

CASES = [
    ("single", [{"role": "user", "content": "Hello!"}], None),
    ("system_multi_turn", [
        {"role": "system", "content": "  You are a concise assistant.\n"},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\n4."},
        {"role": "user", "content": "And 3+3? 谢谢 🙂"},
    ], None),
    ("tools", [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Paris?"},
    ], TOOLS),
    ("tool_calls_and_results", [
        {"role": "user", "content": "Weather in Paris, then query the table."},
        {"role": "assistant", "content": "", "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "2 rows"},
    ], TOOLS),
    ("tool_call_with_text_and_reasoning", [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "\nThe user wants weather.\n",
         "tool_calls": [CALLS[0]]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "Thanks"},
    ], TOOLS),
    ("no_user_query", [{"role": "system", "content": "x"}], None),
    ("system_not_first", [
        {"role": "user", "content": "a"},
        {"role": "system", "content": "b"},
    ], None),
]

KWARGS = [{}, {"enable_thinking": True}, {"enable_thinking": False}]


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    templates, renders = [], []
    for name, file in TEMPLATES:
        with open(os.path.join(sys.argv[1], file), encoding="utf-8") as f:
            source = f.read()
        templates.append({"name": name, "source": source, "bos_token": "",
                          "eos_token": SPECIAL["eos_token"]})
        tmpl = env.from_string(source)
        for case, messages, tools in CASES:
            for gen in (False, True):
                for kwargs in KWARGS:
                    r = {"template": name, "case": case, "messages": messages, "tools": tools,
                         "add_generation_prompt": gen, "kwargs": kwargs}
                    try:
                        r["text"] = tmpl.render(messages=messages, tools=tools, documents=None,
                                                add_generation_prompt=gen, **SPECIAL, **kwargs)
                    except TemplateError as e:
                        r["error"] = str(e)
                    renders.append(r)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"templates": templates, "renders": renders}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(renders)} renders")


if __name__ == "__main__":
    main()
