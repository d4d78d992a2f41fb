#!/usr/bin/env python3
"""Golden vectors for minfer's tokenizer, from an independent implementation.

Builds a Hugging Face `tokenizers` BPE tokenizer from the GGUF vocabulary of the default
model (tokens, types and merges read with the `gguf` package), with Qwen2's pre-tokenizer
exactly as its tokenizer.json declares it (Split on the Qwen2 regex, isolated; then
ByteLevel without its own regex) and no normalizer (llama.cpp, and minfer, apply none; HF's
Qwen2 config adds NFC, which would make round trips inexact). Special tokens follow
llama.cpp's rules: USER_DEFINED tokens are always matched in text, CONTROL tokens only with
`special: true`.

Writes, under crates/tokenizer/tests/golden/:
  qwen2_encode.jsonl   one JSON object per line: {"text", "special", "ids"}
  qwen2_chat.txt       transformers' apply_chat_template rendering (Jinja2) of
                       system + user + assistant + user with add_generation_prompt=True
  qwen2_chat.json      the messages rendered into qwen2_chat.txt

Rerun (needs: pip install gguf tokenizers transformers jinja2; no network):
  HF_HUB_OFFLINE=1 python3 scripts/gen_tokenizer_golden.py [MODEL.gguf]
MODEL defaults to $MINFER_HOME/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
(MINFER_HOME defaults to ~/.cache/minfer; `minfer pull` puts the model there).
"""

import json
import os
import random
import sys

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CONTROL, USER_DEFINED = 3, 4
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "tokenizer", "tests", "golden")


