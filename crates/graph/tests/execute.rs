//! Scheduler and execution: multi-backend splits, reuse, staging, fusion agreement
//! and the error contract, all with real numbers from the reference backends.

mod common;

use common::*;
use minfer_graph::testing::RefBackend;
use minfer_graph::*;

const TOKENS: [u32; 4] = [3, 1, 4, 1];
const POS: [i32; 4] = [0, 1, 2, 3];

#[test]
fn split_graph_reused_three_times_matches_all_cpu_bit_for_bit() {
    let p = params(4, false);

    let mut reference = GraphCache::new(cpu_only());
    let mut rsched = BackendScheduler::new();
    ensure(&mut reference, &mut rsched, &p);
    let expected = run(&mut reference, &rsched, &TOKENS, &POS).unwrap();
    assert_eq!(expected.len(), VOCAB * 4);
    assert!(expected.iter().all(|v| v.is_finite()));
    assert!(expected.iter().any(|&v| v != 0.0));

    let mut cache = GraphCache::new(split_alloc());
    let mut sched = BackendScheduler::new();
    let mut outs = Vec::new();
    for _ in 0..3 {
        ensure(&mut cache, &mut sched, &p);
        outs.push(run(&mut cache, &sched, &TOKENS, &POS).unwrap());
    }
    assert_eq!(
        cache.counters(),
        CacheCounters {
            builds: 1,
            reuses: 2
        }
    );

    let g = cache.graph().unwrap();
    let splits = sched.split_graph(g);
    assert!(
        splits.len() >= 4,
        "expected a real multi-split graph: {splits:?}"
    );
    assert!(splits.iter().any(|s| s.backend == Backend::METAL));
    assert!(splits.iter().any(|s| !s.inputs.is_empty()));

    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for o in &outs {
        assert_eq!(bits(o), bits(&expected));
    }
}

#[test]
fn staging_never_overwrites_the_canonical_buffer() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [4, 1, 1, 1], DType::F32);
    let e = b.rms_norm(x, None, EPS); // CPU: the device does not claim rms_norm
    let s = b.silu(e); // device
    let s2 = b.add(s, e); // device, reads e's staged copy a second time
    b.output(e);
    b.output(s2);
    let mut g = b.build();
    let mut alloc = split_alloc();
    let mut sched = BackendScheduler::new();
    sched.assign_backends(&mut g, &alloc);
    assert_eq!(g.nodes[e].backend, Some(Backend::CPU));
    assert_eq!(g.nodes[s].backend, Some(Backend::METAL));
    alloc.alloc_graph(&g).unwrap();

    let mut results = Vec::new();
    for xs in [
        [1.0, -2.0, 3.0, 0.5],
        [1.0, -2.0, 3.0, 0.5],
        [4.0, 0.0, -1.0, 2.0],
    ] {
        alloc.fill_input(&g, "x", &xs).unwrap();
        sched.execute(&g, &mut alloc).unwrap();
        let staged = alloc.cross_buffer(e, Backend::METAL).expect("staged copy");
        assert_eq!(staged.backend, Backend::METAL);
        assert_ne!(alloc.node_buffer(e), Some(staged));
        assert_eq!(alloc.cross_input(e, Backend::METAL).unwrap(), Some(staged));
        let canonical = alloc.get_buffer(e).unwrap().to_vec();
        let copy = alloc
            .backend(Backend::METAL)
            .unwrap()
            .read_host(staged.id)
            .unwrap()
            .to_vec();
        assert_eq!(canonical, copy);
        let silu = |v: f32| v / (1.0 + (-v).exp());
        let want: Vec<f32> = canonical.iter().map(|&v| silu(v) + v).collect();
        assert_eq!(alloc.copy_to_cpu(s2).unwrap(), want);
        results.push(want);
    }
    assert_eq!(
        results[0], results[1],
        "a reused graph re-executes identically"
    );
    assert_ne!(results[1], results[2], "the staged copy follows new inputs");
}

