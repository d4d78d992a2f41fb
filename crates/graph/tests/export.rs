//! Every Op and NodeMeta variant survives the JSON export and import; the DOT
//! export of a scheduled graph colors what the scheduler decided.

mod common;

use common::*;
use minfer_graph::*;

/// Fails to compile when a variant is added without extending `all_ops`.
fn op_index(op: &Op) -> usize {
    match op {
        Op::Input => 0,
        Op::Add => 1,
        Op::Mul => 2,
        Op::Scale(_) => 3,
        Op::Silu => 4,
        Op::Softmax { .. } => 5,
        Op::RmsNorm { .. } => 6,
        Op::QkNorm { .. } => 7,
        Op::MatMul { .. } => 8,
        Op::GetRows => 9,
        Op::RoPE { .. } => 10,
        Op::Attn { .. } => 11,
        Op::KvcacheStore { .. } => 12,
        Op::KvcacheLoad { .. } => 13,
        Op::View { .. } => 14,
        Op::Reshape { .. } => 15,
        Op::Permute { .. } => 16,
        Op::SwiGLU => 17,
        Op::BatchMatMul => 18,
        Op::FusedQKV { .. } => 19,
        Op::QkvBiasRopeStore { .. } => 20,
        Op::FusedFFN => 21,
        Op::FusedQkvNorm { .. } => 22,
        Op::Gelu => 23,
        Op::SoftCap(_) => 24,
        Op::GeGLU => 25,
        Op::TopK { .. } => 26,
        Op::MulMatId => 27,
        Op::MulMatIdSwiGLU => 28,
        Op::MoeSum { .. } => 29,
        Op::MulSigmoid => 30,
        Op::SigmoidGate => 31,
        Op::Slice { .. } => 32,
        Op::SsmConv { .. } => 33,
        Op::DeltaNet { .. } => 34,
        Op::LayerNorm { .. } => 35,
    }
}

/// Same guard for metadata.
fn meta_index(m: &NodeMeta) -> usize {
    match m {
        NodeMeta::None => 0,
        NodeMeta::MatMul(_) => 1,
        NodeMeta::Norm(_) => 2,
        NodeMeta::Rope(_) => 3,
        NodeMeta::Attn(_) => 4,
        NodeMeta::Kvcache(_) => 5,
        NodeMeta::Embed(_) => 6,
        NodeMeta::FusedQkv(_) => 7,
        NodeMeta::QkvBiasRopeStore(_) => 8,
        NodeMeta::FusedFfn(_) => 9,
        NodeMeta::FusedQkvNorm(_) => 10,
        NodeMeta::MatMulId(_) => 11,
        NodeMeta::Recurrent(_) => 12,
    }
}

fn all_ops() -> Vec<Op> {
    vec![
        Op::Input,
        Op::Add,
        Op::Mul,
        Op::Scale(0.125),
        Op::Silu,
        Op::Softmax { dim: 1 },
        Op::RmsNorm { eps: 1e-6 },
        Op::QkNorm {
            hd: 128,
            nh: 16,
            eps: 1e-6,
        },
        Op::MatMul { transpose_b: true },
        Op::GetRows,
        Op::RoPE {
            style: RopeStyle::Interleaved,
            freq_factors: true,
        },
        Op::Attn {
            mode: AttnMode::Flash,
            explicit_span: true,
        },
        Op::KvcacheStore { layer: 3 },
        Op::KvcacheLoad { layer: 4 },
        Op::View {
            offset: 7,
            shape: [1, 2, 3, 4],
        },
        Op::Reshape {
            shape: [4, 3, 2, 1],
        },
        Op::Permute { dims: [1, 0, 3, 2] },
        Op::SwiGLU,
        Op::BatchMatMul,
        Op::FusedQKV { layer: 5 },
        Op::QkvBiasRopeStore { layer: 6 },
        Op::FusedFFN,
        Op::FusedQkvNorm { layer: 7 },
        Op::Gelu,
        Op::SoftCap(30.0),
        Op::GeGLU,
        Op::TopK { k: 8 },
        Op::MulMatId,
        Op::MulMatIdSwiGLU,
        Op::MoeSum { norm: true },
        Op::MulSigmoid,
        Op::SigmoidGate,
        Op::Slice {
            period: 8,
            start: 4,
            len: 4,
        },
        Op::SsmConv { layer: 2 },
        Op::DeltaNet { layer: 2 },
        Op::LayerNorm { eps: 1e-12 },
    ]
}

