//! The BERT-family encoders: the tiny random-weight BERTs and nomic-berts against
//! llama.cpp's token ids and embeddings, one pass per text whatever the batch size, a
//! server slot embedding as a lone engine, and the refusals (generation, a text past the
//! position table).

use std::sync::Arc;

use minfer_gguf::MetaValue;
use minfer_gguf::{GgmlType, GgufFile};
use minfer_models::testing::{
    bert_models, nomic_models, tiny_bert_bytes, tiny_bert_writer, TinyBert, BERT_SEED,
};
use minfer_runtime::embed::{cosine, embed, Pooling};
use minfer_runtime::{Engine, EngineError, EngineOptions, MultiEngine};

use crate::embed::distance_to_golden;

fn file(spec: &TinyBert) -> GgufFile {
    GgufFile::from_bytes(tiny_bert_bytes(spec).expect("writer")).expect("reader")
}

/// An engine of the model's 128-row context, or `n_ctx` rows.
fn engine_ctx(spec: &TinyBert, n_batch: usize, n_ctx: Option<usize>) -> Engine {
    let opts = EngineOptions {
        n_threads: 2,
        n_batch,
        n_ctx,
        ..EngineOptions::default()
    };
    Engine::from_gguf(file(spec), &opts).expect("engine")
}

fn engine(spec: &TinyBert, n_batch: usize) -> Engine {
    engine_ctx(spec, n_batch, None)
}

/// The tiny BERTs against llama.cpp (`scripts/gen_embed_reference.py --tiny`): the same
/// WordPiece ids (with `[CLS]`/`[SEP]`), and a cosine distance under 1e-5 for F32 with
/// mean and CLS pooling, 1e-4 for Q8_0 (both sides quantize the activations to Q8_0 per
/// row). The texts are 13 to 43 tokens long, so the bidirectional attention matters: with
/// causal attention the `[CLS]` row sees only itself and every mean is far off (a causal
/// graph fails this test, checked by flipping `AttnMeta::causal` in `bert.rs`).
#[test]
fn tiny_bert_embeddings_match_llama_cpp() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("../golden/embed_tiny_reference.json"))
            .expect("golden JSON");
    let entries = golden_entries(&golden, "bert");
    assert!(entries.len() >= 15, "{} entries", entries.len());
    let mut worst = [0f64; 2];
    for (stem, spec) in bert_models() {
        // A small batch: an encoder's text still runs in one pass.
        let mut e = engine(&spec, 4);
        assert_eq!(Pooling::default_for(&e), Pooling::Mean);
        let (bound, slot) = if spec.wtype == GgmlType::F32 {
            (1e-5, 0)
        } else {
            (1e-4, 1)
        };
        let mine: Vec<_> = entries.iter().filter(|g| g["model"] == stem).collect();
        assert!(!mine.is_empty(), "no golden entries for {stem}");
        for g in mine {
            let (dist, pooling, text) = distance_to_golden(&mut e, g, stem);
            worst[slot] = worst[slot].max(dist);
            assert!(
                dist < bound,
                "{stem} {} {text:?}: cosine distance {dist:e}",
                pooling.name()
            );
        }
    }
    eprintln!(
        "tiny BERTs: worst cosine distance {:.2e} (F32), {:.2e} (Q8_0)",
        worst[0], worst[1]
    );
}

/// The golden entries of the models whose stem starts with `prefix`.
fn golden_entries(golden: &serde_json::Value, prefix: &str) -> Vec<serde_json::Value> {
    golden["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|g| g["model"].as_str().unwrap_or("").starts_with(prefix))
        .cloned()
        .collect()
}

/// A BERT whose q, k and v (and biases) are stored as one fused `attn_qkv` — which
/// llama.cpp loads as well — embeds as the split file does: llama.cpp's bert-f32 golden
/// within the F32 bound, 1e-5.
#[test]
fn a_fused_qkv_bert_embeds_as_its_split_form() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("../golden/embed_tiny_reference.json"))
            .expect("golden JSON");
    let spec = TinyBert {
        fused_qkv: true,
        ..TinyBert::new(GgmlType::F32, BERT_SEED)
    };
    let mut e = engine(&spec, 4);
    assert!(e.file().tensor("blk.0.attn_qkv.bias").is_some());
    assert!(e.file().tensor("blk.0.attn_q.weight").is_none());
    let entries = golden_entries(&golden, "bert-f32");
    assert!(entries.len() >= 5);
    for g in &entries {
        let (dist, pooling, text) = distance_to_golden(&mut e, g, "bert-f32 fused");
        assert!(
            dist < 1e-5,
            "{} {text:?}: cosine distance {dist:e}",
            pooling.name()
        );
    }
}

