//! Tiny random-weight encoders of the BERT family (`bert` and `nomic-bert`) with a small
//! WordPiece vocabulary, for the embedding and tokenizer goldens against llama.cpp.
//!
//! The vocabulary is written as llama.cpp's converter writes a BERT one: word-initial
//! pieces carry the `▁` marker, continuation pieces (BERT's `##ing`) are bare, and
//! `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]` open it. It is small on purpose, so that
//! texts cut into several pieces per word and some words (those starting with a letter
//! that has no word-initial piece, most non-Latin characters) become `[UNK]`. Weights
//! come from the same pinned [`SplitMix64`] stream as the other tiny models.

use std::path::Path;

use minfer_gguf::{GgmlType, GgufError, GgufWriter, MetaType, MetaValue};
use minfer_testkit::SplitMix64;

use crate::weights::{blk, blk_bias, TOKEN_EMBD};

/// The special tokens at ids 0..5, as BERT orders its own (`[UNK]` is id 1).
pub const BERT_SPECIALS: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];

/// Whole words and word-initial pieces (written with the `▁` marker).
const WORDS: &[&str] = &[
    "the", "quick", "brown", "fox", "jump", "over", "lazy", "dog", "play", "un", "re", "search",
    "token", "embed", "café", "model", "text", "find", "similar", "question", "pass", "age", "is",
    "a", "an", "of", "to", "in", "it", "and", "for", "on", "with", "as", "at", "by", "hello",
    "world", "good", "morning", "name", "count", "select", "from", "group", "order", "def",
    "return", "if", "else", "gen", "era", "tion", "look", "up", "中", "文", "é",
];

/// Continuation pieces (BERT's `##` pieces, written bare).
const PIECES: &[&str] = &[
    "s", "ing", "ed", "er", "ly", "able", "tion", "ation", "ize", "ment", "ness", "al", "ion",
    "es", "d", "y", "ieval", "ented", "ar", "ages", "ci", "bon", "acci", "ect", "rom", "é",
];

/// Letters with a word-initial piece: a word starting with any other letter that is not
/// in [`WORDS`] has no cut and becomes `[UNK]`.
const INITIAL_LETTERS: &str = "abcdefghijklmnopqrst";

/// Geometry, storage type and seed of a tiny BERT.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyBert {
    /// Blocks.
    pub n_layer: usize,
    /// Residual width (a multiple of 32 for the quantized variant).
    pub n_embd: usize,
    /// Heads.
    pub n_head: usize,
    /// FFN width.
    pub n_ff: usize,
    /// `context_length`: rows of the position table.
    pub n_ctx: usize,
    /// Type of the projection matrices and the token embedding (the position and
    /// token-type tables, norms and biases stay F32).
    pub wtype: GgmlType,
    /// `pooling_type` written into the file (1 mean, 2 CLS, 4 rank).
    pub pooling: u32,
    /// Write a reranker's classifier head (`cls.weight`/`cls.bias`, dense `[n_embd,
    /// n_embd]`, and `cls.output.weight`/`cls.output.bias`, one score), drawn after every
    /// other tensor so the encoder's weights equal the headless model's.
    pub rank_head: bool,
    /// Write a `nomic-bert` instead (nomic-embed-text's layout: no position table, rope
    /// with base [`TINY_NOMIC_ROPE_BASE`], one fused `attn_qkv`, a SwiGLU FFN, and no
    /// biases but the norms'); `rank_head` is ignored.
    pub nomic: bool,
    /// BERT only: store each layer's q, k and v (same values) as one fused `attn_qkv`
    /// matrix and bias, as llama.cpp also loads a BERT.
    pub fused_qkv: bool,
    /// PRNG seed.
    pub seed: u64,
}

/// Seed of the tiny nomic-bert models.
pub const NOMIC_SEED: u64 = 0x90_31C;

/// Rope theta of the tiny nomic-bert models (nomic-embed-text v1.5's value; not the
/// default 10000, so a reader that ignores the key is caught).
pub const TINY_NOMIC_ROPE_BASE: f32 = 1000.0;

