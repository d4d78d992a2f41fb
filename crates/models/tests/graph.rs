//! Structure of the built graphs (design §4): inputs at the head, the G3 tail reduction,
//! determinism, the Qwen3 differences and the decode fusion gates.

mod common;

use std::collections::BTreeSet;

use common::tiny;
use minfer_gguf::GgmlType;
use minfer_graph::testing::RefBackend;
use minfer_graph::*;
use minfer_models::params::{cpu_cparams, decode, graph_params, prefill};
use minfer_models::testing::TinySpec;
use minfer_models::ModelDef;

fn qwen2() -> Box<dyn ModelDef> {
    tiny(&TinySpec::qwen2(GgmlType::F32, 1))
}

fn qwen3() -> Box<dyn ModelDef> {
    tiny(&TinySpec::qwen3(GgmlType::Q8_0, 2))
}

fn count(g: &ComputeGraph, f: impl Fn(&Op) -> bool) -> usize {
    g.nodes.iter().filter(|n| f(&n.op)).count()
}

fn node<'a>(g: &'a ComputeGraph, name: &str) -> &'a CNode {
    g.nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("no node {name}"))
}

/// Invariant 2's structural identity (op with payload, shape, sources, inputs, outputs);
/// `GraphCache::verify_structural` is the same check but exists only in debug builds.
fn same_topology(a: &ComputeGraph, b: &ComputeGraph) -> bool {
    a.inputs == b.inputs
        && a.outputs == b.outputs
        && a.nodes.len() == b.nodes.len()
        && a.nodes
            .iter()
            .zip(&b.nodes)
            .all(|(x, y)| x.op == y.op && x.out_shape == y.out_shape && x.src == y.src)
}

fn gpu_cparams(fuse: bool) -> CParams {
    CParams {
        gpu: true,
        fuse_qkv: fuse,
        fuse_ffn: fuse,
        ..cpu_cparams(64)
    }
}

#[test]
fn inputs_sit_at_the_head_and_tail_ids_only_when_reducing() {
    let m = qwen2();
    let g = m.build_graph(&prefill(5, 1, cpu_cparams(64)).unwrap());
    g.validate().unwrap();
    assert_eq!(g.inputs, vec![0, 1, 2]);
    let names: Vec<&str> = g.inputs.iter().map(|&i| g.nodes[i].name.as_str()).collect();
    assert_eq!(names, ["token_ids", "positions", "tail_ids"]);
    assert_eq!(g.nodes[0].out_shape, [5, 1, 1, 1]);
    assert_eq!(g.nodes[1].out_shape, [5, 1, 1, 1]);
    assert_eq!(g.nodes[2].out_shape, [1, 1, 1, 1]);
    assert!(g.inputs.iter().all(|&i| g.nodes[i].out_dtype == DType::I32));
    assert_eq!(count(&g, |o| *o == Op::Input), 3);

    for p in [
        prefill(5, 5, cpu_cparams(64)).unwrap(),
        decode(cpu_cparams(64)).unwrap(),
    ] {
        let g = m.build_graph(&p);
        assert_eq!(g.inputs, vec![0, 1], "{p:?}");
        assert!(g.input_by_name("tail_ids").is_none());
    }
}

#[test]
fn node_counts_follow_the_layer_recipe() {
    // Per layer: attn_norm, q, k, v, 2 ropes, store, load, attn, wo, add,
    // ffn_norm, gate, up, silu, mul, down, add = 18; Qwen3 adds two qk_norms.
    // Head: inputs + embedding; tail: output norm + lm head; G3 adds 2 get_rows + 1 input.
    let (m2, m3) = (qwen2(), qwen3());
    let l = 2;
    let p = prefill(4, 4, cpu_cparams(64)).unwrap();
    assert_eq!(m2.build_graph(&p).nodes.len(), 2 + 1 + 18 * l + 2);
    assert_eq!(m3.build_graph(&p).nodes.len(), 2 + 1 + 20 * l + 2);
    let p = prefill(4, 2, cpu_cparams(64)).unwrap();
    assert_eq!(m2.build_graph(&p).nodes.len(), 3 + 1 + 18 * l + 2 + 2);
    assert_eq!(m3.build_graph(&p).nodes.len(), 3 + 1 + 20 * l + 2 + 2);
}