fn all_metas() -> Vec<NodeMeta> {
    let rope = RoPEMeta {
        n_dims: 64,
        freq_base: 1_000_000.0,
        freq_scale: 0.25,
        n_head: 14,
        hd: 64,
        style: RopeStyle::NonInterleaved,
        freq_factors: None,
        yarn: None,
    };
    vec![
        NodeMeta::None,
        NodeMeta::MatMul(MatMulMeta {
            weight_name: "blk.0.attn_q.weight".into(),
            in_dim: 896,
            out_dim: 896,
            wtype: WeightType::Q5_0,
            bias_name: Some("blk.0.attn_q.bias".into()),
        }),
        NodeMeta::Norm(NormMeta {
            weight_name: Some("token_embd_norm.weight".into()),
            bias_name: Some("token_embd_norm.bias".into()),
        }),
        NodeMeta::Rope(rope.clone()),
        NodeMeta::Attn(AttnMeta {
            layer: 2,
            n_head: 14,
            n_head_kv: 2,
            hd: 64,
            scale: 0.125,
            n_ctx: 4096,
            window: None,
            softcap: None,
            ring: None,
            sinks: None,
            causal: false,
        }),
        NodeMeta::Kvcache(KvcacheMeta {
            layer: 1,
            n_embd: 128,
            n_ctx: 4096,
            n_head_kv: Some(2),
            ring: None,
        }),
        NodeMeta::Embed(EmbedMeta {
            weight_name: "token_embd.weight".into(),
            wtype: WeightType::Q8_0,
            n_embd: 896,
        }),
        NodeMeta::FusedQkv(FusedQkvMeta {
            qkv_weight: "blk.0.attn_qkv".into(),
            wtype: WeightType::Q4_K,
            n_embd: 896,
            nqt: 896,
            nkt: 128,
            q_bias: Some("bq".into()),
            k_bias: None,
            v_bias: Some("bv".into()),
            rope: rope.clone(),
            n_ctx: 4096,
            kv_elems: 128 * 4096,
        }),
        NodeMeta::QkvBiasRopeStore(QkvBiasRopeStoreMeta {
            q_bias: "bq".into(),
            k_bias: "bk".into(),
            v_bias: "bv".into(),
            rope: rope.clone(),
            nqt: 896,
            nkt: 128,
            n_ctx: 4096,
            kv_elems: 128 * 4096,
        }),
        NodeMeta::FusedFfn(FusedFfnMeta {
            gate_weight: "g".into(),
            up_weight: "u".into(),
            concat_weight: "gu".into(),
            wtype: WeightType::Q6_K,
            n_embd: 896,
            nf: 4864,
        }),
        NodeMeta::FusedQkvNorm(FusedQkvNormMeta {
            qkv_weight: "qkv".into(),
            wtype: WeightType(99),
            n_embd: 1024,
            nqt: 2048,
            nkt: 1024,
            q_norm: "qn".into(),
            k_norm: "kn".into(),
            eps: 1e-6,
            rope,
            n_ctx: 40960,
            kv_elems: 1024 * 40960,
        }),
        NodeMeta::MatMulId(MatMulIdMeta {
            weight_name: "blk.0.ffn_up_exps.weight".into(),
            gate_name: Some("blk.0.ffn_gate_exps.weight".into()),
            in_dim: 2048,
            out_dim: 768,
            n_expert: 128,
            wtype: WeightType::Q4_K,
            bias_name: None,
            gate_bias_name: None,
            glu: Glu::Silu,
        }),
        NodeMeta::Recurrent(RecurrentMeta {
            layer: 2,
            slots: 4,
            d_conv: 4,
            channels: 6144,
            s_k: 128,
            h_k: 16,
            s_v: 128,
            h_v: 16,
            conv_weight: "blk.2.ssm_conv1d.weight".into(),
            a_weight: "blk.2.ssm_a".into(),
            dt_bias: Some("blk.2.ssm_dt.bias".into()),
            grouped: true,
            eps: 1e-6,
            chunk: 0,
        }),
    ]
}

