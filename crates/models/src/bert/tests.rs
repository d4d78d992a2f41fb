//! The BERT-family loaders and graphs on the tiny models of [`crate::testing`]: the
//! graph's terms (bidirectional attention, LayerNorms, rope, slices, SwiGLU), the rank
//! head, and the refusals by name.

use minfer_gguf::{GgmlType, GgufWriter, MetaValue};

use crate::testing::{
    bert_models, bert_reranker, nomic_models, tiny_bert_bytes, tiny_bert_writer, TinyBert,
    BERT_SEED, NOMIC_SEED, TINY_NOMIC_ROPE_BASE,
};

fn load(w: &GgufWriter) -> Result<Box<dyn crate::ModelDef>, crate::ModelError> {
    crate::load_model(&minfer_gguf::GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap())
}

#[test]
fn the_graph_is_bidirectional_with_layer_norms_and_no_head() {
    use minfer_graph::{NodeMeta, Op};
    let spec = TinyBert::new(GgmlType::F32, BERT_SEED);
    let m = load(&tiny_bert_writer(&spec).unwrap()).unwrap();
    let p = crate::params::prefill(9, 9, crate::params::cpu_cparams(128)).unwrap();
    let g = m.build_graph(&p);
    let attn: Vec<_> = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Attn { .. }))
        .collect();
    assert_eq!(attn.len(), spec.n_layer);
    assert!(attn
        .iter()
        .all(|n| matches!(&n.meta, NodeMeta::Attn(a) if !a.causal)));
    let norms = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::LayerNorm { .. }))
        .count();
    assert_eq!(norms, 1 + 2 * spec.n_layer);
    assert!(g.input_by_name(super::INPUT_TOKEN_TYPES).is_some());
    // The output is the hidden rows, not logits.
    assert_eq!(g.nodes[g.outputs[0]].out_shape[..2], [spec.n_embd, 9]);
    assert!(!m.weight_names().iter().any(|n| n.starts_with("output")));
}

#[test]
fn a_causal_bert_and_variant_tensors_are_refused_by_name() {
    let spec = TinyBert::new(GgmlType::F32, BERT_SEED);
    let mut w = tiny_bert_writer(&spec).unwrap();
    w.add_meta("bert.attention.causal", MetaValue::Bool(true));
    let e = load(&w).err().unwrap().to_string();
    assert!(e.contains("bert.attention.causal"), "{e}");
    let mut w = tiny_bert_writer(&spec).unwrap();
    w.add_tensor_f32(
        "blk.1.attn_qkv.weight",
        &[64, 192],
        GgmlType::F32,
        &[0.0; 64 * 192],
    )
    .unwrap();
    let e = load(&w).err().unwrap().to_string();
    assert!(e.contains("blk.1.attn_qkv.weight"), "{e}");
    let mut w = tiny_bert_writer(&spec).unwrap();
    w.add_meta("bert.attention.layer_norm_epsilon", MetaValue::F32(-1.0));
    let e = load(&w).err().unwrap().to_string();
    assert!(e.contains("layer_norm_epsilon"), "{e}");
}

#[test]
fn the_reranker_ends_in_its_head_only_when_the_graph_asks_for_rank() {
    use minfer_graph::Op;
    let (_, spec) = bert_reranker();
    let m = load(&tiny_bert_writer(&spec).unwrap()).unwrap();
    assert_eq!(m.rank_width(), Some(1));
    let names = m.weight_names();
    for t in [
        "cls.weight",
        "cls.bias",
        "cls.output.weight",
        "cls.output.bias",
    ] {
        assert!(names.iter().any(|n| n == t), "{t} not referenced");
    }
    let cp = crate::params::cpu_cparams(128);
    let plain = m.build_graph(&crate::params::prefill(9, 9, cp.clone()).unwrap());
    assert_eq!(
        plain.nodes[plain.outputs[0]].out_shape[..2],
        [spec.n_embd, 9]
    );
    let cp = minfer_graph::CParams { rank: true, ..cp };
    let g = m.build_graph(&crate::params::prefill(9, 9, cp).unwrap());
    let out = &g.nodes[g.outputs[0]];
    assert_eq!(out.out_shape[..2], [1, 9]);
    assert_eq!(
        g.nodes.iter().filter(|n| n.op == Op::SoftCap(1.0)).count(),
        1,
        "one tanh between the dense layer and the classifier"
    );
    // A headless BERT has no rank width: the runtime refuses rank pooling for it.
    let plain = load(&tiny_bert_writer(&TinyBert::new(GgmlType::F32, BERT_SEED)).unwrap());
    assert_eq!(plain.unwrap().rank_width(), None);
}

