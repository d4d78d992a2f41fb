//! Rank pooling through a BERT cross-encoder's classifier head: the tiny random-weight
//! reranker against llama.cpp's pair layouts and rank scores, the head's terms checked
//! to matter, a server slot scoring as a lone engine, and the refusal of a headless model.

use std::sync::{Arc, Mutex};

use minfer_gguf::{GgmlType, GgufFile};
use minfer_models::testing::{bert_reranker, tiny_bert_bytes, TinyBert, BERT_SEED};
use minfer_runtime::embed::{embed, Pooling};
use minfer_runtime::{Engine, EngineOptions, MultiEngine, TracedStep};
use minfer_tokenizer::{PairEnd, Tokenizer};

fn file(spec: &TinyBert) -> GgufFile {
    GgufFile::from_bytes(tiny_bert_bytes(spec).expect("writer")).expect("reader")
}

fn opts() -> EngineOptions {
    EngineOptions {
        n_threads: 2,
        n_batch: 8,
        ..EngineOptions::default()
    }
}

/// An F32 tensor of `f`, flat in GGUF order (the first dimension fastest).
fn f32s(f: &GgufFile, name: &str) -> Vec<f64> {
    let info = f.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
    assert_eq!(info.ggml_type, GgmlType::F32, "{name}");
    f.tensor_data(info)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
        .collect()
}

/// `w x + b` for a GGUF matrix `[n_in, n_out]`.
fn affine(w: &[f64], b: &[f64], x: &[f64]) -> Vec<f64> {
    b.iter()
        .enumerate()
        .map(|(o, bo)| {
            bo + w[o * x.len()..][..x.len()]
                .iter()
                .zip(x)
                .map(|(a, c)| a * c)
                .sum::<f64>()
        })
        .collect()
}

/// The head by hand over a `[CLS]` row, in f64, with or without its tanh.
fn head_by_hand(f: &GgufFile, cls: &[f32], tanh: bool) -> f64 {
    let x: Vec<f64> = cls.iter().map(|&v| v as f64).collect();
    let mut d = affine(&f32s(f, "cls.weight"), &f32s(f, "cls.bias"), &x);
    if tanh {
        d.iter_mut().for_each(|v| *v = v.tanh());
    }
    affine(
        &f32s(f, "cls.output.weight"),
        &f32s(f, "cls.output.bias"),
        &d,
    )[0]
}

/// The tiny reranker against llama.cpp (`scripts/gen_embed_reference.py --rerank`):
/// [`Tokenizer::encode_pair`] gives llama.cpp's ids for both layouts, and each rank score
/// is within 1e-3 relative. The bound is llama.cpp's, not the head's: its CPU GELU reads
/// a table of f16 inputs and outputs (`GGML_GELU_FP16`), so its encoder rows sit about
/// 1e-4 from exact f32 ones (measured worst: printed); the head computed by hand in f64
/// from minfer's own `[CLS]` row equals the graph's score within 1e-5. Without the
/// head's tanh or its dense layer the by-hand score misses llama.cpp's by more than ten
/// times the bound, so a graph that skipped either could not pass.
#[test]
fn tiny_reranker_scores_match_llama_cpp() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("../golden/rerank_tiny_reference.json"))
            .expect("golden JSON");
    let entries = golden["entries"].as_array().expect("entries");
    assert!(entries.len() >= 8, "{} entries", entries.len());
    let (_, spec) = bert_reranker();
    let f = file(&spec);
    let tok = Tokenizer::from_gguf(&f).expect("tokenizer");
    let mut e = Engine::from_gguf(file(&spec), &opts()).expect("engine");
    assert_eq!(Pooling::of_model(&e), Some(Pooling::Rank));
    assert_eq!(Pooling::default_for(&e), Pooling::Rank);
    let mut worst = 0f64;
    for g in entries {
        let (q, d) = (
            g["query"].as_str().unwrap(),
            g["document"].as_str().unwrap(),
        );
        let end = match g["layout"].as_str() {
            Some("server") => PairEnd::Server,
            Some("embedding") => PairEnd::Embedding,
            other => panic!("layout {other:?}"),
        };
        let ids = tok.encode_pair(q, d, end);
        let want_ids: Vec<u32> = g["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(ids, want_ids, "{end:?} {q:?} / {d:?}");
        let want = g["score"].as_f64().unwrap();
        // `normalize` is asked for and must not apply: one value would become ±1.
        let rows = embed(&mut e, &ids, Pooling::Rank, true).expect("rank");
        assert_eq!((rows.len(), rows[0].len()), (1, 1));
        let got = rows[0][0] as f64;
        let bound = 1e-3 * want.abs().max(1e-2);
        let err = (got - want).abs();
        worst = worst.max(err / want.abs());
        let cls = embed(&mut e, &ids, Pooling::Cls, false)
            .expect("cls")
            .remove(0);
        let full = head_by_hand(&f, &cls, true);
        assert!(err < bound, "{end:?} {q:?}: {got} vs llama.cpp {want}");
        // The head's terms matter at this bound.
        assert!(
            (full - got).abs() < 1e-5 * got.abs(),
            "by hand {full} vs the graph's {got}"
        );
        assert!((full - want).abs() < bound, "by hand {full} vs {want}");
        let no_tanh = head_by_hand(&f, &cls, false);
        assert!(
            (no_tanh - want).abs() > 10.0 * bound,
            "tanh changes nothing: {no_tanh}"
        );
        let x: Vec<f64> = cls.iter().map(|&v| v as f64).collect();
        let no_dense = affine(
            &f32s(&f, "cls.output.weight"),
            &f32s(&f, "cls.output.bias"),
            &x,
        )[0];
        assert!(
            (no_dense - want).abs() > 10.0 * bound,
            "dense changes nothing: {no_dense}"
        );
    }
    eprintln!("tiny reranker: worst relative error {worst:.2e} against llama.cpp");
}