#[test]
fn every_op_and_meta_variant_round_trips_through_json() {
    let ops = all_ops();
    let metas = all_metas();
    let mut seen_ops: Vec<usize> = ops.iter().map(op_index).collect();
    seen_ops.dedup();
    assert_eq!(seen_ops, (0..36).collect::<Vec<_>>());
    assert_eq!(
        metas.iter().map(meta_index).collect::<Vec<_>>(),
        (0..13).collect::<Vec<_>>()
    );

    let mut b = GraphBuilder::new();
    let first = b.input("x", [8, 2, 1, 1], DType::I32);
    for (i, op) in ops.into_iter().enumerate().skip(1) {
        let meta = metas[i % metas.len()].clone();
        let dtype = [DType::F32, DType::F16, DType::Q8_0][i % 3];
        let id = b.node(
            &format!("n{i}"),
            op,
            &[i - 1, first],
            [i, 2, 1, 1],
            dtype,
            meta,
        );
        if i % 4 == 0 {
            b.set_backend(
                id,
                [Backend::CPU, Backend::METAL, Backend::CUDA, Backend(9)][i % 16 / 4],
            );
        }
    }
    // Metas the op loop did not pair with anything still get a node each.
    for (j, meta) in metas.into_iter().enumerate() {
        let prev = b.len() - 1;
        b.node("", Op::Add, &[prev], [j + 1, 1, 1, 1], DType::F32, meta);
    }
    let last = b.len() - 1;
    b.output(last);
    let mut g = b.build();
    g.mark_dead(3);

    let text = g.export_json("tiny", "decode");
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["format"], "minfer-graph");
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["model"], "tiny");
    assert_eq!(doc["kind"], "decode");
    assert_eq!(doc["nodes"][6]["op"], "rms_norm");
    assert_eq!(doc["nodes"][6]["detail"], "eps=0.000001");
    assert_eq!(doc["nodes"][4]["backend"], "metal");
    assert_eq!(doc["nodes"][8]["backend"], "cuda");
    assert_eq!(doc["nodes"][12]["backend"], "backend#9");
    assert_eq!(doc["nodes"][16]["backend"], "cpu");
    assert!(doc["nodes"][5]["backend"].is_null());
    assert_eq!(doc["nodes"][1]["meta"]["kind"], "mat_mul");

    let back = import_json_str(&text).unwrap();
    assert_eq!(back.nodes, g.nodes);
    assert_eq!(back.inputs, g.inputs);
    assert_eq!(back.outputs, g.outputs);
    assert_eq!(back.dead, g.dead);
    assert!(back.is_dead(3));
}

/// The optional attention terms survive the round trip, and a plain attention's JSON
/// carries neither key, so documents written before them read back unchanged.
#[test]
fn attention_window_and_softcap_round_trip_and_stay_optional() {
    let meta = AttnMeta {
        layer: 1,
        n_head: 4,
        n_head_kv: 2,
        hd: 32,
        scale: 0.25,
        n_ctx: 64,
        window: Some(4),
        softcap: Some(50.0),
        ring: None,
        sinks: None,
        causal: true,
    };
    let mut b = GraphBuilder::new();
    let x = b.input("x", [128, 1, 1, 1], DType::F32);
    let n = b.node(
        "a",
        Op::Attn {
            mode: AttnMode::Gqa,
            explicit_span: false,
        },
        &[x],
        [128, 1, 1, 1],
        DType::F32,
        NodeMeta::Attn(meta.clone()),
    );
    let plain = AttnMeta {
        window: None,
        softcap: None,
        ..meta
    };
    let p = b.node(
        "p",
        Op::Add,
        &[n],
        [1, 1, 1, 1],
        DType::F32,
        NodeMeta::Attn(plain),
    );
    b.output(p);
    let g = b.build();
    let text = g.export_json("tiny", "decode");
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["nodes"][1]["meta"]["softcap"], 50.0);
    assert_eq!(doc["nodes"][1]["meta"]["window"], 4);
    assert!(doc["nodes"][2]["meta"].get("softcap").is_none());
    assert!(doc["nodes"][2]["meta"].get("window").is_none());
    assert_eq!(import_json_str(&text).unwrap().nodes, g.nodes);
}