#[test]
fn a_tiny_nomic_bert_rotates_q_and_k_and_gates_its_ffn() {
    use minfer_graph::{NodeMeta, Op, RopeStyle};
    for (stem, spec) in nomic_models() {
        let m = load(&tiny_bert_writer(&spec).unwrap()).unwrap();
        assert_eq!(m.arch(), "nomic-bert", "{stem}");
        assert!(m.is_encoder());
        assert_eq!(m.rank_width(), None);
        let p = crate::params::prefill(9, 9, crate::params::cpu_cparams(128)).unwrap();
        let g = m.build_graph(&p);
        let count = |f: &dyn Fn(&Op) -> bool| g.nodes.iter().filter(|n| f(&n.op)).count();
        let ropes: Vec<_> = g
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::RoPE { .. }))
            .collect();
        assert_eq!(
            ropes.len(),
            2 * spec.n_layer,
            "{stem}: q and k of each layer"
        );
        assert!(ropes.iter().all(|n| matches!(&n.meta, NodeMeta::Rope(r)
            if r.style == RopeStyle::NonInterleaved
                && r.freq_base == TINY_NOMIC_ROPE_BASE
                && r.n_dims == spec.n_embd / spec.n_head)));
        assert_eq!(count(&|o| matches!(o, Op::Slice { .. })), 3 * spec.n_layer);
        assert_eq!(count(&|o| *o == Op::SwiGLU), spec.n_layer);
        assert_eq!(
            count(&|o| matches!(o, Op::LayerNorm { .. })),
            1 + 2 * spec.n_layer
        );
        let names = m.weight_names();
        assert!(!names.iter().any(|n| n.starts_with("position_embd")));
        assert!(names.iter().any(|n| n == "blk.1.ffn_gate.weight"));
        assert!(names.iter().any(|n| n == "blk.0.attn_qkv.weight"));
        assert_eq!(g.nodes[g.outputs[0]].out_shape[..2], [spec.n_embd, 9]);
    }
}

#[test]
fn a_nomic_bert_refuses_what_its_graph_has_no_term_for_by_name() {
    let spec = TinyBert::nomic(GgmlType::F32, NOMIC_SEED);
    let (ne, nf) = (spec.n_embd, spec.n_ff);
    let cases: [(&str, Vec<u64>, &str); 4] = [
        (
            "position_embd.weight",
            vec![ne as u64, spec.n_ctx as u64],
            "rope",
        ),
        ("blk.0.ffn_up.bias", vec![nf as u64], "FFN bias"),
        ("blk.1.attn_q.bias", vec![ne as u64], "fused"),
        ("blk.0.attn_norm_2.weight", vec![ne as u64], "no term"),
    ];
    for (name, dims, why) in cases {
        let mut w = tiny_bert_writer(&spec).unwrap();
        let n = dims.iter().product::<u64>() as usize;
        w.add_tensor_f32(name, &dims, GgmlType::F32, &vec![0.0; n])
            .unwrap();
        let e = load(&w).err().unwrap().to_string();
        assert!(e.contains(name) && e.contains(why), "{name}: {e}");
    }
    let mut w = tiny_bert_writer(&spec).unwrap();
    w.add_meta("nomic-bert.rope.dimension_count", MetaValue::U32(8));
    let e = load(&w).err().unwrap().to_string();
    assert!(e.contains("nomic-bert.rope.dimension_count"), "{e}");
}

#[test]
fn a_tiny_bert_loads() {
    for (stem, spec) in bert_models() {
        let f = minfer_gguf::GgufFile::from_bytes(tiny_bert_bytes(&spec).unwrap()).unwrap();
        let m = crate::load_model(&f).unwrap_or_else(|e| panic!("{stem}: {e}"));
        assert!(m.is_encoder());
        assert_eq!(m.arch(), "bert");
    }
}