#[test]
fn tail_reduction_sits_on_the_last_layer_only() {
    let m = qwen2();
    let g = m.build_graph(&prefill(6, 2, cpu_cparams(64)).unwrap());
    let tail = g.input_by_name("tail_ids").unwrap();
    let reducers: Vec<&CNode> = g.nodes.iter().filter(|n| n.src.contains(&tail)).collect();
    let names: Vec<&str> = reducers.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["attn_out_rows-1", "inp_sa_rows-1"]);
    for n in &reducers {
        assert_eq!(n.op, Op::GetRows);
        assert_eq!(n.out_shape, [128, 2, 1, 1]);
    }
    // Layer 0 and the last layer's attention run on all rows, everything after on n_out.
    assert_eq!(node(&g, "l_out-0").out_shape, [128, 6, 1, 1]);
    assert_eq!(node(&g, "attn_out-1").out_shape, [128, 6, 1, 1]);
    let ffn_inp = node(&g, "ffn_inp-1");
    assert_eq!(ffn_inp.op, Op::Add);
    assert_eq!(ffn_inp.out_shape, [128, 2, 1, 1]);
    assert_eq!(node(&g, "ffn_gate-1").out_shape, [256, 2, 1, 1]);
    let logits = &g.nodes[g.outputs[0]];
    assert_eq!(logits.name, "result_output");
    assert_eq!(logits.out_shape, [512, 2, 1, 1]);
    assert_eq!(g.outputs.len(), 1);
}

#[test]
fn equal_params_give_identical_graphs_and_different_params_do_not() {
    let m = qwen3();
    let p = prefill(7, 1, cpu_cparams(64)).unwrap();
    let (a, b) = (m.build_graph(&p), m.build_graph(&p.clone()));
    assert!(same_topology(&a, &b));
    assert_eq!(a, b, "names and metadata too");

    let d = m.build_graph(&decode(cpu_cparams(64)).unwrap());
    assert!(!same_topology(&a, &d));
    assert_eq!(d.nodes[0].out_shape, [1, 1, 1, 1]);
    assert_eq!(d.nodes[d.outputs[0]].out_shape, [512, 1, 1, 1]);
    let wider_ctx = m.build_graph(&prefill(7, 1, cpu_cparams(128)).unwrap());
    assert!(!same_topology(&a, &wider_ctx));
}

#[test]
fn qwen2_has_biases_and_no_qk_norm_qwen3_the_reverse() {
    let p = prefill(3, 3, cpu_cparams(64)).unwrap();
    let g2 = qwen2().build_graph(&p);
    let g3 = qwen3().build_graph(&p);
    let bias_of = |g: &ComputeGraph, name: &str| match &node(g, name).meta {
        NodeMeta::MatMul(m) => m.bias_name.clone(),
        other => panic!("{name}: {other:?}"),
    };
    for (il, proj) in [(0, "Qcur"), (0, "Kcur"), (1, "Vcur")] {
        let want = format!("blk.{il}.attn_{}.bias", proj[..1].to_lowercase());
        assert_eq!(bias_of(&g2, &format!("{proj}-{il}")), Some(want));
        assert_eq!(bias_of(&g3, &format!("{proj}-{il}")), None);
    }
    assert_eq!(count(&g2, |o| matches!(o, Op::QkNorm { .. })), 0);
    assert_eq!(count(&g3, |o| matches!(o, Op::QkNorm { .. })), 4);
    let qn = node(&g3, "Qcur_normed-1");
    assert_eq!(
        qn.op,
        Op::QkNorm {
            hd: 64,
            nh: 4,
            eps: 1e-6
        }
    );
    assert_eq!(qn.src, vec![node(&g3, "Qcur-1").id]);
    assert_eq!(
        node(&g3, "Kcur_normed-0").op,
        Op::QkNorm {
            hd: 64,
            nh: 2,
            eps: 1e-6
        }
    );
    // The rope reads the normed q.
    assert_eq!(node(&g3, "Qcur_rope-1").src[0], qn.id);
}

