#!/usr/bin/env python3
"""Golden vectors for minfer's WordPiece tokenizer, from llama.cpp's WPM tokenizer.

The vocabulary is the tiny BERT's (crates/models/src/testing/bert.rs), written by
`cargo run -p minfer-models --example write_tiny_models -- DIR` into DIR/bert; llama.cpp
(through its Python bindings, built as scripts/gen_embed_reference.py describes) loads
that file's vocabulary and tokenizes every case, with and without special tokens added
and with and without special-token parsing:

    PYTHONPATH=DIR/llama_cpp_python-0.3.36 \\
    LLAMA_CPP_LIB_PATH=DIR/llama_cpp_python-0.3.36/vendor/llama.cpp/build2/bin \\
    python3 scripts/gen_wpm_tokenizer_golden.py DIR

Output, crates/tokenizer/tests/golden/wpm.json: {"gguf": {tokenizer metadata key:
value}, "cases": [{"text", "special", "add", "ids"}]}, read by
crates/tokenizer/tests/llama_golden.rs, which writes the vocabulary into a GGUF file with
minfer's writer and compares encodings.
"""
import json
import os
import random
import sys

import gguf
import llama_cpp

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "crates", "tokenizer", "tests", "golden", "wpm.json")

KEYS = [
    "tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.token_type_count", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.mask_token_id",
]

CASES = [
    "", "a", "A", "hello", "Hello, World!", "HELLO WORLD", "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Retrieval-augmented generation looks up passages similar to the question.",
    "SELECT name, COUNT(*) FROM users GROUP BY name ORDER BY 2 DESC;",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "playing played plays replay unplayable tokenizer embedding",
    "zebra yak xylophone wolf victory umbrella",
    # accents and normalization
    "Café crème brûlée à la façon de Noël", "naïve résumé coöperate", "ÀÉÎÕÜ àéîõü",
    "e\u0301 vs é (decomposed vs composed)", "a\u0300\u0301\u0302\u0303 stacked marks",
    "Größenwahn: Straße, Fuß", "Zażółć gęślą jaźń", "Ærøskøbing, Åland, ðæt þing",
    "İstanbul ı I", "ﬁ ﬂ ligatures", "Ⅻ ⅻ ½ ² ³", "ＡＢＣ１２３！？ fullwidth",
    # scripts
    "中文 文本 中文中文", "你好，世界！今天天气很好。", "日本語のテキスト：ひらがな、カタカナ",
    "한국어 문장입니다. 안녕하세요!", "Привет, мир! Как дела?", "مرحبا بالعالم!",
    "नमस्ते दुनिया।", "Ελληνικά: Γειά σου", "mixed: Hello世界Привет🌍",
    "😀😃 emoji 👨‍👩‍👧 family", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𒀀",
    # punctuation and symbols
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "...", "?!?!", "a.b.c", "1,000,000.00",
    "3.14159 -273.15 100% $1.99 €5 £3 ¥4", "user@example.com https://x.org/a?b=1",
    "«Guillemets» “curly” ‘single’ — em–en…", "don't can't it's O'Brien's",
    "math: ∀x∈ℝ, x²≤1 ⇒ √x", "snake_case camelCase kebab-case",
    # whitespace and control characters
    " ", "   ", "\t", "\n\n", "  leading", "trailing  ", "a\tb\nc\r\nd",
    "nbsp:\u00a0between", "ideographic\u3000space", "line\u2028sep\u2029para",
    "zero\u200bwidth\u200cjoiner\u200dtest\ufeffbom", "control: \x00\x01\x07\x1b[31mred\x7f",
    "x\u0085next", "replacement \ufffd char", "private \ue000 use",
    # special tokens as text
    "[CLS] hello [SEP]", "[MASK]", "[UNK] [PAD]", "a[SEP]b", "[cls] lower", "[CLS",
]


def random_strings(n, seed):
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "éèêëàâäôöùûüçñ", "абвгдежз",
        "的一是不中文", "あいうアイ", "가나다", "😀🎉", "\u200d\u0301\u00a0",
    ]
    words = ["the", "playing", "fox", "[SEP]", "[MASK]", "un", "search", "  ", "café"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 10)):
            if rng.random() < 0.3:
                parts.append(rng.choice(words))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 7))))
        out.append("".join(parts))
    return out


def meta(path):
    r = gguf.GGUFReader(path)
    out = {}
    for key in KEYS:
        f = r.fields[key]
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            if f.types[1] == gguf.GGUFValueType.STRING:
                out[key] = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                out[key] = [int(f.parts[i][0]) for i in f.data]
        elif t == gguf.GGUFValueType.STRING:
            out[key] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            out[key] = int(f.parts[f.data[0]][0])
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_wpm_tokenizer_golden.py DIR")
    path = os.path.join(sys.argv[1], "bert", "bert-f32.gguf")
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    cases = []
    for i, text in enumerate(CASES + random_strings(240, 20240613)):
        for special in (False, True):
            add = (i + special) % 2 == 0
            ids = llm.tokenize(text.encode("utf-8"), add_bos=add, special=special)
            cases.append({"text": text, "special": special, "add": add, "ids": list(ids)})
    with open(OUT, "w") as f:
        json.dump({"gguf": meta(path), "cases": cases}, f, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