#[test]
fn split_mismatch_is_an_error_naming_both_backends() {
    let p = params(2, false);
    let mut alloc = cpu_only_plus_device();
    let mut sched = BackendScheduler::new();
    let mut g = build_block(&p);
    for n in &mut g.nodes {
        n.backend = Some(Backend::CPU);
    }
    alloc.alloc_graph(&g).unwrap();
    // Reassigning after allocation puts a CPU buffer under a device split.
    let victim = g.nodes.iter().position(|n| n.op == Op::Silu).unwrap();
    g.nodes[victim].backend = Some(Backend::METAL);
    alloc.fill_input_u32(&g, "token_ids", &[1, 2]).unwrap();
    alloc.fill_input_i32(&g, "positions", &[0, 1]).unwrap();
    let err = sched.execute(&g, &mut alloc).unwrap_err();
    assert!(matches!(err, GraphError::SplitMismatch { id, .. } if id == victim));
    let msg = err.to_string();
    assert!(msg.contains("cpu-ref") && msg.contains("test"), "{msg}");

    // A KV region made on the CPU cannot be written by a store moved to the device.
    sched.assign_backends(&mut g, &alloc); // explicit backends are kept
    let store = g
        .nodes
        .iter()
        .position(|n| matches!(n.op, Op::KvcacheStore { .. }))
        .unwrap();
    g.nodes[victim].backend = Some(Backend::CPU);
    g.nodes[store].backend = Some(Backend::METAL);
    alloc.alloc_graph(&g).unwrap();
    alloc.fill_input_u32(&g, "token_ids", &[1, 2]).unwrap();
    alloc.fill_input_i32(&g, "positions", &[0, 1]).unwrap();
    let msg = sched.execute(&g, &mut alloc).unwrap_err().to_string();
    assert!(msg.contains("KV region") || msg.contains("buffer"), "{msg}");
    assert!(msg.contains("cpu-ref") && msg.contains("test"), "{msg}");
}

fn cpu_only_plus_device() -> GraphAllocator {
    split_alloc_with(RefBackend::test_device().claiming(DEVICE_OPS))
}

#[test]
fn a_failing_kernel_is_an_error_not_a_fallback() {
    let p = params(2, false);
    let mut cache = GraphCache::new(split_alloc_with(
        RefBackend::test_device()
            .claiming(DEVICE_OPS)
            .failing_on("rope"),
    ));
    let mut sched = BackendScheduler::new();
    ensure(&mut cache, &mut sched, &p);
    let err = run(&mut cache, &sched, &[1, 2], &[0, 1]).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, GraphError::Backend { .. }));
    assert!(msg.starts_with("test:") && msg.contains("(rope)"), "{msg}");
}

#[test]
fn each_split_opens_on_its_backend_with_its_real_node_range() {
    let p = params(4, false);
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let device = RefBackend::test_device()
        .claiming(DEVICE_OPS)
        .logging_splits(log.clone());
    let mut cache = GraphCache::new(split_alloc_with(device));
    let mut sched = BackendScheduler::new();
    for _ in 0..2 {
        ensure(&mut cache, &mut sched, &p);
        run(&mut cache, &sched, &TOKENS, &POS).unwrap();
    }
    let g = cache.graph().unwrap();
    let want: Vec<SplitSpan> = sched
        .split_graph(g)
        .iter()
        .enumerate()
        .filter(|(_, s)| s.backend == Backend::METAL)
        .map(|(index, s)| SplitSpan {
            graph: g.uid,
            index,
            nodes: s.node_range,
        })
        .collect();
    assert!(want.len() >= 2, "a multi-split graph: {want:?}");
    // Two executions of the reused graph: the same splits, in order, twice.
    let logged = log.lock().unwrap().clone();
    assert_eq!(logged, [want.clone(), want].concat());
}

