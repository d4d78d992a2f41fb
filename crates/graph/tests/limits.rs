//! Device buffer limits: the scheduler places no node on a backend whose buffers it
//! exceeds (saying why in the trace), and the allocator refuses an oversized buffer
//! when the graph is allocated, never later at execution or read-back.

mod common;

use common::*;
use minfer_graph::testing::RefBackend;
use minfer_graph::*;

const TOKENS: [u32; 4] = [3, 1, 4, 1];
const POS: [i32; 4] = [0, 1, 2, 3];

/// The split allocator with the device holding no buffer above `cap` f32s.
fn capped(cap: usize) -> GraphAllocator {
    split_alloc_with(
        RefBackend::test_device()
            .claiming(DEVICE_OPS)
            .with_max_buffer_elems(cap),
    )
}

/// The largest of a node's output and inputs, in f32s.
fn largest(g: &ComputeGraph, n: &CNode) -> usize {
    n.src
        .iter()
        .map(|&s| g.nodes[s].n_elements())
        .chain([n.n_elements()])
        .max()
        .unwrap_or(0)
}

#[test]
fn nodes_over_the_device_limit_are_placed_on_the_cpu_with_the_reason() {
    let p = params(4, false);
    let logits_elems = 4 * VOCAB;
    let cap = logits_elems - 1;

    // Unlimited, the logits matmul runs on the device.
    let mut free = build_block(&p);
    BackendScheduler::new().assign_backends(&mut free, &split_alloc());
    let head = free.outputs[0];
    assert_eq!(free.nodes[head].backend, Some(Backend::METAL));

    let mut g = build_block(&p);
    let mut alloc = capped(cap);
    let mut sched = BackendScheduler::new();
    sched.assign_backends(&mut g, &alloc);
    let mut moved = 0;
    for (pl, before) in sched.placements().iter().zip(&free.nodes) {
        let n = &g.nodes[pl.node];
        if largest(&g, n) > cap && before.backend == Some(Backend::METAL) {
            moved += 1;
            assert_eq!(pl.backend, Backend::CPU, "{}", n.name);
            assert_eq!(pl.too_large.len(), 1, "{}", n.name);
            assert_eq!(pl.too_large[0].0, Backend::METAL);
        } else {
            assert_eq!(Some(pl.backend), before.backend, "{}", n.name);
            assert!(pl.too_large.is_empty(), "{}", n.name);
        }
    }
    assert!(moved >= 1 && g.nodes[head].backend == Some(Backend::CPU));
    assert!(
        g.nodes.iter().any(|n| n.backend == Some(Backend::METAL)),
        "the nodes that fit stay on the device"
    );

    let t = sched.trace_report(&g, &sched.split_graph(&g));
    let want = format!(
        "logits (matmul) -> cpu: capability (declined by metal); metal cannot hold its \
         output: a buffer of {logits_elems} f32s ({} bytes) exceeds the test device's \
         largest buffer of {cap} f32s ({} bytes)",
        logits_elems * 4,
        cap * 4
    );
    assert!(t.contains(&want), "{t}");

    // And the graph runs, matching the all-CPU result bit for bit.
    alloc.alloc_graph(&g).expect("every buffer fits");
    alloc.fill_input_u32(&g, "token_ids", &TOKENS).unwrap();
    alloc.fill_input_i32(&g, "positions", &POS).unwrap();
    sched.execute(&g, &mut alloc).unwrap();
    let got = alloc.copy_to_cpu(head).unwrap();
    let mut c = cpu_only();
    let mut plain = build_block(&p);
    sched.assign_backends(&mut plain, &c);
    c.alloc_graph(&plain).unwrap();
    c.fill_input_u32(&plain, "token_ids", &TOKENS).unwrap();
    c.fill_input_i32(&plain, "positions", &POS).unwrap();
    sched.execute(&plain, &mut c).unwrap();
    let want = c.copy_to_cpu(plain.outputs[0]).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&want));
}

#[test]
fn an_oversized_buffer_is_refused_when_the_graph_is_allocated() {
    let p = params(4, false);
    let mut g = build_block(&p);
    let head = g.outputs[0];
    // Placed by hand past the limit: the allocator, not the read-back, says so.
    g.nodes[head].backend = Some(Backend::METAL);
    let mut alloc = capped(4 * VOCAB - 1);
    BackendScheduler::new().assign_backends(&mut g, &alloc);
    let e = alloc.alloc_graph(&g).expect_err("oversized output");
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("allocating node {head} 'logits' (matmul)"))
            && msg.contains("exceeds the test device's largest buffer"),
        "{msg}"
    );
}

#[test]
fn a_kv_region_over_the_limit_is_refused_naming_the_layer() {
    let mut alloc = capped(15);
    let e = alloc
        .ensure_kv(3, Backend::METAL, 16)
        .expect_err("region over the limit");
    assert!(e.to_string().contains("allocating KV layer 3 K"), "{e}");
    let r = alloc.ensure_kv(3, Backend::METAL, 15).expect("fits");
    assert_eq!(r.backend, Backend::METAL);
}

#[test]
fn the_size_check_names_backend_size_and_limit() {
    assert_eq!(check_buffer_size("wgpu", 10, 10), Ok(()));
    assert_eq!(
        check_buffer_size("wgpu", 77_791_232, 33_554_432).unwrap_err(),
        "a buffer of 77791232 f32s (311.2 MB) exceeds the wgpu device's largest buffer of \
         33554432 f32s (134.2 MB)"
    );
}