/// The tiny nomic-berts against llama.cpp (`scripts/gen_embed_reference.py --tiny`): the
/// same WordPiece ids and, with the mean pooling the files state, a cosine distance
/// under the BERT bounds: 1e-5 for F32, 1e-4 for Q8_0. Then the same F32 model with its
/// rope turned to a no-op (a linear scaling factor of 1e9 leaves every angle under 1e-7
/// rad, the graph of a nomic-bert that skips RoPE) must miss llama.cpp by more than 1e-4
/// on every text (measured at least 3.8e-3): the bounds tell a rotated model from an
/// unrotated one. Dropping the rope nodes from the graph, or pairing them as adjacent
/// values instead of NeoX halves, fails the first half (checked: 9.6e-3 and 1.5e-2).
#[test]
fn tiny_nomic_bert_embeddings_match_llama_cpp_and_need_their_rope() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("../golden/embed_tiny_reference.json"))
            .expect("golden JSON");
    let entries = golden_entries(&golden, "nomic");
    assert_eq!(entries.len(), 10, "5 texts for each of 2 models");
    let mut worst = [0f64; 2];
    for (stem, spec) in nomic_models() {
        let mut e = engine(&spec, 4);
        assert_eq!(e.arch(), "nomic-bert");
        assert_eq!(Pooling::default_for(&e), Pooling::Mean);
        let (bound, slot) = if spec.wtype == GgmlType::F32 {
            (1e-5, 0)
        } else {
            (1e-4, 1)
        };
        let mine: Vec<_> = entries.iter().filter(|g| g["model"] == stem).collect();
        assert_eq!(mine.len(), 5, "golden entries for {stem}");
        for g in mine {
            let (dist, _, text) = distance_to_golden(&mut e, g, stem);
            worst[slot] = worst[slot].max(dist);
            assert!(dist < bound, "{stem} {text:?}: cosine distance {dist:e}");
        }
    }
    let (stem, spec) = &nomic_models()[0];
    let mut w = tiny_bert_writer(spec).expect("writer");
    w.add_meta("nomic-bert.rope.scaling.factor", MetaValue::F32(1e9));
    let file = GgufFile::from_bytes(w.to_bytes().expect("bytes")).expect("reader");
    let opts = EngineOptions {
        n_threads: 2,
        n_batch: 4,
        ..EngineOptions::default()
    };
    let mut unrotated = Engine::from_gguf(file, &opts).expect("engine");
    let mut nearest = f64::INFINITY;
    for g in entries.iter().filter(|g| g["model"] == *stem) {
        let (dist, _, text) = distance_to_golden(&mut unrotated, g, stem);
        nearest = nearest.min(dist);
        assert!(
            dist > 1e-4,
            "{text:?} without rope: cosine distance {dist:e}"
        );
    }
    eprintln!(
        "tiny nomic-berts: worst cosine distance {:.2e} (F32), {:.2e} (Q8_0); without rope at least {nearest:.2e}",
        worst[0], worst[1]
    );
}

#[test]
fn an_encoder_refuses_generation_and_texts_past_its_positions_by_name() {
    let spec = TinyBert::new(GgmlType::F32, BERT_SEED);
    // A context past the position table: the encoder's own limit speaks.
    let mut e = engine_ctx(&spec, 512, Some(256));
    assert!(e.is_encoder());
    let err = e.forward(&[2, 5, 6, 3], 0, 1).unwrap_err();
    assert!(
        matches!(err, EngineError::Encoder { arch: "bert" }),
        "{err}"
    );
    assert!(err.to_string().contains("`bert` is an encoder"), "{err}");
    // 128 positions: 129 tokens are refused, naming the key; 128 run.
    let long = vec![5u32; 129];
    let err = embed(&mut e, &long, Pooling::Mean, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("129") && err.contains("bert.context_length"),
        "{err}"
    );
    assert_eq!(
        embed(&mut e, &long[..128], Pooling::Mean, true)
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn a_slot_embeds_as_a_lone_engine() {
    let spec = TinyBert::new(GgmlType::F32, BERT_SEED);
    let opts = EngineOptions {
        n_threads: 2,
        n_batch: 4,
        ..EngineOptions::default()
    };
    let mut m = MultiEngine::from_shared(Arc::new(file(&spec)), &opts, 2).expect("multi");
    let mut lone = engine(&spec, 512);
    let text: Vec<u32> = (0..20).map(|i| 5 + (i * 37) % 150).collect();
    for pooling in [Pooling::None, Pooling::Mean, Pooling::Cls] {
        let want = embed(&mut lone, &text, pooling, true).expect("embed");
        for slot in [1, 0] {
            let got = m.embed(slot, &text, pooling, true).expect("slot embed");
            assert_eq!(got.len(), want.len(), "{pooling:?}");
            for (a, b) in got.iter().zip(&want) {
                let c = cosine(a, b);
                assert!(c > 1.0 - 1e-6, "{pooling:?} slot {slot}: cosine {c}");
            }
        }
    }
}
