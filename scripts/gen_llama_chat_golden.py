#!/usr/bin/env python3
"""Reference renderings of the Llama family's chat templates, with Jinja2 as transformers
uses it (`apply_chat_template`: trim_blocks, lstrip_blocks, `raise_exception`).

The templates are the ones the models' tokenizer_config.json files ship (and GGUF
converters copy into `tokenizer.chat_template`): Llama 3 Instruct, Llama 2 Chat, Mistral
Instruct. Each is rendered for every conversation below, with and without the generation
prompt, and written with the template into
crates/tokenizer/tests/golden/llama_chat.json:

  {"templates": [{"name", "source", "bos_token", "eos_token"}],
   "conversations": [[{"role", "content"}]],
   "renders": [{"template", "conversation", "add_generation_prompt", "text"}]}

A conversation a template refuses (Llama 2 and Mistral require alternating user/assistant
turns) is recorded with "error": the message of its raise_exception.

Rerun (needs: pip install jinja2; no network):
  python3 scripts/gen_llama_chat_golden.py
"""

import json
import os

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "crates", "tokenizer", "tests", "golden", "llama_chat.json")

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
    " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
    "<|end_header_id|>\n\n' }}{% endif %}"
)

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
    "system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] "
    "== 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != "
    "false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
    "message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif "
    "message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)

MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
    "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}"
)

TEMPLATES = [
    {"name": "llama3", "source": LLAMA3, "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    {"name": "llama2", "source": LLAMA2, "bos_token": "<s>", "eos_token": "</s>"},
    {"name": "mistral", "source": MISTRAL, "bos_token": "<s>", "eos_token": "</s>"},
]

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are a concise coding assistant."},
        {"role": "user", "content": "Write a Python one-liner that reverses a string."},
        {"role": "assistant", "content": "  s[::-1]  "},
        {"role": "user", "content": "And in Rust? 谢谢 🙂\n"},
    ],
    [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "second"},
        {"role": "user", "content": "  third, with spaces around  "},
    ],
    [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
]


def raise_exception(message):
    raise TemplateError(message)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    renders = []
    for t in TEMPLATES:
        tmpl = env.from_string(t["source"])
        for ci, conv in enumerate(CONVERSATIONS):
            for gen in (False, True):
                r = {"template": t["name"], "conversation": ci, "add_generation_prompt": gen}
                try:
                    r["text"] = tmpl.render(messages=conv, add_generation_prompt=gen,
                                            bos_token=t["bos_token"], eos_token=t["eos_token"])
                except TemplateError as e:
                    r["error"] = str(e)
                renders.append(r)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"templates": TEMPLATES, "conversations": CONVERSATIONS, "renders": renders},
                  f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(renders)} renders")


if __name__ == "__main__":
    main()