#[test]
fn swiglu_fusion_counts_and_fused_paths_agree() {
    // Unfused FFN: the pass folds silu*mul into one SwiGLU on the device.
    let unfused = params(4, false);
    let mut g = build_block(&unfused);
    let alloc = split_alloc();
    let mut sched = BackendScheduler::new();
    sched.assign_backends(&mut g, &alloc);
    assert_eq!(FusionPass::new().run(&mut g.clone(), &alloc), 1);

    // The gate: a device that does not report SwiGLU gets no rewrite.
    let no_fuse = split_alloc_with(
        RefBackend::test_device()
            .claiming(DEVICE_OPS)
            .with_fusion(false),
    );
    let mut g2 = build_block(&unfused);
    sched.assign_backends(&mut g2, &no_fuse);
    assert_eq!(FusionPass::new().run(&mut g2, &no_fuse), 0);
    assert!(g2.nodes.iter().any(|n| n.op == Op::Silu));

    // Both shapes run the pass (deviation 26), then must agree exactly.
    let mut a = GraphCache::new(split_alloc());
    let mut sa = BackendScheduler::new();
    assert_eq!(ensure(&mut a, &mut sa, &unfused), 1);
    let dead = a.graph().unwrap().nodes.len() - a.graph().unwrap().live_count();
    assert_eq!(dead, 1, "the folded silu is dead");
    let out_a = run(&mut a, &sa, &TOKENS, &POS).unwrap();

    let mut b = GraphCache::new(split_alloc());
    let mut sb = BackendScheduler::new();
    assert_eq!(ensure(&mut b, &mut sb, &params(4, true)), 0);
    assert!(b
        .graph()
        .unwrap()
        .nodes
        .iter()
        .any(|n| n.op == Op::FusedFFN));
    let out_b = run(&mut b, &sb, &TOKENS, &POS).unwrap();
    assert_eq!(out_a, out_b);

    // And the rewritten graph agrees with the two-kernel form on the reference CPU.
    let mut c = cpu_only();
    let mut plain = build_block(&unfused);
    sched.assign_backends(&mut plain, &c);
    c.alloc_graph(&plain).unwrap();
    c.fill_input_u32(&plain, "token_ids", &TOKENS).unwrap();
    c.fill_input_i32(&plain, "positions", &POS).unwrap();
    sched.execute(&plain, &mut c).unwrap();
    let out_c = c.copy_to_cpu(plain.outputs[0]).unwrap();
    for (x, y) in out_a.iter().zip(&out_c) {
        assert!((x - y).abs() <= 1e-6, "{x} vs {y}");
    }
}

#[test]
fn trace_names_splits_counts_and_reasons() {
    let mut g = build_block(&params(2, false));
    g.nodes.push(CNode {
        id: g.nodes.len(),
        name: "planned".into(),
        op: Op::BatchMatMul,
        src: vec![],
        out_shape: [1, 1, 1, 1],
        out_dtype: DType::F32,
        backend: None,
        meta: NodeMeta::None,
    });
    let alloc = split_alloc();
    let mut sched = BackendScheduler::new();
    sched.assign_backends(&mut g, &alloc);
    let last = sched.placements().last().unwrap().clone();
    assert_eq!(last.backend, Backend::CPU);
    assert_eq!(
        last.reason,
        PlacementReason::Fallback {
            declined: vec![Backend::METAL, Backend::CPU]
        }
    );
    let splits = sched.split_graph(&g);
    let t = sched.trace_report(&g, &splits);
    assert!(t.contains("split 0: cpu nodes [0, "), "{t}");
    assert!(t.contains("per-op: ") && t.contains("matmul=8"), "{t}");
    assert!(t.contains("per-backend: cpu="), "{t}");
    assert!(
        t.contains("(matmul) -> metal: capability (highest priority)"),
        "{t}"
    );
    assert!(
        t.contains("(rms_norm) -> cpu: capability (declined by metal)"),
        "{t}"
    );
    assert!(t.contains("planned (batch_matmul) -> cpu: fallback to cpu (declined by metal, cpu)"));
}

