//! Allocator contract: build-order liveness, pinned inputs, in-place aliasing,
//! dead nodes, and KV regions that survive rebuilds.

mod common;

use common::*;
use minfer_graph::testing::RefBackend;
use minfer_graph::*;

fn all_on(g: &mut ComputeGraph, b: Backend) {
    for n in &mut g.nodes {
        n.backend.get_or_insert(b);
    }
}

#[test]
fn sourceless_kv_load_built_after_an_input_does_not_take_its_buffer() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [4, 8, 1, 1], DType::F32);
    let early = b.input("early", [4, 8, 1, 1], DType::F32);
    let t = b.silu(early);
    // Kahn order would hoist this source-less load ahead of the silu above.
    let kv = b.kvcache_load(0, 4, 8, 1, None);
    let pad = b.add(t, t);
    let late = b.add(pad, x); // x's only reader comes last
    b.output(late);
    let mut g = b.build();
    all_on(&mut g, Backend::CPU);
    assert_eq!(g.topo_order().unwrap()[..3], [x, early, kv]);

    let mut alloc = cpu_only();
    alloc.alloc_graph(&g).unwrap();
    let xb = alloc.node_buffer(x).unwrap();
    for n in [early, t, kv, pad, late] {
        assert_ne!(
            alloc.node_buffer(n),
            Some(xb),
            "node {n} took the input buffer"
        );
    }
    assert_eq!(
        alloc.node_buffer(kv).unwrap().id,
        alloc.kv_region(0).unwrap().k
    );

    alloc.fill_input(&g, "x", &[1.0; 32]).unwrap();
    alloc.fill_input(&g, "early", &[0.0; 32]).unwrap();
    BackendScheduler::new().execute(&g, &mut alloc).unwrap();
    // silu(0) + silu(0) + 1 == 1 only if x survived until its reader.
    assert_eq!(alloc.get_buffer(late).unwrap(), &[1.0; 32]);
}

#[test]
fn two_inputs_never_share_a_buffer() {
    let mut b = GraphBuilder::new();
    let a = b.input("a", [4, 1, 1, 1], DType::F32);
    let s = b.silu(a);
    let d = b.add(s, s); // a is dead in liveness terms from here on
    let later = b.input("b", [4, 1, 1, 1], DType::F32);
    let out = b.add(d, later);
    b.output(out);
    let mut g = b.build();
    all_on(&mut g, Backend::CPU);
    let mut alloc = cpu_only();
    alloc.alloc_graph(&g).unwrap();
    let (ab, bb) = (
        alloc.node_buffer(a).unwrap(),
        alloc.node_buffer(later).unwrap(),
    );
    assert_ne!(ab, bb);

    alloc.fill_input(&g, "a", &[0.0; 4]).unwrap();
    alloc.fill_input(&g, "b", &[2.0, 3.0, 4.0, 5.0]).unwrap();
    BackendScheduler::new().execute(&g, &mut alloc).unwrap();
    assert_eq!(alloc.get_buffer(out).unwrap(), &[2.0, 3.0, 4.0, 5.0]);
    // The input is still intact for a reused graph.
    assert_eq!(alloc.get_buffer(a).unwrap(), &[0.0; 4]);
}

#[test]
fn aliasing_only_for_a_sole_consumer_on_the_same_backend() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [4, 1, 1, 1], DType::F32);
    let sole = b.add(x, x);
    let s1 = b.silu(sole); // sole consumer, same backend: aliases
    let shared = b.add(x, x);
    let s2 = b.silu(shared); // shared has two readers: no alias
    let keep = b.add(shared, s2);
    let remote = b.add(x, x);
    let s3 = b.silu(remote); // produced on the CPU, silu on the device: no alias
    let on_input = b.silu(x); // never clobber a host-filled input
    let sum = b.add(s1, keep);
    let sum = b.add(sum, s3);
    let sum = b.add(sum, on_input);
    b.output(sum);
    b.set_backend(s3, Backend::METAL);
    let mut g = b.build();
    all_on(&mut g, Backend::CPU);

    let mut alloc = split_alloc();
    alloc.alloc_graph(&g).unwrap();
    let buf = |n| alloc.node_buffer(n).unwrap();
    assert_eq!(buf(s1), buf(sole));
    assert_ne!(buf(s2), buf(shared));
    assert_ne!(buf(s3), buf(remote));
    assert_eq!(buf(s3).backend, Backend::METAL);
    assert_ne!(buf(on_input), buf(x));

    let xs = [0.5, -1.0, 2.0, 0.0];
    alloc.fill_input(&g, "x", &xs).unwrap();
    BackendScheduler::new().execute(&g, &mut alloc).unwrap();
    let silu = |v: f32| v / (1.0 + (-v).exp());
    let want: Vec<f32> = xs
        .iter()
        .map(|&v| silu(v + v) + ((v + v) + silu(v + v)) + silu(v + v) + silu(v))
        .collect();
    let got = alloc.copy_to_cpu(sum).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "{g} vs {w}");
    }
}

