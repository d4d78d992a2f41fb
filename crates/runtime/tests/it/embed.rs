//! Embeddings on a tiny random-weight Qwen2: the pooled rows are the hidden state the
//! output head reads (the head applied to them gives the step's logits), every pooling
//! takes the rows it names, and the prefill chunking changes no bit.

use minfer_gguf::{GgmlType, GgufFile};
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::embed::{embed, Pooling};
use minfer_runtime::{Engine, EngineOptions};

fn spec() -> TinySpec {
    TinySpec::qwen2(GgmlType::F32, 21)
}

fn engine(n_batch: usize) -> Engine {
    let file = GgufFile::from_bytes(tiny_model_bytes(&spec()).expect("writer")).expect("reader");
    let opts = EngineOptions {
        n_threads: 2,
        n_ctx: Some(64),
        n_batch,
        ..EngineOptions::default()
    };
    Engine::from_gguf(file, &opts).expect("engine")
}

fn text() -> Vec<u32> {
    (0..11).map(|i| (i * 53 + 7) % 300).collect()
}

#[test]
fn the_rows_are_what_the_output_head_reads() {
    let mut e = engine(512);
    let rows = embed(&mut e, &text(), Pooling::Last, false).expect("embed");
    let logits = e.forward(&text(), 0, 1).expect("forward");
    // logits = output · hidden, with the head read straight from the file (F32).
    let info = e
        .file()
        .tensor("output.weight")
        .expect("untied head")
        .clone();
    let head: Vec<f32> = e
        .file()
        .tensor_data(&info)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let h = &rows[0];
    let scale = logits.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (v, row) in head.chunks_exact(h.len()).enumerate() {
        let want: f32 = row.iter().zip(h).map(|(a, b)| a * b).sum();
        assert!(
            (want - logits[v]).abs() <= 1e-4 * scale,
            "token {v}: {want} vs {}",
            logits[v]
        );
    }
}

#[test]
fn each_pooling_takes_its_rows_and_chunks_change_nothing() {
    let t = text();
    let mut e = engine(512);
    let per_token = embed(&mut e, &t, Pooling::None, false).expect("none");
    assert_eq!(per_token.len(), t.len());
    let n = per_token[0].len();
    let mean = embed(&mut e, &t, Pooling::Mean, false).expect("mean");
    for (j, &m) in mean[0].iter().enumerate() {
        let want = per_token.iter().map(|r| r[j] as f64).sum::<f64>() / t.len() as f64;
        assert!((m as f64 - want).abs() < 1e-6, "dim {j}");
    }
    assert_eq!(
        embed(&mut e, &t, Pooling::Cls, false).unwrap()[0],
        per_token[0]
    );
    assert_eq!(
        embed(&mut e, &t, Pooling::Last, false).unwrap()[0],
        per_token[t.len() - 1]
    );
    // Normalised: unit length, same direction.
    let unit = embed(&mut e, &t, Pooling::Mean, true).expect("normalised");
    let len = unit[0]
        .iter()
        .map(|&x| x as f64 * x as f64)
        .sum::<f64>()
        .sqrt();
    assert!((len - 1.0).abs() < 1e-6, "{len}");
    assert!(minfer_runtime::embed::cosine(&unit[0], &mean[0]) > 1.0 - 1e-9);
    // Prefill chunks of 3 give the same bits.
    let mut small = engine(3);
    assert_eq!(
        embed(&mut small, &t, Pooling::None, false).unwrap(),
        per_token
    );
    assert_eq!(n, spec().n_embd);
    // After embedding, generation still gets logits.
    let logits = small.forward(&t[..2], 0, 1).expect("logits again");
    assert_eq!(logits.len(), spec().n_vocab);
}

#[test]
fn empty_and_oversized_texts_are_refused_by_name() {
    let mut e = engine(512);
    let err = embed(&mut e, &[], Pooling::Mean, true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("input") && err.contains("empty"), "{err}");
    let long: Vec<u32> = (0..65).collect();
    let err = embed(&mut e, &long, Pooling::Mean, true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("65") && err.contains("64"), "{err}");
}

/// The cosine distance allowed between minfer's and llama.cpp's embeddings of the
/// default model, per pooling: llama.cpp's own spread on this Q4_K_M model. Its f16 and
/// f32 KV caches give embeddings 1.0e-4 to 1.7e-4 apart with mean pooling and 3.0e-4 to
/// 4.9e-4 apart with last-token pooling (one row, so less averaged) on these texts, and
/// minfer's own f16 and f32 KV last rows of the retrieval text 9.0e-4 apart (measured
/// from f32 KV: mean 0.7e-4 to 1.3e-4, last 2.2e-4 to 1.3e-3).
fn embd_bound(p: Pooling) -> f64 {
    match p {
        Pooling::Last | Pooling::Cls => 2e-3,
        _ => 2e-4,
    }
}

/// The default model's embeddings against llama.cpp's (scripts/gen_embed_reference.py):
/// the same token ids, and a cosine distance under [`embd_bound`] for mean and last
/// pooling.
#[test]
fn default_model_embeddings_match_llama_cpp() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("../golden/embed_reference.json")).expect("golden JSON");
    let path = minfer_hub::default_model_path();
    assert!(
        path.exists(),
        "the default model is missing: run `minfer pull`"
    );
    let opts = EngineOptions {
        n_threads: 2,
        n_ctx: Some(512),
        ..EngineOptions::default()
    };
    let mut e = Engine::load(&path, &opts).expect("default model");
    let entries = golden["entries"].as_array().expect("entries");
    assert!(entries.len() >= 8);
    for g in entries {
        let (dist, pooling, text) = distance_to_golden(&mut e, g, "default model");
        eprintln!("{} {text:?}: cosine distance {dist:.2e}", pooling.name());
        assert!(
            dist < embd_bound(pooling),
            "{} {text:?}: cosine distance {dist:e}",
            pooling.name()
        );
    }
}