#[test]
fn explicit_span_attention_goes_only_where_spans_are_read() {
    let mut b = GraphBuilder::new();
    let q = b.input("q", [8, 1, 1, 1], DType::F32);
    let pos = b.input("positions", [1, 1, 1, 1], DType::I32);
    let span = b.input("span", [2, 1, 1, 1], DType::I32);
    let kv = b.kvcache_load(0, 4, 8, 1, None);
    let meta = AttnMeta {
        layer: 0,
        n_head: 2,
        n_head_kv: 1,
        hd: 4,
        scale: 0.5,
        n_ctx: 8,
        window: None,
        softcap: None,
        ring: None,
        sinks: None,
        causal: true,
    };
    let a = b.attn(q, kv, pos, Some(span), AttnMode::Gqa, meta);
    b.output(a);
    let mut g = b.build();
    let alloc = split_alloc_with(
        RefBackend::test_device()
            .claiming(&["attn"])
            .with_attn_span(false),
    );
    let mut sched = BackendScheduler::new();
    sched.assign_backends(&mut g, &alloc);
    assert_eq!(g.nodes[a].backend, Some(Backend::CPU));
}

/// A device that takes KV stores and loads but declines this attention (a term its
/// kernel lacks): the layer's store, load and attention all run on the CPU, where the
/// regions then live, and the graph executes.
#[test]
fn a_layer_whose_attention_a_device_declines_keeps_its_kv_nodes_together() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [8, 2, 1, 1], DType::F32);
    let xk = b.input("xk", [4, 2, 1, 1], DType::F32);
    let pos = b.input("positions", [2, 1, 1, 1], DType::I32);
    let q = b.add(x, x);
    let k = b.add(xk, xk);
    let st = b.kvcache_store(0, k, k, pos, 8, None);
    let kv = b.kvcache_load(0, 4, 8, 1, None);
    let meta = AttnMeta {
        layer: 0,
        n_head: 2,
        n_head_kv: 1,
        hd: 4,
        scale: 0.5,
        n_ctx: 8,
        window: None,
        softcap: Some(5.0),
        ring: None,
        sinks: None,
        causal: true,
    };
    let a = b.attn(q, kv, pos, None, AttnMode::Gqa, meta);
    b.output(a);
    let mut g = b.build();
    let mut alloc = split_alloc_with(RefBackend::test_device().claiming(&[
        "add",
        "kvcache_store",
        "kvcache_load",
    ]));
    let mut sched = BackendScheduler::new();
    sched.assign_backends(&mut g, &alloc);
    assert_eq!(g.nodes[q].backend, Some(Backend::METAL));
    for n in [st, kv, a] {
        assert_eq!(
            g.nodes[n].backend,
            Some(Backend::CPU),
            "{}",
            g.nodes[n].name
        );
    }
    assert!(matches!(
        &sched.placements()[st].reason,
        PlacementReason::Capability { declined } if declined == &[Backend::METAL]
    ));
    alloc.alloc_graph(&g).unwrap();
    alloc.fill_input(&g, "x", &[0.25; 16]).unwrap();
    alloc.fill_input(&g, "xk", &[0.5; 8]).unwrap();
    alloc.fill_input_i32(&g, "positions", &[0, 1]).unwrap();
    sched.execute(&g, &mut alloc).unwrap();
}

#[test]
fn fence_removes_backends_from_assignment() {
    let mut g = build_block(&params(1, false));
    let mut alloc = split_alloc();
    alloc.set_fence(Some(vec![Backend::CPU]));
    let mut sched = BackendScheduler::new();
    sched.assign_backends(&mut g, &alloc);
    assert!(g.nodes.iter().all(|n| n.backend == Some(Backend::CPU)));
}