#[test]
fn gelu_and_softcap_alias_a_sole_producer_like_silu() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [4, 1, 1, 1], DType::F32);
    let y = b.add(x, x);
    let g1 = b.gelu(y);
    let c = b.softcap(g1, 30.0);
    b.output(c);
    let mut g = b.build();
    all_on(&mut g, Backend::CPU);
    let mut alloc = split_alloc();
    alloc.alloc_graph(&g).unwrap();
    let buf = |n| alloc.node_buffer(n).unwrap();
    assert_eq!(buf(g1), buf(y));
    assert_eq!(buf(c), buf(g1));
}

#[test]
fn dead_nodes_get_no_buffer() {
    let mut g = build_block(&params(2, false));
    let alloc_for = cpu_only();
    let mut sched = BackendScheduler::new();
    sched.assign_backends(&mut g, &alloc_for);
    assert_eq!(FusionPass::new().run(&mut g, &alloc_for), 1);
    let dead = (0..g.nodes.len()).find(|&i| g.is_dead(i)).unwrap();
    let mut alloc = alloc_for;
    alloc.alloc_graph(&g).unwrap();
    assert_eq!(alloc.node_buffer(dead), None);
}

#[test]
fn kv_regions_keep_their_contents_across_a_prefill_to_decode_rebuild() {
    let mut cache = GraphCache::new(split_alloc());
    let mut sched = BackendScheduler::new();
    ensure(&mut cache, &mut sched, &params(3, false));
    let prefill_uid = cache.graph().unwrap().uid;
    run(&mut cache, &sched, &[5, 6, 7], &[0, 1, 2]).unwrap();
    let (k0, v0) = cache.alloc_mut().copy_kv_to_cpu(0).unwrap();
    assert_eq!(k0.len(), NKT * N_CTX);
    assert!(k0[..3 * NKT].iter().any(|&x| x != 0.0));
    assert!(k0[3 * NKT..].iter().all(|&x| x == 0.0));

    let decode = params(1, false);
    assert!(!cache.try_reuse(&decode));
    ensure(&mut cache, &mut sched, &decode);
    assert!(cache.graph().unwrap().uid > prefill_uid);
    assert_eq!(cache.counters().builds, 2);
    assert_eq!(
        cache.alloc_mut().copy_kv_to_cpu(0).unwrap(),
        (k0.clone(), v0.clone())
    );

    let logits = run(&mut cache, &sched, &[8], &[3]).unwrap();
    let (k1, v1) = cache.alloc_mut().copy_kv_to_cpu(0).unwrap();
    assert_eq!(k1[..3 * NKT], k0[..3 * NKT]);
    assert_eq!(v1[..3 * NKT], v0[..3 * NKT]);
    assert!(k1[3 * NKT..4 * NKT].iter().any(|&x| x != 0.0));

    // The decode step saw the prefill KV: a 4-token prefill ends on the same logits.
    let mut full = GraphCache::new(split_alloc());
    let mut fs = BackendScheduler::new();
    ensure(&mut full, &mut fs, &params(4, false));
    let all = run(&mut full, &fs, &[5, 6, 7, 8], &[0, 1, 2, 3]).unwrap();
    for (a, b) in logits.iter().zip(&all[3 * VOCAB..]) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

#[test]
fn host_fill_errors_are_typed() {
    let g = build_block(&params(2, false));
    let mut alloc = cpu_only();
    alloc.alloc_graph(&g).unwrap();
    assert!(matches!(
        alloc.fill_input(&g, "nope", &[]),
        Err(GraphError::UnknownInput(n)) if n == "nope"
    ));
    let e = alloc
        .fill_input_i32(&g, "positions", &[0, 1, 2])
        .unwrap_err();
    assert_eq!(e.to_string(), "input 'positions' takes 2 values, got 3");
    // I32 values are stored as bit patterns and read back exactly.
    alloc
        .fill_input_i32(&g, "positions", &[-7, 123_456_789])
        .unwrap();
    let id = g.input_by_name("positions").unwrap();
    let back: Vec<i32> = alloc
        .get_buffer(id)
        .unwrap()
        .iter()
        .map(|v| v.to_bits() as i32)
        .collect();
    assert_eq!(back, vec![-7, 123_456_789]);
}

#[test]
fn rebuilds_recycle_the_pool_instead_of_growing_it() {
    let mut alloc = cpu_only();
    let g = build_block(&params(2, false));
    alloc.alloc_graph(&g).unwrap();
    let first = alloc.pool_len(Backend::CPU).unwrap();
    for _ in 0..3 {
        alloc.alloc_graph(&g).unwrap();
    }
    assert_eq!(alloc.pool_len(Backend::CPU).unwrap(), first);
    assert!(matches!(
        GraphAllocator::new(vec![
            Box::new(RefBackend::cpu()),
            Box::new(RefBackend::cpu())
        ]),
        Err(GraphError::DuplicateBackend(Backend::CPU))
    ));
}

/// Pool sizes of both backends of a split allocator.
fn pools(alloc: &GraphAllocator) -> (usize, usize) {
    (
        alloc.pool_len(Backend::CPU).unwrap(),
        alloc.pool_len(Backend::METAL).unwrap(),
    )
}

#[test]
fn kv_regions_outlive_rebuilds_and_clears_with_the_same_ids() {
    let mut cache = GraphCache::new(cpu_only());
    let mut sched = BackendScheduler::new();
    let (prefill, decode) = (params(4, false), params(1, false));
    // Warm-up: both graphs' buffers exist once this has run.
    for (p, tokens, pos) in [
        (&prefill, &[3, 1, 4, 1][..], &[0, 1, 2, 3][..]),
        (&decode, &[5], &[4]),
    ] {
        ensure(&mut cache, &mut sched, p);
        run(&mut cache, &sched, tokens, pos).unwrap();
    }
    let region = cache.alloc().kv_region(0).unwrap();
    let pool = cache.alloc().pool_len(Backend::CPU).unwrap();
    for round in 0..200 {
        // Prefill, decode, clear: what a request and a new conversation do.
        ensure(&mut cache, &mut sched, &prefill);
        run(&mut cache, &sched, &[3, 1, 4, 1], &[0, 1, 2, 3]).unwrap();
        ensure(&mut cache, &mut sched, &decode);
        run(&mut cache, &sched, &[5], &[4]).unwrap();
        cache.alloc_mut().reset_kv().unwrap();
        assert_eq!(cache.alloc().kv_region(0), Some(region), "round {round}");
        let (k, v) = cache.alloc_mut().copy_kv_to_cpu(0).unwrap();
        assert!(k.iter().chain(&v).all(|&x| x == 0.0), "cleared in place");
        assert_eq!(
            cache.alloc().pool_len(Backend::CPU).unwrap(),
            pool,
            "round {round}"
        );
    }
    let kv_names = cache
        .alloc()
        .persistent
        .iter()
        .filter(|p| p.name.starts_with("kv."))
        .count();
    assert_eq!(kv_names, 2, "one K and one V region for the one layer");
}

#[test]
fn rebuilding_a_split_graph_reuses_its_staging_buffers() {
    let p = params(4, false);
    let mut cache = GraphCache::new(split_alloc());
    let mut sched = BackendScheduler::new();
    ensure(&mut cache, &mut sched, &p);
    let first = run(&mut cache, &sched, &[3, 1, 4, 1], &[0, 1, 2, 3]).unwrap();
    // Another shape in between, so each return to `p` is a real rebuild.
    let mut sizes = (0, 0);
    for round in 0..52 {
        for nt in [1, 4] {
            ensure(&mut cache, &mut sched, &params(nt, false));
            let tokens = &[3, 1, 4, 1][..nt];
            let pos = &[0, 1, 2, 3][..nt];
            let out = run(&mut cache, &sched, tokens, pos).unwrap();
            if nt == 4 {
                assert_eq!(out, first, "round {round}");
            }
        }
        // Two rounds to settle which idle buffers each pool keeps, then none grows.
        if round == 1 {
            sizes = pools(cache.alloc());
        }
        if round > 1 {
            assert_eq!(pools(cache.alloc()), sizes, "round {round}");
        }
    }
    assert_eq!(cache.counters().builds, 105);
}

#[test]
fn a_persistent_buffer_is_created_once_per_name() {
    let mut alloc = cpu_only();
    let a = alloc.alloc_persistent("state", Backend::CPU, 8).unwrap();
    let pool = alloc.pool_len(Backend::CPU).unwrap();
    for _ in 0..100 {
        assert_eq!(alloc.alloc_persistent("state", Backend::CPU, 8).unwrap(), a);
    }
    assert_eq!(alloc.pool_len(Backend::CPU).unwrap(), pool);
    assert_eq!(alloc.persistent.len(), 1);
    let e = alloc
        .alloc_persistent("state", Backend::CPU, 9)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'state'") && e.contains("8") && e.contains("9"),
        "{e}"
    );
    let other = alloc.alloc_persistent("other", Backend::CPU, 8).unwrap();
    assert_ne!(other, a);
}

#[test]
fn graphs_of_ever_new_shapes_keep_the_pool_bounded() {
    let mut sched = BackendScheduler::new();
    // The largest graph alone: what one pass needs at most.
    let mut alone = GraphCache::new(cpu_only());
    ensure(&mut alone, &mut sched, &params(N_CTX, false));
    let largest = alone.alloc().pool_elems(Backend::CPU).unwrap();
    assert!(largest > 0);

    let mut cache = GraphCache::new(cpu_only());
    for round in 0..3 {
        for nt in (1..=N_CTX).rev().chain(1..=N_CTX) {
            ensure(&mut cache, &mut sched, &params(nt, false));
            let tokens: Vec<u32> = (0..nt as u32).map(|t| t % VOCAB as u32).collect();
            let pos: Vec<i32> = (0..nt as i32).collect();
            run(&mut cache, &sched, &tokens, &pos).unwrap();
            let held = cache.alloc().pool_elems(Backend::CPU).unwrap();
            // Idle buffers never exceed the buffers in use, which never exceed `largest`.
            assert!(
                held <= 2 * largest,
                "round {round}, {nt} tokens: the pool holds {held} elements, the largest graph needs {largest}"
            );
        }
    }
}