/// One golden entry embedded on `e`: its token ids must be `e`'s tokenizer's (`what`
/// names the model in the message); returns the cosine distance of minfer's embedding to
/// llama.cpp's, with the entry's pooling and text.
pub(crate) fn distance_to_golden<'a>(
    e: &mut Engine,
    g: &'a serde_json::Value,
    what: &str,
) -> (f64, Pooling, &'a str) {
    let tok = minfer_tokenizer::Tokenizer::from_gguf(e.file()).expect("tokenizer");
    let text = g["text"].as_str().unwrap();
    let ids: Vec<u32> = g["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(
        tok.encode(text, true, false),
        ids,
        "{what}: token ids of {text:?}"
    );
    let pooling = Pooling::parse(g["pooling"].as_str().unwrap()).unwrap();
    let want: Vec<f32> = g["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    let got = embed(e, &ids, pooling, true).expect("embed").remove(0);
    (
        1.0 - minfer_runtime::embed::cosine(&got, &want),
        pooling,
        text,
    )
}

#[test]
fn a_slot_of_a_multi_engine_embeds_as_a_lone_engine_and_leaves_its_neighbours_alone() {
    use minfer_runtime::{MultiEngine, SeqStep};
    let t = text();
    let file = std::sync::Arc::new(
        GgufFile::from_bytes(tiny_model_bytes(&spec()).expect("writer")).expect("reader"),
    );
    let opts = EngineOptions {
        n_threads: 2,
        n_ctx: Some(64),
        n_batch: 4,
        ..EngineOptions::default()
    };
    let mut m = MultiEngine::from_shared(file, &opts, 2).expect("multi");
    // Slot 0 holds a sequence whose next logits must not change.
    let other: Vec<u32> = (0..6).map(|i| (i * 31 + 5) % 300).collect();
    let step = |m: &mut MultiEngine, toks: &[u32], pos0| {
        m.step(&[SeqStep {
            slot: 0,
            tokens: toks.to_vec(),
            pos0,
            n_out: 1,
        }])
        .expect("step")
    };
    step(&mut m, &other[..5], 0);
    let mut lone = engine(4);
    for pooling in [Pooling::None, Pooling::Mean, Pooling::Last] {
        let got = m.embed(1, &t, pooling, true).expect("multi embed");
        let want = embed(&mut lone, &t, pooling, true).expect("embed");
        assert_eq!(got.len(), want.len(), "{pooling:?}");
        for (a, b) in got.iter().zip(&want) {
            let cos = minfer_runtime::embed::cosine(a, b);
            assert!(cos > 1.0 - 1e-6, "{pooling:?}: cosine {cos}");
        }
    }
    assert_eq!(m.slot_len(0).unwrap(), 5);
    let after = step(&mut m, &other[5..], 5);
    let mut fresh = engine(4);
    let want = fresh.forward(&other, 0, 1).expect("forward");
    assert_eq!(after[0], want, "slot 0's logits changed");
    // Refusals name the problem.
    assert!(m.embed(1, &[], Pooling::Mean, true).is_err());
    let long: Vec<u32> = vec![1; 33];
    let e = m
        .embed(1, &long, Pooling::Mean, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("33"), "{e}");
}

/// Tiny random-weight F32 models (a Qwen3 with last-token pooling is how Qwen3-Embedding
/// is built) against llama.cpp's embeddings of the same files
/// (`scripts/gen_embed_reference.py --tiny`): the same token ids, and a cosine distance
/// under 1e-5 for mean, last-token and CLS pooling (measured at most 3e-13: both sides
/// compute in f32 throughout, so the bound leaves room for summation order alone).
#[test]
fn tiny_model_embeddings_match_llama_cpp() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("../golden/embed_tiny_reference.json"))
            .expect("golden JSON");
    // The tiny encoders' entries (BERT, nomic-bert) are checked in `bert.rs`.
    let entries: Vec<&serde_json::Value> = golden["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|g| {
            let m = g["model"].as_str().unwrap_or("");
            !m.starts_with("bert") && !m.starts_with("nomic")
        })
        .collect();
    assert!(entries.len() >= 36, "{} entries", entries.len());
    let mut worst = 0f64;
    // The entries come model by model: one engine per model.
    let mut engine: Option<(&str, Engine)> = None;
    for g in entries {
        let stem = g["model"].as_str().unwrap();
        if engine.as_ref().is_none_or(|(s, _)| *s != stem) {
            let spec = minfer_models::testing::golden_models()
                .into_iter()
                .find(|(s, _)| *s == stem)
                .unwrap_or_else(|| panic!("no golden model {stem}"))
                .1;
            let file =
                GgufFile::from_bytes(tiny_model_bytes(&spec).expect("writer")).expect("reader");
            let opts = EngineOptions {
                n_threads: 2,
                n_ctx: Some(256),
                ..EngineOptions::default()
            };
            engine = Some((stem, Engine::from_gguf(file, &opts).expect("engine")));
        }
        let Some((_, e)) = engine.as_mut() else {
            unreachable!("set above")
        };
        let (dist, pooling, text) = distance_to_golden(e, g, stem);
        worst = worst.max(dist);
        assert!(
            dist < 1e-5,
            "{stem} {} {text:?}: cosine distance {dist:e}",
            pooling.name()
        );
    }
    eprintln!("tiny models: worst cosine distance {worst:.2e}");
}
