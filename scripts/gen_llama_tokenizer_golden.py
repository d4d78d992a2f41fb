#!/usr/bin/env python3
"""Golden vectors for the Llama family's tokenizers, from independent implementations.

No model hub is needed: each reference tokenizer is trained here, on this script's test
corpus (the one scripts/gen_tokenizer_golden.py uses) plus the repository's Markdown files,
and its vocabulary is written into the golden file so that the Rust test puts exactly that
vocabulary into a GGUF file with minfer's writer and compares encodings.

  llama_bpe.json   byte-level BPE with Llama 3's pre-tokenizer, as its tokenizer.json
                   declares it (Split on the Llama 3 regex, isolated; ByteLevel without its
                   own regex; BPE with ignore_merges), trained with HF `tokenizers`;
                   GGUF: tokenizer.ggml.model "gpt2", pre "llama-bpe"
  smollm.json      byte-level BPE with SmolLM's pre-tokenizer (Digits, individual; then
                   ByteLevel with the GPT-2 regex), trained with HF `tokenizers`;
                   GGUF: model "gpt2", pre "smollm"
  llama_spm.json   a SentencePiece BPE model with Llama 2's trainer settings (byte fallback,
                   identity normalization, dummy prefix, digits split, whitespace kept),
                   trained with the `sentencepiece` package; GGUF: model "llama", scores,
                   <0xNN> byte tokens, <unk>/<s>/</s> as unknown/control

Each file: {"gguf": {metadata key: value}, "cases": [{"text", "special", "ids"}]}. With
`special` the control tokens are matched in the text (llama.cpp's parse_special); without,
they are plain text. For SentencePiece llama.cpp prefixes a space to every raw-text fragment
(after the start and after each control token), which is what encoding each fragment with
SentencePiece's dummy prefix gives, so the reference splits at control tokens the same way.

Rerun (needs: pip install gguf tokenizers sentencepiece; no network):
  python3 scripts/gen_llama_tokenizer_golden.py
"""

import glob
import io
import json
import os
import sys

import sentencepiece as spm
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_tokenizer_golden as base  # noqa: E402  (the shared test corpus)

ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "crates", "tokenizer", "tests", "golden")

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
VOCAB_BPE = 1400
VOCAB_SPM = 1200

LLAMA3_CONTROL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]
SMOLLM_CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

LLAMA3_SPECIAL = [
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>",
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "text<|eot_id|>more text",
    "<|eot_id|><|eot_id|>",
    "<|eot_id|",
    "< |eot_id| >",
    " <|end_of_text|> spaced ",
]
SMOLLM_SPECIAL = [
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text<|endoftext|>",
    "<|im_end|><|im_end|>",
    "<|im_start|",
    " <|im_end|> spaced ",
]
SPM_SPECIAL = [
    "<s>[INST] Hello! [/INST]",
    "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello</s><s>[INST] More [/INST]",
    "text</s>after",
    "</s></s>",
    "<s",
    " <s> spaced ",
    "<unk> stands for itself",
]


def corpus_cases():
    cases = []
    for group in (base.CODE, base.UNICODE, base.WHITESPACE, base.DIGITS, base.CONTRACTIONS, base.MISC):
        cases += list(group)
    return cases + base.random_strings(120, 20240615)


def training_text():
    texts = corpus_cases()
    for path in sorted(glob.glob(os.path.join(ROOT, "*.md"))):
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    return texts


def case_list(special_texts):
    plain = corpus_cases()
    cases = [(s, False) for s in plain + special_texts] + [(s, True) for s in special_texts]
    cases += [(s, True) for s in base.CODE[:5] + base.UNICODE[:5] + base.CONTRACTIONS[:5]]
    cases += [(s, True) for s in base.random_strings(20, 7)]
    return cases


def bpe_golden(name, pre, pre_tokenizer, ignore_merges, control, special_texts):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_BPE, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [NORMAL] * len(tokens)
    tokens += control
    types += [CONTROL] * len(control)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    plain = Tokenizer.from_str(tok.to_str())
    # The plain reference knows no control tokens: they are text there.
    plain_json = json.loads(tok.to_str())
    plain_json["added_tokens"] = []
    plain = Tokenizer.from_str(json.dumps(plain_json))

    out = []
    for text, special in case_list(special_texts):
        t = tok if special else plain
        ids = t.encode(text, add_special_tokens=False).ids
        if not special:
            assert t.decode(ids, skip_special_tokens=False) == text, repr(text)
        out.append({"text": text, "special": special, "ids": ids})
    gguf = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": len(tokens) - len(control),
        "tokenizer.ggml.eos_token_id": len(tokens) - len(control) + 1,
        "tokenizer.ggml.add_bos_token": False,
    }
    write(name, gguf, out)


def spm_golden():
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([line for t in training_text() for line in t.split("\n") if line]),
        model_writer=buf, model_type="bpe", vocab_size=VOCAB_SPM, byte_fallback=True,
        normalization_rule_name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False,
        split_digits=True, allow_whitespace_only_pieces=True, character_coverage=0.98,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, max_sentencepiece_length=16,
        hard_vocab_limit=False, num_threads=1, minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    n = sp.get_piece_size()
    tokens = [sp.id_to_piece(i) for i in range(n)]
    scores = [sp.get_score(i) for i in range(n)]
    types = []
    for i in range(n):
        if sp.is_unknown(i):
            types.append(UNKNOWN)
        elif sp.is_control(i):
            types.append(CONTROL)
        elif sp.is_byte(i):
            types.append(BYTE)
        else:
            types.append(NORMAL)
    specials = sorted(((t, i) for i, t in enumerate(tokens) if types[i] in (UNKNOWN, CONTROL)),
                      key=lambda ti: -len(ti[0]))

    def encode(text, special):
        if not special:
            return sp.encode(text) if text else []
        frags = [text]
        for t, i in specials:
            nxt = []
            for f in frags:
                if isinstance(f, int):
                    nxt.append(f)
                    continue
                parts = f.split(t)
                for k, p in enumerate(parts):
                    if k:
                        nxt.append(i)
                    if p:
                        nxt.append(p)
            frags = nxt
        ids = []
        for f in frags:
            ids += [f] if isinstance(f, int) else sp.encode(f)
        return ids

    out = []
    for text, special in case_list(SPM_SPECIAL):
        ids = encode(text, special)
        if not special:
            assert sp.decode(ids) == text, repr(text)
        out.append({"text": text, "special": special, "ids": ids})
    gguf = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_space_prefix": True,
    }
    write("llama_spm", gguf, out)


def write(name, gguf, cases):
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump({"gguf": gguf, "cases": cases}, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"{name}: {len(gguf['tokenizer.ggml.tokens'])} tokens, {len(cases)} cases")


def main():
    bpe_golden(
        "llama_bpe", "llama-bpe",
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]),
        True, LLAMA3_CONTROL, LLAMA3_SPECIAL,
    )
    bpe_golden(
        "smollm", "smollm",
        pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]),
        False, SMOLLM_CONTROL, SMOLLM_SPECIAL,
    )
    spm_golden()


if __name__ == "__main__":
    main()