/// Seed of the tiny BERT models.
pub const BERT_SEED: u64 = 0xBE27;

/// LayerNorm epsilon written into tiny BERTs (the published models' value).
pub const TINY_BERT_EPS: f32 = 1e-12;

impl TinyBert {
    /// The tiny BERT of type `wtype`: 2 layers, width 64, 4 heads, FFN 128, 128 positions,
    /// mean pooling.
    pub fn new(wtype: GgmlType, seed: u64) -> Self {
        TinyBert {
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            n_ff: 128,
            n_ctx: 128,
            wtype,
            pooling: 1,
            rank_head: false,
            nomic: false,
            fused_qkv: false,
            seed,
        }
    }

    /// The tiny nomic-bert of type `wtype`: the geometry of [`TinyBert::new`] (its 128
    /// `context_length` is a limit only: nomic-bert has no position table).
    pub fn nomic(wtype: GgmlType, seed: u64) -> Self {
        TinyBert {
            nomic: true,
            ..TinyBert::new(wtype, seed)
        }
    }

    /// The tiny BERT reranker: the F32 encoder of [`TinyBert::new`] with a classifier
    /// head and rank pooling (`pooling_type` 4), as llama.cpp converts bge-reranker.
    pub fn reranker(seed: u64) -> Self {
        TinyBert {
            pooling: 4,
            rank_head: true,
            ..TinyBert::new(GgmlType::F32, seed)
        }
    }
}

/// The tiny BERT reranker of the golden set (kept out of [`bert_models`], whose models
/// are embedders).
pub fn bert_reranker() -> (&'static str, TinyBert) {
    ("bert-rerank-f32", TinyBert::reranker(BERT_SEED))
}

/// The tiny BERTs of the golden set: F32 and Q8_0.
pub fn bert_models() -> Vec<(&'static str, TinyBert)> {
    vec![
        ("bert-f32", TinyBert::new(GgmlType::F32, BERT_SEED)),
        ("bert-q8_0", TinyBert::new(GgmlType::Q8_0, BERT_SEED)),
    ]
}

/// The tiny nomic-berts of the golden set: F32 and Q8_0.
pub fn nomic_models() -> Vec<(&'static str, TinyBert)> {
    vec![
        ("nomic-f32", TinyBert::nomic(GgmlType::F32, NOMIC_SEED)),
        ("nomic-q8_0", TinyBert::nomic(GgmlType::Q8_0, NOMIC_SEED)),
    ]
}

/// The vocabulary's texts and token types (1 normal, 2 unknown, 3 control), in id order.
pub fn bert_vocab() -> (Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = BERT_SPECIALS.iter().map(|s| s.to_string()).collect();
    let mut types = vec![3, 2, 3, 3, 3];
    let push = |t: String, tokens: &mut Vec<String>| {
        if !tokens.contains(&t) {
            tokens.push(t);
        }
    };
    let marked = |s: &str| format!("\u{2581}{s}");
    for w in WORDS {
        push(marked(w), &mut tokens);
    }
    for c in INITIAL_LETTERS.chars() {
        push(marked(&c.to_string()), &mut tokens);
    }
    for c in ('a'..='z').chain('0'..='9') {
        push(c.to_string(), &mut tokens);
    }
    for d in '0'..='9' {
        push(marked(&d.to_string()), &mut tokens);
    }
    for p in PIECES {
        push(p.to_string(), &mut tokens);
    }
    for p in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~".chars() {
        push(marked(&p.to_string()), &mut tokens);
    }
    types.resize(tokens.len(), 1);
    (tokens, types)
}

/// Writes the model `spec` describes to `path`.
pub fn write_tiny_bert(path: &Path, spec: &TinyBert) -> Result<(), GgufError> {
    tiny_bert_writer(spec)?.write_to(path)
}

/// The file `spec` describes, as bytes.
pub fn tiny_bert_bytes(spec: &TinyBert) -> Result<Vec<u8>, GgufError> {
    tiny_bert_writer(spec)?.to_bytes()
}