#[test]
fn qwen3_head_dim_drives_widths_rope_and_attention() {
    // head_dim 64 while n_embd / n_head = 32.
    let g = qwen3().build_graph(&prefill(3, 3, cpu_cparams(64)).unwrap());
    assert_eq!(node(&g, "Qcur-0").out_shape, [256, 3, 1, 1]);
    assert_eq!(node(&g, "Kcur-0").out_shape, [128, 3, 1, 1]);
    match &node(&g, "Qcur_rope-0").meta {
        NodeMeta::Rope(r) => {
            assert_eq!((r.n_dims, r.hd, r.n_head), (64, 64, 4));
            assert_eq!(r.style, RopeStyle::NonInterleaved);
            assert_eq!(r.freq_base, 10000.0);
        }
        other => panic!("{other:?}"),
    }
    let attn = node(&g, "kqv_out-1");
    assert_eq!(
        attn.op,
        Op::Attn {
            mode: AttnMode::Gqa,
            explicit_span: false
        }
    );
    match &attn.meta {
        NodeMeta::Attn(a) => {
            assert_eq!(
                (a.layer, a.n_head, a.n_head_kv, a.hd, a.n_ctx),
                (1, 4, 2, 64, 64)
            );
            assert_eq!(a.scale, 0.125);
        }
        other => panic!("{other:?}"),
    }
    let store = node(&g, "kv_store-1");
    assert_eq!(store.op, Op::KvcacheStore { layer: 1 });
    assert_eq!(store.src[2], g.input_by_name("positions").unwrap());
    assert_eq!(store.out_shape, [128, 64, 1, 1]);
    assert_eq!(node(&g, "kv_load-1").out_shape, [128, 64, 1, 1]);
}

#[test]
fn attention_options_follow_cparams() {
    let m = qwen2();
    let cp = CParams {
        flash_attn: true,
        explicit_span: true,
        ..cpu_cparams(64)
    };
    let g = m.build_graph(&graph_params(4, 1, cp).unwrap());
    let span = g.input_by_name("span").expect("span input");
    let cells = g.input_by_name("cells").expect("cells input");
    assert_eq!(g.inputs, vec![0, 1, 2, span, cells]);
    assert_eq!(g.nodes[span].out_shape, [2, 4, 1, 1]);
    assert_eq!(g.nodes[cells].out_shape, [4, 1, 1, 1]);
    // Explicit spans move the KV rows to `cells`; RoPE still reads `positions`.
    assert_eq!(node(&g, "kv_store-0").src[2], cells);
    assert_eq!(node(&g, "Qcur_rope-0").src[1], 1);
    let attn = node(&g, "kqv_out-0");
    assert_eq!(
        attn.op,
        Op::Attn {
            mode: AttnMode::Flash,
            explicit_span: true
        }
    );
    assert_eq!(attn.src.len(), 4);
    assert_eq!(attn.src[3], span);
}

#[test]
fn every_referenced_weight_is_listed_and_tied_heads_use_the_embedding() {
    for (m, tied) in [(qwen2(), false), (qwen3(), true)] {
        assert_eq!(m.tied_output(), tied);
        let listed: BTreeSet<String> = m.weight_names().into_iter().collect();
        assert_eq!(listed.len(), m.weight_names().len(), "listed once each");
        let g = m.build_graph(&prefill(3, 1, cpu_cparams(64)).unwrap());
        let mut used = BTreeSet::new();
        for n in &g.nodes {
            match &n.meta {
                NodeMeta::MatMul(mm) => {
                    used.insert(mm.weight_name.clone());
                    used.extend(mm.bias_name.clone());
                }
                NodeMeta::Norm(nm) => used.extend(nm.weight_name.clone()),
                NodeMeta::Embed(e) => {
                    used.insert(e.weight_name.clone());
                }
                _ => {}
            }
        }
        assert_eq!(used, listed, "{}", m.arch());
        let head = match &g.nodes[g.outputs[0]].meta {
            NodeMeta::MatMul(mm) => mm.weight_name.clone(),
            other => panic!("{other:?}"),
        };
        let want = if tied {
            "token_embd.weight"
        } else {
            "output.weight"
        };
        assert_eq!(head, want);
        assert_eq!(listed.contains("output.weight"), !tied);
    }
}