def model_path():
    if len(sys.argv) > 1:
        return sys.argv[1]
    home = os.environ.get("MINFER_HOME", os.path.expanduser("~/.cache/minfer"))
    return os.path.join(home, "models", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")


def read_vocab(path):
    r = gguf.GGUFReader(path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    meta = {}
    for key in ("tokenizer.ggml.pre", "tokenizer.chat_template"):
        f = r.fields[key]
        meta[key] = bytes(f.parts[f.data[0]]).decode("utf-8")
    eos = int(r.fields["tokenizer.ggml.eos_token_id"].parts[-1][0])
    return tokens, types, merges, meta, eos


def build(tokens, types, merges, special):
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = []
    for m in merges:
        i = m.index(" ", 1)  # a piece may itself start with the space character
        pairs.append((m[:i], m[i + 1 :]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    tok.add_tokens(user)
    if special:
        ctrl = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL]
        tok.add_special_tokens(ctrl)
    return tok


CODE = [
    'def fib(n):\n    """Return the n-th Fibonacci number."""\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n',
    "fn main() {\n    let xs: Vec<i64> = (1..=10).filter(|x| x % 2 == 0).collect();\n    println!(\"{:?}\", xs);\n}\n",
    "#include <stdio.h>\nint main(void) {\n\tint *p = NULL;\n\tprintf(\"%d\\n\", p ? *p : -1);\n\treturn 0;\n}\n",
    "const add = (a, b) => a + b;\nexport default async function handler(req, res) {\n  res.status(200).json({ ok: true });\n}\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tch := make(chan int, 3)\n\tgo func() { ch <- 42 }()\n\tfmt.Println(<-ch)\n}\n",
    "public class Hello {\n    public static void main(String[] args) {\n        System.out.println(\"Hello, World!\");\n    }\n}\n",
    "SELECT u.id, COUNT(*) AS n\nFROM users u\nJOIN orders o ON o.user_id = u.id\nWHERE o.created_at >= '2024-01-01'\nGROUP BY u.id HAVING n > 10;\n",
    '<!DOCTYPE html>\n<html lang="en">\n  <head><meta charset="utf-8"><title>Test</title></head>\n  <body><div class="a b">&lt;x&gt; &amp; y</div></body>\n</html>\n',
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}' >> counts.log\ndone\n",
    "main :: IO ()\nmain = mapM_ print $ takeWhile (< 100) [x * x | x <- [1 ..]]\n",
    "template <typename T>\nconstexpr T square(const T& x) noexcept { return x * x; }\nstatic_assert(square(3) == 9);\n",
    "local t = { 1, 2, 3 }\nfor i, v in ipairs(t) do print(i, v) end\n",
    "{\"name\": \"minfer\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"gguf\"], \"nested\": {\"a\": null, \"b\": 1.5e-3}}",
    "key: value\nlist:\n  - one\n  - two\nmultiline: |\n  line 1\n  line 2\n",
    "x = [i**2 for i in range(10) if i % 3 != 0]  # squares\nprint(f\"{x=}\")",
    "impl<'a, T: Clone + 'a> Iterator for Iter<'a, T> { type Item = &'a T; }",
    "if (a && b || !c) { x <<= 2; y >>= 3; z ^= 0xFF; } else if (a != b) { return -1; }",
    "$ cargo build --release 2>&1 | tee build.log\n   Compiling minfer v0.1.0\n    Finished release [optimized] target(s) in 42.17s",
    "// TODO(alice): handle the edge case where len == 0\n/* block\n   comment */",
    "@decorator(arg=1)\nclass Foo(Base, metaclass=Meta):\n    __slots__ = ('a', 'b')\n",
    "SELECT * FROM t WHERE name LIKE '%O''Brien%';",
    "\\begin{equation}\n  E = mc^2 \\quad \\forall x \\in \\mathbb{R}\n\\end{equation}",
    "diff --git a/src/lib.rs b/src/lib.rs\n@@ -1,3 +1,4 @@\n-use std::io;\n+use std::io::{self, Read};\n",
    "    indented_with_spaces()\n\tindented_with_tab()\n  \t mixed()\n",
    "a=1;b=2;c=a+b;print(c)",
    "lambda x: x if x else None",
    "ls -la /usr/local/bin | grep -E '^-.*x' | sort -k5 -n",
    "<?php echo htmlspecialchars($_GET['q'] ?? '', ENT_QUOTES); ?>",
    "let re = Regex::new(r\"(?i)^[a-z0-9._%+-]+@[a-z0-9.-]+\\.[a-z]{2,}$\").unwrap();",
    "    return {k: v for k, v in sorted(d.items(), key=lambda kv: -kv[1])}\n\n\n",
]

UNICODE = [
    "Café crème brûlée à la façon de Noël",
    "Größenwahn und Übermut: Straße, Fuß, Maß",
    "Tiếng Việt có dấu: Xin chào thế giới",
    "Zażółć gęślą jaźń — polski pangram",
    "Ærøskøbing, Åland, Ísland, ðæt þing",
    "Привет, мир! Как дела? Всё хорошо.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю",
    "Українська мова: ґанок, їжак, єнот",
    "机器学习是人工智能的一个分支。",
    "你好，世界！今天天气很好。",
    "日本語のテキスト：ひらがな、カタカナ、漢字を含む。",
    "東京タワーは333メートルです",
    "한국어 문장입니다. 안녕하세요!",
    "مرحبا بالعالم! كيف حالك اليوم؟",
    "اللغة العربية جميلة ١٢٣٤٥٦٧٨٩٠",
    "नमस्ते दुनिया। यह एक परीक्षण है।",
    "हिन्दी में अंक: १२३४५",
    "שלום עולם! זה מבחן.",
    "สวัสดีชาวโลก ภาษาไทย",
    "Ελληνικά: Γειά σου Κόσμε, αβγδεζηθ",
    "ქართული ენა, Հայերեն լեզու",
    "😀😃😄😁😆😅🤣😂",
    "👨‍👩‍👧‍👦 family, 👩‍💻 coder, 🏳️‍🌈 flag, 🧑🏽‍🚀 astronaut",
    "👍🏻👍🏼👍🏽👍🏾👍🏿 skin tones",
    "🇯🇵🇺🇸🇩🇪🇫🇷 flags and 1️⃣2️⃣3️⃣ keycaps",
    "❤️ ♥ ✨ ☀️ ⚡ ✅ ❌ ⭐",
    "e\u0301 vs é (decomposed vs composed)",
    "a\u0300\u0301\u0302\u0303 stacked combining marks",
    "zero\u200bwidth\u200cjoiner\u200dtest\ufeffbom",
    "math: ∀x∈ℝ, ∃y: x²+y²≤1 ⇒ √(x²) ≤ 1; ∑ᵢ aᵢ ≈ ∞",
    "currency: $100, €200, £300, ¥400, ₹500, ₿0.01",
    "fullwidth: ＡＢＣ１２３！？",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝓼𝓬𝓻𝓲𝓹𝓽",
    "ancient: 𐌰𐌱𐌲 𓀀𓀁 𒀀",
    "mixed: Hello世界Привет🌍مرحبا",
    "«Guillemets» „Anführungszeichen“ “curly” ‘single’",
    "ellipsis… em—dash en–dash",
    "Ⅻ ⅻ ½ ¾ ⅞ ² ³ ¹",
    "ﬁ ﬂ ligatures and ß ẞ",
    "control chars: \x00\x01\x07\x1b[31mred\x1b[0m\x7f",
]

WHITESPACE = [
    " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n ",
    "    leading spaces", "trailing spaces    ", "  both sides  ", "\tleading tab",
    "trailing tab\t", "\n\nleading newlines", "trailing newlines\n\n\n",
    "a  b   c    d     e", "a\tb\t\tc\t\t\td", "a\nb\n\nc\n\n\nd",
    "line1\r\nline2\r\n\r\nline3", "mixed \t\n \t\n whitespace", "x \t y",
    "word" + " " * 40 + "word", "\n" * 20, " " * 100, "\t" * 17 + "x",
    "nbsp:\u00a0\u00a0between", "ideographic\u3000space", "line\u2028separator\u2029para",
    "thin\u2009space\u202fnarrow", "em\u2003space", "vertical\x0btab\x0cformfeed",
    " !", "  !", "   !!", " (x)", "  1", "\t(", "\n\t\tindented\n", "end with space ",
    "x\u0085next line",
]

DIGITS = [
    "0", "7", "42", "1234567890", "3.14159265358979323846264338327950288419716939937510",
    "12345678901234567890123456789012345678901234567890", "1,000,000.00", "-273.15",
    "1e-10 6.022e23", "0xDEADBEEF 0b1010 0o755", "2024-06-15T12:34:56Z",
    "+1 (555) 123-4567", "v1.2.3-rc.4+build.567", "١٢٣ ٤٥٦ and ०१२", "Ⅳ 4 ④ ⁴",
    "192.168.0.1:8080", "a1b2c3d4", "100%", "$1.99", "9" * 64,
]

CONTRACTIONS = [
    "I'm you're he's we've they'll she'd it's",
    "I'M YOU'RE HE'S WE'VE THEY'LL SHE'D IT'S",
    "I'm You'Re He'S we'Ve They'lL she'D",
    "don't can't won't isn't aren't",
    "DON'T CAN'T WON'T",
    "'s 't 're 've 'm 'll 'd",
    "'S 'T 'RE 'VE 'M 'LL 'D",
    "rock 'n' roll, 'quoted', ''double''",
    "O'Brien's dog's bone",
    "the '90s and '80s",
    "it's'nt a word",
    "y'all'd've",
    "’s curly apostrophe ’re",
    "can't\n'tis",
    "x's y'S z're",
]

SPECIAL = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>",
    "<|endoftext|>",
    "text before<|endoftext|>text after",
    "<|im_end|><|im_end|><|im_end|>",
    "<|im_start|><|im_end|>",
    "<<|im_start|>>",
    "<|im_start|",
    "|im_start|>",
    "< |im_start| >",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "<tool_call>x</tool_call>",
    "a<tool_call>b",
    "<|fim_prefix|>def f():\n<|fim_suffix|>\n    return 1<|fim_middle|>",
    "<|file_sep|>main.py\n<|repo_name|>minfer",
    "<|vision_start|><|image_pad|><|vision_end|>",
    "[PAD151665] unused slot text",
    "<|IM_START|> wrong case",
    "<|im_start|>user\n<tool_call>call</tool_call><|im_end|>",
    " <|im_end|> spaced ",
    "\n<|im_start|>\n",
    "<|endoftext|><|endoftext|>end",
    "prefix<|fim_pad|>",
    "<|box_start|>(1,2),(3,4)<|box_end|>",
    "<|object_ref_start|>the cat<|object_ref_end|>",
]

MISC = [
    "", "a", "A", "ab", "Hello", "hello world", "Hello, World!", "HELLO WORLD",
    "The quick brown fox jumps over the lazy dog.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.",
    "...", "!!!", "???", "?!?!", "---", "***", "___", "===", "~~~", "```python\nx\n```",
    "https://example.com/path?query=1&b=2#frag", "user@example.com", "C:\\Users\\Name\\file.txt",
    "/usr/local/bin/python3", "#hashtag @mention", "snake_case camelCase PascalCase kebab-case",
    "SCREAMING_SNAKE_CASE", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "supercalifragilisticexpialidocious",
    "pneumonoultramicroscopicsilicovolcanoconiosis", "Antidisestablishmentarianism",
    "((((((((((nested))))))))))", "[[[]]]{{{}}}<<<>>>", "a.b.c.d.e.f", "a,b,c,d",
    "tab\tseparated\tvalues\n1\t2\t3", "csv,values,here\n1,2,3", ";;;;", "\"quoted\" 'single'",
    "`backticks` and ´acute´", "^caret~tilde|pipe\\backslash",
    "Mr. Smith went to Washington D.C. on Jan. 5th.", "e.g., i.e., etc.",
]


def random_strings(n, seed):
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789",
        " \t\n\r", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "éèêëàâäôöùûüçñ",
        "абвгдежзийклмнопрстуфхцчшщъыьэюя", "的一是不了人我在有他这为之大来以个中上们",
        "あいうえおかきくけこアイウエオ", "가나다라마바사", "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
        "अआइईउऊएऐओऔकखगघ", "😀🎉🚀🌍❤🔥👍🏽", "\u200d\ufe0f\u0301\u00a0",
    ]
    words = ["the", "The", " of", "'s", "'LL", "function", "return", "<|im_end|>", "<tool_call>", "  ", "\n\n"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.2:
                parts.append(rng.choice(words))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
        out.append("".join(parts))
    return out


def main():
    path = model_path()
    tokens, types, merges, meta, eos = read_vocab(path)
    if meta["tokenizer.ggml.pre"] != "qwen2":
        sys.exit(f"expected a qwen2 pre-tokenizer, got {meta['tokenizer.ggml.pre']}")
    plain = build(tokens, types, merges, special=False)
    spec = build(tokens, types, merges, special=True)

    cases = []
    for group in (CODE, UNICODE, WHITESPACE, DIGITS, CONTRACTIONS, MISC):
        cases += [(s, False) for s in group]
    cases += [(s, False) for s in SPECIAL] + [(s, True) for s in SPECIAL]
    cases += [(s, True) for s in CODE[:5] + UNICODE[:5] + CONTRACTIONS[:5]]
    cases += [(s, False) for s in random_strings(120, 20240615)]
    cases += [(s, True) for s in random_strings(30, 7)]

    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "qwen2_encode.jsonl"), "w", encoding="utf-8") as f:
        for text, special in cases:
            tok = spec if special else plain
            ids = tok.encode(text, add_special_tokens=False).ids
            if not special:
                # The byte-level decoder must restore the text exactly.
                assert tok.decode(ids, skip_special_tokens=False) == text, repr(text)
            f.write(json.dumps({"text": text, "special": special, "ids": ids}, ensure_ascii=False) + "\n")
    print(f"wrote {len(cases)} encode cases")

    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=spec, eos_token=tokens[eos], chat_template=meta["tokenizer.chat_template"]
    )
    messages = [
        {"role": "system", "content": "You are a concise coding assistant."},
        {"role": "user", "content": "Write a Python one-liner that reverses a string."},
        {"role": "assistant", "content": "s[::-1]"},
        {"role": "user", "content": "And in Rust? Explain in 2 sentences, please. 谢谢 🙂"},
    ]
    rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    with open(os.path.join(OUT, "qwen2_chat.json"), "w", encoding="utf-8") as f:
        json.dump(messages, f, ensure_ascii=False, indent=2)
        f.write("\n")
    with open(os.path.join(OUT, "qwen2_chat.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(rendered)
    print("wrote chat template golden")


if __name__ == "__main__":
    main()