#[test]
fn dot_of_a_scheduled_graph_colors_both_backends() {
    let mut g = build_block(&params(2, false));
    let alloc = split_alloc();
    BackendScheduler::new().assign_backends(&mut g, &alloc);
    let dot = g.to_dot();
    assert!(dot.starts_with("digraph minfer {"));
    assert!(dot.contains("fillcolor=lightyellow") && dot.contains("fillcolor=lightblue"));
    assert_eq!(
        dot.matches("doublecircle").count(),
        3,
        "two inputs and the logits"
    );
    let mut buf = Vec::new();
    g.dump_dot(&mut buf).unwrap();
    assert_eq!(String::from_utf8(buf).unwrap(), dot);
}

/// gpt-oss's terms (attention sinks, YaRN, the experts' biases and clamped GLU) survive
/// the round trip, and metas without them carry none of their keys.
#[test]
fn gpt_oss_terms_round_trip_and_stay_optional() {
    let rope = RoPEMeta {
        n_dims: 64,
        freq_base: 150_000.0,
        freq_scale: 1.0 / 32.0,
        n_head: 64,
        hd: 64,
        style: RopeStyle::NonInterleaved,
        freq_factors: None,
        yarn: Some(Yarn {
            ext_factor: 1.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 4096,
        }),
    };
    let attn = AttnMeta {
        layer: 0,
        n_head: 64,
        n_head_kv: 8,
        hd: 64,
        scale: 0.125,
        n_ctx: 4096,
        window: Some(128),
        softcap: None,
        ring: None,
        sinks: Some("blk.0.attn_sinks.weight".into()),
        causal: true,
    };
    let experts = MatMulIdMeta {
        weight_name: "blk.0.ffn_up_exps.weight".into(),
        gate_name: Some("blk.0.ffn_gate_exps.weight".into()),
        in_dim: 2880,
        out_dim: 2880,
        n_expert: 32,
        wtype: WeightType(39),
        bias_name: Some("blk.0.ffn_up_exps.bias".into()),
        gate_bias_name: Some("blk.0.ffn_gate_exps.bias".into()),
        glu: Glu::Oai {
            alpha: 1.702,
            limit: 7.0,
        },
    };
    let metas = [
        NodeMeta::Rope(rope.clone()),
        NodeMeta::Attn(attn.clone()),
        NodeMeta::MatMulId(experts.clone()),
        NodeMeta::Rope(RoPEMeta { yarn: None, ..rope }),
        NodeMeta::Attn(AttnMeta {
            sinks: None,
            ..attn
        }),
        NodeMeta::MatMulId(MatMulIdMeta {
            bias_name: None,
            gate_bias_name: None,
            glu: Glu::Silu,
            ..experts
        }),
    ];
    let mut b = GraphBuilder::new();
    let mut prev = b.input("x", [8, 1, 1, 1], DType::F32);
    for meta in metas {
        prev = b.node("", Op::Add, &[prev], [8, 1, 1, 1], DType::F32, meta);
    }
    b.output(prev);
    let g = b.build();
    let text = g.export_json("tiny", "decode");
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["nodes"][2]["meta"]["sinks"], "blk.0.attn_sinks.weight");
    assert_eq!(doc["nodes"][3]["meta"]["glu"]["kind"], "oai");
    for (i, key) in [(4, "yarn"), (5, "sinks"), (6, "glu"), (6, "bias_name")] {
        assert!(doc["nodes"][i]["meta"].get(key).is_none(), "{i} {key}");
    }
    assert_eq!(import_json_str(&text).unwrap().nodes, g.nodes);
}
