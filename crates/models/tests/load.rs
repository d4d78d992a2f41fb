//! load_model: dispatch, hyperparameters, and refusals that name what is wrong.

mod common;

use minfer_gguf::{GgmlType, GgufFile, GgufWriter, MetaType, MetaValue};
use minfer_graph::RopeStyle;
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_models::{load_model, supported_architectures, ModelError};

type TensorEdit = Option<(Vec<u64>, GgmlType, Vec<u8>)>;

/// A tiny model rewritten: `meta` sets (Some) or drops (None) keys; `tensor` returns
/// `Some(None)` to drop a tensor and `Some(Some(..))` to replace it.
fn edited(
    spec: &TinySpec,
    meta: &[(&str, Option<MetaValue>)],
    tensor: impl Fn(&str) -> Option<TensorEdit>,
) -> GgufFile {
    let src = GgufFile::from_bytes(tiny_model_bytes(spec).unwrap()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        if !meta.iter().any(|(key, edit)| key == k && edit.is_none()) {
            w.add_meta(k, v.clone());
        }
    }
    for (k, v) in meta {
        if let Some(v) = v {
            w.add_meta(k, v.clone());
        }
    }
    for t in src.tensors() {
        match tensor(&t.name) {
            None => {
                w.add_tensor_bytes(&t.name, &t.dims, t.ggml_type, src.tensor_data(t).to_vec())
                    .unwrap();
            }
            Some(Some((dims, ty, bytes))) => {
                w.add_tensor_bytes(&t.name, &dims, ty, bytes).unwrap();
            }
            Some(None) => {}
        }
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

fn with_meta(spec: &TinySpec, key: &str, value: Option<MetaValue>) -> GgufFile {
    edited(spec, &[(key, value)], |_| None)
}

fn with_tensor(spec: &TinySpec, name: &str, edit: TensorEdit) -> GgufFile {
    edited(spec, &[], |n| (n == name).then(|| edit.clone()))
}

fn err(f: &GgufFile) -> String {
    match load_model(f) {
        Ok(m) => panic!("loaded as {}", m.arch()),
        Err(e) => e.to_string(),
    }
}

fn q2() -> TinySpec {
    TinySpec::qwen2(GgmlType::F32, 3)
}

#[test]
fn tiny_models_load_with_their_hyperparameters() {
    let f = GgufFile::from_bytes(tiny_model_bytes(&q2()).unwrap()).unwrap();
    let m = load_model(&f).unwrap();
    assert_eq!(m.arch(), "qwen2");
    let hp = m.hparams();
    assert_eq!(
        (
            hp.n_layer,
            hp.n_embd,
            hp.n_head,
            hp.n_head_kv,
            hp.head_dim,
            hp.n_ff
        ),
        (2, 128, 4, 2, 32, 256)
    );
    assert_eq!((hp.n_vocab, hp.n_ctx_train), (512, 256));
    assert_eq!(
        (hp.rms_eps, hp.rope_freq_base, hp.rope_freq_scale),
        (1e-6, 10000.0, 1.0)
    );
    assert_eq!(m.rope_style(), RopeStyle::NonInterleaved);
    assert_eq!((m.n_kv_embd(), m.n_embd_head(), m.n_vocab()), (64, 32, 512));
    assert!(!m.tied_output());
    // 3 globals + 12 per layer.
    assert_eq!(m.weight_names().len(), 3 + 12 * 2);

    let f = GgufFile::from_bytes(tiny_model_bytes(&TinySpec::qwen3(GgmlType::F16, 3)).unwrap())
        .unwrap();
    let m = load_model(&f).unwrap();
    assert_eq!(m.arch(), "qwen3");
    assert_eq!(
        (m.n_embd_head(), m.hparams().n_q_embd(), m.n_kv_embd()),
        (64, 256, 128)
    );
    assert!(m.tied_output());
    // 2 globals (tied head) + 11 per layer.
    assert_eq!(m.weight_names().len(), 2 + 11 * 2);
}

#[test]
fn unsupported_architectures_are_refused_with_the_supported_list() {
    let f = with_meta(
        &q2(),
        "general.architecture",
        Some(MetaValue::String("gemma".into())),
    );
    assert_eq!(
        err(&f),
        "unsupported architecture `gemma`; supported: qwen2, qwen3, qwen2moe, qwen3moe, qwen35, qwen35moe, qwen3next, llama, gemma2, gemma3, gpt-oss, bert, nomic-bert"
    );
    assert_eq!(
        supported_architectures(),
        [
            "qwen2",
            "qwen3",
            "qwen2moe",
            "qwen3moe",
            "qwen35",
            "qwen35moe",
            "qwen3next",
            "llama",
            "gemma2",
            "gemma3",
            "gpt-oss",
            "bert",
            "nomic-bert",
        ]
    );
    let f = with_meta(&q2(), "general.architecture", None);
    assert!(err(&f).contains("`general.architecture`"), "{}", err(&f));
}

#[test]
fn missing_hyperparameters_name_the_key() {
    for key in [
        "qwen2.block_count",
        "qwen2.embedding_length",
        "qwen2.feed_forward_length",
        "qwen2.attention.head_count",
        "qwen2.context_length",
        "qwen2.attention.layer_norm_rms_epsilon",
    ] {
        let e = err(&with_meta(&q2(), key, None));
        assert!(e.contains(&format!("missing metadata key `{key}`")), "{e}");
    }
    // Optional keys fall back to llama.cpp's defaults: without head_count_kv every head
    // has its own K/V, which these tensors contradict.
    let f = with_meta(&q2(), "qwen2.attention.head_count_kv", None);
    assert_eq!(
        err(&f),
        "tensor `blk.0.attn_k.weight` has shape [128, 64], expected [128, 128] (GGUF [in, out] order)"
    );
    let f = with_meta(&q2(), "qwen2.rope.freq_base", None);
    assert_eq!(load_model(&f).unwrap().hparams().rope_freq_base, 10000.0);
}

#[test]
fn unusable_hyperparameters_name_the_key_and_reason() {
    let f = with_meta(
        &q2(),
        "qwen2.attention.head_count_kv",
        Some(MetaValue::U32(3)),
    );
    let e = err(&f);
    assert!(
        e.contains("`qwen2.attention.head_count_kv` = 3") && e.contains("divide"),
        "{e}"
    );
    let f = with_meta(&q2(), "qwen2.block_count", Some(MetaValue::U32(0)));
    assert!(err(&f).contains("`qwen2.block_count` = 0"), "{}", err(&f));
    let f = with_meta(
        &q2(),
        "qwen2.block_count",
        Some(MetaValue::String("2".into())),
    );
    assert!(
        err(&f).contains("`qwen2.block_count` has type string"),
        "{}",
        err(&f)
    );
    let f = with_meta(&q2(), "qwen2.vocab_size", Some(MetaValue::U32(1000)));
    assert!(
        err(&f).contains("token_embd.weight has 512 rows"),
        "{}",
        err(&f)
    );
}

#[test]
fn rope_scaling_is_linear_yarn_or_refused() {
    let f = with_meta(
        &q2(),
        "qwen2.rope.scaling.factor",
        Some(MetaValue::F32(4.0)),
    );
    let m = load_model(&f).unwrap();
    assert_eq!(m.hparams().rope_freq_scale, 0.25);
    assert_eq!(m.hparams().rope_yarn, None);
    let f = edited(
        &q2(),
        &[
            ("qwen2.rope.scaling.factor", Some(MetaValue::F32(4.0))),
            (
                "qwen2.rope.scaling.type",
                Some(MetaValue::String("yarn".into())),
            ),
            (
                "qwen2.rope.scaling.original_context_length",
                Some(MetaValue::U32(64)),
            ),
        ],
        |_| None,
    );
    let y = load_model(&f).unwrap().hparams().rope_yarn.unwrap();
    assert_eq!((y.ext_factor, y.attn_factor, y.n_ctx_orig), (1.0, 1.0, 64));
    assert_eq!((y.beta_fast, y.beta_slow), (32.0, 1.0));
    let f = with_meta(
        &q2(),
        "qwen2.rope.scaling.type",
        Some(MetaValue::String("longrope".into())),
    );
    let e = err(&f);
    assert!(e.contains("`qwen2.rope.scaling.type` = longrope"), "{e}");
}

#[test]
fn missing_tensors_are_named() {
    let f = with_tensor(&q2(), "blk.1.attn_k.weight", None);
    assert_eq!(err(&f), "missing tensor `blk.1.attn_k.weight`");
    let f = with_tensor(&q2(), "blk.0.attn_q.bias", None);
    assert_eq!(err(&f), "missing tensor `blk.0.attn_q.bias`");
    let q3 = TinySpec::qwen3(GgmlType::F32, 3);
    let f = with_tensor(&q3, "blk.1.attn_k_norm.weight", None);
    assert_eq!(err(&f), "missing tensor `blk.1.attn_k_norm.weight`");
}

/// The expert keys and tensors of the MoE architectures: read with their geometry,
/// and every missing or inconsistent one named.
#[test]
fn moe_models_read_their_experts_and_name_what_is_wrong() {
    let q3 = TinySpec::qwen3moe(GgmlType::F32, 3);
    let m = load_model(&GgufFile::from_bytes(tiny_model_bytes(&q3).unwrap()).unwrap()).unwrap();
    let moe = m.hparams().moe.clone().expect("experts");
    assert_eq!((moe.n_expert, moe.n_expert_used, moe.n_ff_exp), (8, 2, 32));
    assert!(
        m.active_params()
            < m.weights()
                .iter()
                .map(|w| (w.shape[0] * w.shape[1]) as u64)
                .sum()
    );
    let f = with_meta(&q3, "qwen3moe.expert_used_count", Some(MetaValue::U32(9)));
    assert!(
        err(&f).contains("`qwen3moe.expert_used_count` = 9"),
        "{}",
        err(&f)
    );
    assert!(err(&f).contains("exceeds expert_count = 8"), "{}", err(&f));
    let f = with_meta(&q3, "qwen3moe.expert_count", None);
    assert!(err(&f).contains("qwen3moe.expert_count"), "{}", err(&f));
    let f = with_tensor(&q3, "blk.1.ffn_down_exps.weight", None);
    assert_eq!(err(&f), "missing tensor `blk.1.ffn_down_exps.weight`");
    // Experts of the wrong width: expert_feed_forward_length says 32.
    let f = with_meta(
        &q3,
        "qwen3moe.expert_feed_forward_length",
        Some(MetaValue::U32(64)),
    );
    assert!(
        err(&f).contains("blk.0.ffn_gate_exps.weight"),
        "{}",
        err(&f)
    );
    let q2m = TinySpec::qwen2moe(GgmlType::F32, 3);
    let f = with_tensor(&q2m, "blk.0.ffn_gate_inp_shexp.weight", None);
    assert_eq!(err(&f), "missing tensor `blk.0.ffn_gate_inp_shexp.weight`");
    let f = with_tensor(&q2m, "output.weight", None);
    assert_eq!(err(&f), "missing tensor `output.weight`");
}

#[test]
fn a_missing_output_weight_ties_the_head() {
    let f = with_tensor(&q2(), "output.weight", None);
    let m = load_model(&f).unwrap();
    assert!(m.tied_output());
    assert!(!m.weight_names().iter().any(|n| n == "output.weight"));
}

#[test]
fn wrong_shapes_and_types_are_named() {
    let square = Some((vec![128, 128], GgmlType::F32, vec![0; 128 * 128 * 4]));
    let f = with_tensor(&q2(), "blk.0.ffn_up.weight", square.clone());
    assert_eq!(
        err(&f),
        "tensor `blk.0.ffn_up.weight` has shape [128, 128], expected [128, 256] (GGUF [in, out] order)"
    );
    // The transposed layout is refused too.
    let f = with_tensor(
        &q2(),
        "blk.0.attn_k.weight",
        Some((vec![64, 128], GgmlType::F32, vec![0; 64 * 128 * 4])),
    );
    assert!(
        err(&f).contains("`blk.0.attn_k.weight` has shape [64, 128], expected [128, 64]"),
        "{}",
        err(&f)
    );
    let f = with_tensor(
        &q2(),
        "blk.0.ffn_norm.weight",
        Some((vec![128], GgmlType::F16, vec![0; 256])),
    );
    assert_eq!(
        err(&f),
        "tensor `blk.0.ffn_norm.weight` is stored as F16; norm scales and biases must be F32"
    );
    // Matrices may be any type the reader knows.
    let f = with_tensor(
        &q2(),
        "blk.0.attn_v.weight",
        Some((vec![128, 64], GgmlType::Q8_0, vec![0; 64 * 4 * 34])),
    );
    assert!(load_model(&f).is_ok());
}

#[test]
fn errors_are_typed() {
    let f = with_tensor(&q2(), "token_embd.weight", None);
    assert!(matches!(
        load_model(&f),
        Err(ModelError::MissingTensor { .. })
    ));
}

/// A tiny model with extra tensors (F32 data) appended.
fn with_extra(spec: &TinySpec, extra: &[(&str, Vec<u64>)]) -> GgufFile {
    let src = GgufFile::from_bytes(tiny_model_bytes(spec).unwrap()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        w.add_meta(k, v.clone());
    }
    for t in src.tensors() {
        w.add_tensor_bytes(&t.name, &t.dims, t.ggml_type, src.tensor_data(t).to_vec())
            .unwrap();
    }
    for (name, dims) in extra {
        let n = dims.iter().product::<u64>() as usize;
        w.add_tensor_f32(name, dims, GgmlType::F32, &vec![0.5; n])
            .unwrap();
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

fn llama() -> TinySpec {
    TinySpec::llama(GgmlType::F32, 3)
}

#[test]
fn llama_loads_with_normal_rope_untied_or_tied() {
    let f = GgufFile::from_bytes(tiny_model_bytes(&llama()).unwrap()).unwrap();
    let m = load_model(&f).unwrap();
    assert_eq!(m.arch(), "llama");
    assert_eq!(m.rope_style(), RopeStyle::Interleaved);
    assert!(!m.tied_output());
    assert_eq!((m.n_embd_head(), m.n_head_kv()), (32, 2));
    // 3 globals + 9 per layer: no biases, no q/k norms.
    assert_eq!(m.weight_names().len(), 3 + 9 * 2);
    let tied = TinySpec {
        tied: true,
        ..llama()
    };
    let f = GgufFile::from_bytes(tiny_model_bytes(&tied).unwrap()).unwrap();
    let m = load_model(&f).unwrap();
    assert!(m.tied_output());
    assert!(!m.weight_names().iter().any(|n| n == "output.weight"));
}

#[test]
fn llama_rope_freqs_are_a_weight_of_half_the_head() {
    let spec = TinySpec {
        rope_freqs: true,
        ..llama()
    };
    let f = GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap();
    let m = load_model(&f).unwrap();
    assert!(m.weight_names().iter().any(|n| n == "rope_freqs.weight"));
    let f = with_tensor(
        &spec,
        "rope_freqs.weight",
        Some((vec![32], GgmlType::F32, vec![0; 128])),
    );
    let e = err(&f);
    assert!(
        e.contains("`rope_freqs.weight`") && e.contains("[16]"),
        "{e}"
    );
}

#[test]
fn llama_optional_biases_are_all_three_or_none() {
    let qkv = [
        ("blk.0.attn_q.bias", vec![128]),
        ("blk.0.attn_k.bias", vec![64]),
        ("blk.0.attn_v.bias", vec![64]),
    ];
    let m = load_model(&with_extra(&llama(), &qkv)).unwrap();
    assert_eq!(m.weight_names().len(), 3 + 9 * 2 + 3);
    let e = err(&with_extra(&llama(), &qkv[..2]));
    assert!(e.contains("missing tensor `blk.0.attn_v.bias`"), "{e}");
}

#[test]
fn llama_tensors_without_a_graph_term_are_refused_by_name() {
    for (name, dims, what) in [
        ("blk.1.attn_output.bias", vec![128], "attention output bias"),
        ("blk.0.ffn_down.bias", vec![128], "FFN bias"),
        ("blk.0.attn_qkv.weight", vec![128, 256], "fused q|k|v"),
    ] {
        let e = err(&with_extra(&llama(), &[(name, dims)]));
        assert!(e.contains(&format!("`{name}`")) && e.contains(what), "{e}");
    }
    let f = with_meta(&llama(), "llama.expert_count", Some(MetaValue::U32(8)));
    let e = err(&f);
    assert!(
        e.contains("llama.expert_count") && e.contains("mixture-of-experts"),
        "{e}"
    );
    let f = with_meta(
        &llama(),
        "llama.rope.dimension_count",
        Some(MetaValue::U32(16)),
    );
    let e = err(&f);
    assert!(
        e.contains("llama.rope.dimension_count") && e.contains("32"),
        "{e}"
    );
}

#[test]
fn qwen35_loads_its_hybrid_layers_and_refuses_what_its_graph_lacks() {
    let spec = TinySpec::qwen35(GgmlType::F32, 1);
    let f = GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap();
    let m = load_model(&f).unwrap();
    assert_eq!(m.arch(), "qwen35");
    assert!(m.is_recurrent());
    // Every third layer is full attention.
    assert_eq!(m.recurrent_layers(), [true, true, false, true, true, false]);
    // A rotated pair no text section covers would need the fourth position.
    let bad = with_meta(
        &spec,
        "qwen35.rope.dimension_sections",
        Some(MetaValue::Array(
            MetaType::I32,
            [2, 1, 0, 1].into_iter().map(MetaValue::I32).collect(),
        )),
    );
    assert!(
        err(&bad).contains("rope.dimension_sections"),
        "{}",
        err(&bad)
    );
    let missing = with_meta(&spec, "qwen35.ssm.conv_kernel", None);
    assert!(
        err(&missing).contains("qwen35.ssm.conv_kernel"),
        "{}",
        err(&missing)
    );
    let inner = with_meta(&spec, "qwen35.ssm.inner_size", Some(MetaValue::U32(63)));
    assert!(err(&inner).contains("ssm.inner_size"), "{}", err(&inner));
}