#[test]
fn node_names_follow_llama_cpp_and_are_unique() {
    for m in [qwen2(), qwen3()] {
        let g = m.build_graph(&prefill(4, 1, cpu_cparams(64)).unwrap());
        let names: BTreeSet<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(
            names.len(),
            g.nodes.len(),
            "{}: duplicate node names",
            m.arch()
        );
        for want in [
            "inp_embd",
            "attn_norm-0",
            "Qcur-0",
            "Kcur-1",
            "Vcur-1",
            "kqv_out-0",
            "attn_out-1",
            "ffn_inp-0",
            "ffn_norm-1",
            "ffn_gate-0",
            "ffn_up-0",
            "ffn_silu-1",
            "ffn_out-1",
            "l_out-1",
            "result_norm",
            "result_output",
        ] {
            assert!(names.contains(want), "{}: no {want}", m.arch());
        }
    }
}

#[test]
fn cpu_graphs_get_swiglu_from_the_fusion_pass() {
    let m = qwen2();
    let mut g = m.build_graph(&prefill(4, 1, cpu_cparams(64)).unwrap());
    let alloc = GraphAllocator::new(vec![Box::new(RefBackend::cpu())]).unwrap();
    BackendScheduler::new().assign_backends(&mut g, &alloc);
    assert_eq!(FusionPass::new().run(&mut g, &alloc), 2);
    let live_swiglu = g
        .nodes
        .iter()
        .filter(|n| n.op == Op::SwiGLU && !g.is_dead(n.id))
        .count();
    assert_eq!(live_swiglu, 2);
}

#[test]
fn decode_fusions_appear_only_on_single_token_graphs_with_flags() {
    let fused = |g: &ComputeGraph| {
        (
            count(g, |o| matches!(o, Op::FusedQKV { .. })),
            count(g, |o| matches!(o, Op::FusedQkvNorm { .. })),
            count(g, |o| *o == Op::FusedFFN),
        )
    };
    let (m2, m3) = (qwen2(), qwen3());
    let dec_gpu = decode(gpu_cparams(true)).unwrap();
    assert_eq!(fused(&m2.build_graph(&dec_gpu)), (2, 0, 2));
    assert_eq!(fused(&m3.build_graph(&dec_gpu)), (0, 2, 2));
    for p in [
        decode(cpu_cparams(64)).unwrap(),
        decode(gpu_cparams(false)).unwrap(),
        prefill(4, 1, gpu_cparams(true)).unwrap(),
        prefill(4, 4, gpu_cparams(true)).unwrap(),
    ] {
        assert_eq!(fused(&m2.build_graph(&p)), (0, 0, 0), "{p:?}");
        assert_eq!(fused(&m3.build_graph(&p)), (0, 0, 0), "{p:?}");
    }
    // The flags decide, not the kind of backend: the CPU executes the same fusions.
    let dec_cpu = decode(CParams {
        gpu: false,
        fuse_qkv: true,
        fuse_ffn: true,
        ..cpu_cparams(64)
    })
    .unwrap();
    assert_eq!(fused(&m2.build_graph(&dec_cpu)), (2, 0, 2));
    assert_eq!(fused(&m3.build_graph(&dec_cpu)), (0, 2, 2));
    // Each flag gates its own fusion.
    let only_ffn = decode(CParams {
        fuse_qkv: false,
        ..gpu_cparams(true)
    })
    .unwrap();
    assert_eq!(fused(&m2.build_graph(&only_ffn)), (0, 0, 2));
    let only_qkv = decode(CParams {
        fuse_ffn: false,
        ..gpu_cparams(true)
    })
    .unwrap();
    assert_eq!(fused(&m3.build_graph(&only_qkv)), (0, 2, 0));
}

