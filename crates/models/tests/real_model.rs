//! The default model's header: hyperparameters, tensor validation and graph shape.
//! Opening maps the file; only the header and tensor table are read.

use std::collections::BTreeSet;

use minfer_gguf::GgufFile;
use minfer_graph::RopeStyle;
use minfer_models::load_model;
use minfer_models::params::{cpu_cparams, prefill};

fn open_default() -> GgufFile {
    let path = minfer_hub::default_model_path();
    assert!(
        path.exists(),
        "the default model is missing at {}: run `minfer pull` first",
        path.display()
    );
    GgufFile::open(&path).expect("open the default model")
}

#[test]
fn default_model_hyperparameters() {
    let f = open_default();
    let m = load_model(&f).expect("the default model loads");
    assert_eq!(m.arch(), "qwen2");
    let hp = m.hparams();
    assert_eq!(hp.n_layer, 24);
    assert_eq!(hp.n_embd, 896);
    assert_eq!(hp.n_head, 14);
    assert_eq!(hp.n_head_kv, 2);
    assert_eq!(hp.head_dim, 64);
    assert_eq!(hp.n_ff, 4864);
    assert_eq!(hp.n_vocab, 151936);
    assert_eq!(hp.n_ctx_train, 32768);
    assert_eq!(hp.rope_freq_base, 1e6);
    assert_eq!(hp.rope_freq_scale, 1.0);
    assert!((hp.rms_eps - 1e-6).abs() < 1e-12);
    assert_eq!(m.rope_style(), RopeStyle::NonInterleaved);
    assert_eq!(m.n_kv_embd(), 128);
    // This quantization of Qwen2.5-Coder-0.5B ships its own lm head (Q8_0), so the head
    // is not tied to the embedding here.
    assert!(f.tensor("output.weight").is_some());
    assert!(!m.tied_output());
}

#[test]
fn default_model_graph_references_exactly_its_tensors() {
    let f = open_default();
    let m = load_model(&f).unwrap();
    let names: BTreeSet<String> = m.weight_names().into_iter().collect();
    let file: BTreeSet<String> = f.tensors().iter().map(|t| t.name.clone()).collect();
    assert_eq!(names, file);
    assert_eq!(names.len(), 291);

    let g = m.build_graph(&prefill(16, 1, cpu_cparams(512)).unwrap());
    g.validate().unwrap();
    let logits = &g.nodes[g.outputs[0]];
    assert_eq!(logits.out_shape, [151936, 1, 1, 1]);
    // 2 inputs + tail_ids + embedding + 18 per layer + 2 tail reducers + norm + head.
    assert_eq!(g.nodes.len(), 3 + 1 + 18 * 24 + 2 + 2);
}