/// The writer of the file `spec` describes, for a test that edits a key or adds a
/// tensor before writing it.
pub fn tiny_bert_writer(spec: &TinyBert) -> Result<GgufWriter, GgufError> {
    let mut w = GgufWriter::new();
    let (tokens, types) = bert_vocab();
    let n_vocab = tokens.len();
    let a = if spec.nomic { "nomic-bert" } else { "bert" };
    w.add_meta("general.architecture", MetaValue::String(a.into()))
        .add_meta(
            "general.name",
            MetaValue::String(format!("minfer tiny {a} {}", spec.wtype)),
        );
    for (name, v) in [
        ("context_length", spec.n_ctx),
        ("embedding_length", spec.n_embd),
        ("block_count", spec.n_layer),
        ("feed_forward_length", spec.n_ff),
        ("attention.head_count", spec.n_head),
    ] {
        w.add_meta(&format!("{a}.{name}"), MetaValue::U32(v as u32));
    }
    w.add_meta(
        &format!("{a}.attention.layer_norm_epsilon"),
        MetaValue::F32(TINY_BERT_EPS),
    )
    .add_meta(&format!("{a}.attention.causal"), MetaValue::Bool(false))
    .add_meta(&format!("{a}.pooling_type"), MetaValue::U32(spec.pooling));
    if spec.nomic {
        w.add_meta(
            &format!("{a}.rope.freq_base"),
            MetaValue::F32(TINY_NOMIC_ROPE_BASE),
        );
    }
    let strings = |v: Vec<String>| {
        MetaValue::Array(
            MetaType::String,
            v.into_iter().map(MetaValue::String).collect(),
        )
    };
    w.add_meta("tokenizer.ggml.model", MetaValue::String("bert".into()))
        .add_meta("tokenizer.ggml.tokens", strings(tokens))
        .add_meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(
                MetaType::I32,
                types.into_iter().map(MetaValue::I32).collect(),
            ),
        )
        .add_meta("tokenizer.ggml.token_type_count", MetaValue::U32(2))
        .add_meta("tokenizer.ggml.padding_token_id", MetaValue::U32(0))
        .add_meta("tokenizer.ggml.unknown_token_id", MetaValue::U32(1))
        .add_meta("tokenizer.ggml.bos_token_id", MetaValue::U32(2))
        .add_meta("tokenizer.ggml.seperator_token_id", MetaValue::U32(3))
        .add_meta("tokenizer.ggml.mask_token_id", MetaValue::U32(4));

    let mut rng = SplitMix64::new(spec.seed);
    let (ne, nf) = (spec.n_embd, spec.n_ff);
    let f32v = |w: &mut GgufWriter, name: &str, dims: &[u64], v: &[f32]| {
        w.add_tensor_f32(name, dims, GgmlType::F32, v).map(|_| ())
    };
    let embd = rng.normal_vec(ne * n_vocab, 1.0);
    w.add_tensor_f32(TOKEN_EMBD, &[ne as u64, n_vocab as u64], spec.wtype, &embd)?;
    f32v(
        &mut w,
        "token_types.weight",
        &[ne as u64, 2],
        &rng.normal_vec(ne * 2, 0.5),
    )?;
    if !spec.nomic {
        let pos = rng.normal_vec(ne * spec.n_ctx, 0.5);
        f32v(
            &mut w,
            "position_embd.weight",
            &[ne as u64, spec.n_ctx as u64],
            &pos,
        )?;
    }
    let norm = |w: &mut GgufWriter, rng: &mut SplitMix64, name: &str| {
        let g: Vec<f32> = rng
            .normal_vec(ne, 0.1)
            .into_iter()
            .map(|x| (1.0 + f64::from(x)) as f32)
            .collect();
        f32v(w, &format!("{name}.weight"), &[ne as u64], &g)?;
        f32v(
            w,
            &format!("{name}.bias"),
            &[ne as u64],
            &rng.normal_vec(ne, 0.1),
        )
    };
    norm(&mut w, &mut rng, "token_embd_norm")?;
    for il in 0..spec.n_layer {
        if spec.nomic {
            let mut mat = |w: &mut GgufWriter, name: &str, i: usize, o: usize| {
                let v = rng.normal_vec(i * o, 1.0 / (i as f64).sqrt());
                w.add_tensor_f32(&blk(il, name), &[i as u64, o as u64], spec.wtype, &v)
                    .map(|_| ())
            };
            mat(&mut w, "attn_qkv", ne, 3 * ne)?;
            mat(&mut w, "attn_output", ne, ne)?;
            mat(&mut w, "ffn_up", ne, nf)?;
            mat(&mut w, "ffn_gate", ne, nf)?;
            mat(&mut w, "ffn_down", nf, ne)?;
            norm(&mut w, &mut rng, &format!("blk.{il}.attn_output_norm"))?;
            norm(&mut w, &mut rng, &format!("blk.{il}.layer_output_norm"))?;
            continue;
        }
        if spec.fused_qkv {
            // The same draws as the three projections, stored as one q|k|v matrix and bias.
            let (mut m, mut bias) = (Vec::new(), Vec::new());
            for _ in 0..3 {
                m.extend(rng.normal_vec(ne * ne, 1.0 / (ne as f64).sqrt()));
                bias.extend(rng.normal_vec(ne, 0.1));
            }
            let dims = [ne as u64, 3 * ne as u64];
            w.add_tensor_f32(&blk(il, "attn_qkv"), &dims, spec.wtype, &m)?;
            f32v(&mut w, &blk_bias(il, "attn_qkv"), &[3 * ne as u64], &bias)?;
        }
        let mut affine = |w: &mut GgufWriter, name: &str, i: usize, o: usize| {
            let v = rng.normal_vec(i * o, 1.0 / (i as f64).sqrt());
            w.add_tensor_f32(&blk(il, name), &[i as u64, o as u64], spec.wtype, &v)?;
            f32v(w, &blk_bias(il, name), &[o as u64], &rng.normal_vec(o, 0.1))
        };
        if !spec.fused_qkv {
            affine(&mut w, "attn_q", ne, ne)?;
            affine(&mut w, "attn_k", ne, ne)?;
            affine(&mut w, "attn_v", ne, ne)?;
        }
        affine(&mut w, "attn_output", ne, ne)?;
        affine(&mut w, "ffn_up", ne, nf)?;
        affine(&mut w, "ffn_down", nf, ne)?;
        norm(&mut w, &mut rng, &format!("blk.{il}.attn_output_norm"))?;
        norm(&mut w, &mut rng, &format!("blk.{il}.layer_output_norm"))?;
    }
    if spec.rank_head && !spec.nomic {
        // Scaled so the tanh is neither linear nor saturated on LayerNorm'd rows.
        let dense = rng.normal_vec(ne * ne, 1.0 / (ne as f64).sqrt());
        w.add_tensor_f32("cls.weight", &[ne as u64, ne as u64], spec.wtype, &dense)?;
        f32v(&mut w, "cls.bias", &[ne as u64], &rng.normal_vec(ne, 0.1))?;
        let out = rng.normal_vec(ne, 1.0 / (ne as f64).sqrt());
        w.add_tensor_f32("cls.output.weight", &[ne as u64, 1], spec.wtype, &out)?;
        f32v(&mut w, "cls.output.bias", &[1], &rng.normal_vec(1, 0.1))?;
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vocabulary_has_pieces_punctuation_and_unknown() {
        let (tokens, types) = bert_vocab();
        assert_eq!(tokens.len(), types.len());
        assert_eq!(&tokens[..5], BERT_SPECIALS);
        assert!(tokens.iter().any(|t| t == "ing") && tokens.iter().any(|t| t == "\u{2581},"));
        assert!(!tokens.iter().any(|t| t == "\u{2581}z"));
        let mut sorted = tokens.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), tokens.len(), "duplicate texts");
    }
}