#[test]
fn a_slot_scores_as_a_lone_engine_and_a_headless_bert_refuses_rank() {
    let (_, spec) = bert_reranker();
    let mut lone = Engine::from_gguf(file(&spec), &opts()).expect("engine");
    let mut m = MultiEngine::from_shared(Arc::new(file(&spec)), &opts(), 2).expect("multi");
    let text: Vec<u32> = (0..20).map(|i| 5 + (i * 37) % 150).collect();
    let want = embed(&mut lone, &text, Pooling::Rank, false).expect("rank");
    for slot in [1, 0] {
        let got = m
            .embed(slot, &text, Pooling::Rank, false)
            .expect("slot rank");
        assert!((got[0][0] - want[0][0]).abs() <= 1e-6 * want[0][0].abs().max(1.0));
    }
    let plain = TinyBert::new(GgmlType::F32, BERT_SEED);
    let mut e = Engine::from_gguf(file(&plain), &opts()).expect("engine");
    assert_eq!(Pooling::of_model(&e), Some(Pooling::Mean));
    let err = embed(&mut e, &text, Pooling::Rank, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("classifier head") && err.contains("cls.output.weight"),
        "{err}"
    );
}

/// Rank pooling runs the classifier head on the `[CLS]` row alone: the traced graph's
/// head layers are one row wide, and the score equals the first row of a step that
/// returns every row's.
#[test]
fn the_head_runs_on_the_first_row_alone() {
    let (_, spec) = bert_reranker();
    let mut e = Engine::from_gguf(file(&spec), &opts()).expect("engine");
    let text: Vec<u32> = (0..20).map(|i| 5 + (i * 37) % 150).collect();
    let graphs = Arc::new(Mutex::new(Vec::new()));
    let sink = graphs.clone();
    e.set_trace(
        Some(Box::new(move |s: TracedStep| {
            if let Some(g) = s.graph {
                sink.lock().expect("sink").push(g);
            }
        })),
        1,
    );
    let rank = embed(&mut e, &text, Pooling::Rank, false).expect("rank");
    e.set_trace(None, 0);
    let graphs = graphs.lock().expect("graphs");
    let rows_of = |name: &str| -> Vec<u64> {
        graphs
            .iter()
            .flat_map(|g| g["nodes"].as_array().cloned().unwrap_or_default())
            .filter(|n| n["name"] == name)
            .map(|n| n["shape"][1].as_u64().expect("shape"))
            .collect()
    };
    assert_eq!(rows_of("cls_dense"), [1], "the dense layer's rows");
    assert_eq!(rows_of("result_embd_pooled"), [1], "the classifier's rows");
    let width = e.rank_width().expect("head");
    let all = e
        .forward_scores(&text, 0, 0..text.len())
        .expect("every row");
    assert_eq!(all.len(), text.len() * width);
    let (got, want) = (rank[0][0], all[0]);
    assert!(
        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
        "{got} vs {want}"
    );
}