#[test]
fn fused_decode_graphs_are_wired_to_registered_concats() {
    let m = qwen2();
    let concat: BTreeSet<String> = m.concat_weights().into_iter().map(|c| c.name).collect();
    assert_eq!(
        concat,
        BTreeSet::from(
            [
                "blk.0.attn_qkv.weight",
                "blk.0.ffn_gate_up.weight",
                "blk.1.attn_qkv.weight",
                "blk.1.ffn_gate_up.weight"
            ]
            .map(String::from)
        )
    );
    let g = m.build_graph(&decode(gpu_cparams(true)).unwrap());
    g.validate().unwrap();
    let qkv = node(&g, "qkv_fused-1");
    assert_eq!(qkv.op, Op::FusedQKV { layer: 1 });
    assert_eq!(qkv.out_shape, [128 + 2 * 64, 1, 1, 1]);
    match &qkv.meta {
        NodeMeta::FusedQkv(f) => {
            assert!(concat.contains(&f.qkv_weight));
            assert_eq!(f.q_bias.as_deref(), Some("blk.1.attn_q.bias"));
            assert_eq!((f.nqt, f.nkt, f.n_ctx, f.kv_elems), (128, 64, 64, 64 * 64));
        }
        other => panic!("{other:?}"),
    }
    // Attention reads q from the fused buffer; no separate store exists.
    assert_eq!(node(&g, "kqv_out-1").src[0], qkv.id);
    assert_eq!(count(&g, |o| matches!(o, Op::KvcacheStore { .. })), 0);
    assert_eq!(count(&g, |o| matches!(o, Op::RoPE { .. })), 0);
    let ffn = node(&g, "ffn_fused-0");
    assert_eq!(ffn.out_shape, [512, 1, 1, 1]);
    match &ffn.meta {
        NodeMeta::FusedFfn(f) => assert!(concat.contains(&f.concat_weight)),
        other => panic!("{other:?}"),
    }
    assert_eq!(node(&g, "ffn_out-0").src, vec![ffn.id]);

    let g3 = qwen3().build_graph(&decode(gpu_cparams(true)).unwrap());
    match &node(&g3, "qkv_fused-0").meta {
        NodeMeta::FusedQkvNorm(f) => {
            assert_eq!(f.q_norm, "blk.0.attn_q_norm.weight");
            assert_eq!(f.k_norm, "blk.0.attn_k_norm.weight");
            assert_eq!((f.nqt, f.nkt), (256, 128));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn llama_ropes_adjacent_pairs_with_its_frequency_factors_and_fuses_only_without_them() {
    let plain = tiny(&TinySpec::llama(GgmlType::F32, 1));
    let scaled = tiny(&TinySpec {
        rope_freqs: true,
        ..TinySpec::llama(GgmlType::F32, 1)
    });
    let p = prefill(3, 3, cpu_cparams(64)).unwrap();
    for (m, factors) in [(&plain, None), (&scaled, Some("rope_freqs.weight"))] {
        let g = m.build_graph(&p);
        g.validate().unwrap();
        for name in ["Qcur_rope-0", "Kcur_rope-1"] {
            let n = node(&g, name);
            assert_eq!(
                n.op,
                Op::RoPE {
                    style: RopeStyle::Interleaved,
                    freq_factors: factors.is_some(),
                },
                "{name}"
            );
            match &n.meta {
                NodeMeta::Rope(r) => assert_eq!(r.freq_factors.as_deref(), factors, "{name}"),
                other => panic!("{name}: {other:?}"),
            }
        }
        // No biases, no q/k norms.
        assert_eq!(count(&g, |o| matches!(o, Op::QkNorm { .. })), 0);
        match &node(&g, "Qcur-0").meta {
            NodeMeta::MatMul(mm) => assert_eq!(mm.bias_name, None),
            other => panic!("{other:?}"),
        }
    }
    // The fused QKV kernels have no frequency-factor term: Llama 3 files keep them off.
    let dec_gpu = decode(gpu_cparams(true)).unwrap();
    let qkv = |g: &ComputeGraph| count(g, |o| matches!(o, Op::FusedQKV { .. }));
    assert_eq!(qkv(&plain.build_graph(&dec_gpu)), 2);
    assert_eq!(qkv(&scaled.build_graph(&dec_gpu)), 0);
}
