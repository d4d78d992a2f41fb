//! The per-node capture in the scheduler, with real numbers from the reference backends:
//! each node is read right after it runs (before a later node reuses its buffer), the same
//! on one backend and across a split graph, and nothing is recorded while it is off.

mod common;

use std::collections::HashMap;

use common::*;
use minfer_graph::testing::RefBackend;
use minfer_graph::trace::NodeTrace;
use minfer_graph::*;

const TOKENS: [u32; 4] = [3, 1, 4, 1];
const POS: [i32; 4] = [0, 1, 2, 3];

fn traced(alloc: GraphAllocator, max_values: usize) -> (ComputeGraph, Vec<NodeTrace>, Vec<f32>) {
    let p = params(4, false);
    let mut cache = GraphCache::new(alloc);
    let mut sched = BackendScheduler::new();
    ensure(&mut cache, &mut sched, &p);
    sched.set_trace(Some(max_values));
    let logits = run(&mut cache, &sched, &TOKENS, &POS).unwrap();
    (cache.graph().unwrap().clone(), sched.take_trace(), logits)
}

#[test]
fn every_node_is_captured_when_it_runs_not_after_its_buffer_is_reused() {
    let (g, nodes, logits) = traced(cpu_only(), 4096);
    let by_id: HashMap<usize, &NodeTrace> = nodes.iter().map(|n| (n.id, n)).collect();
    // Live nodes in build order, KV views and stores left out.
    let want: Vec<usize> = g
        .nodes
        .iter()
        .filter(|n| !g.is_dead(n.id) && minfer_graph::trace::is_captured(n))
        .map(|n| n.id)
        .collect();
    assert_eq!(nodes.iter().map(|n| n.id).collect::<Vec<_>>(), want);
    // Each add is the sum of its sources as they were when it ran: a capture taken after
    // a later node reused a source's buffer would not add up.
    let mut adds = 0;
    for n in g.nodes.iter().filter(|n| matches!(n.op, Op::Add)) {
        let (Some(out), Some(a), Some(b)) =
            (by_id.get(&n.id), by_id.get(&n.src[0]), by_id.get(&n.src[1]))
        else {
            continue;
        };
        if a.n != out.n || b.n != out.n {
            continue;
        }
        assert_eq!(out.stride, 1, "the whole tensor is sampled");
        for i in 0..out.n {
            assert_eq!(out.values[i], a.values[i] + b.values[i], "{} [{i}]", n.name);
        }
        adds += 1;
    }
    assert!(adds >= 2, "the block has residual adds");
    // The last node is the logits the step returned.
    let last = nodes.last().unwrap();
    assert_eq!(last.id, g.outputs[0]);
    assert_eq!(last.values, logits);
}

#[test]
fn a_split_graph_traces_the_same_values_as_the_cpu_and_the_sample_is_bounded() {
    let (_, cpu, _) = traced(cpu_only(), 5);
    let (_, split, _) = traced(split_alloc(), 5);
    assert_eq!(cpu, split);
    for n in &cpu {
        assert!(n.values.len() <= 5 && n.values.len() == n.n.div_ceil(n.stride));
    }
}

#[test]
fn nothing_is_recorded_while_the_trace_is_off() {
    let p = params(4, false);
    let mut cache = GraphCache::new(cpu_only());
    let mut sched = BackendScheduler::new();
    ensure(&mut cache, &mut sched, &p);
    run(&mut cache, &sched, &TOKENS, &POS).unwrap();
    assert!(sched.take_trace().is_empty());
    sched.set_trace(Some(8));
    run(&mut cache, &sched, &TOKENS, &POS).unwrap();
    assert!(!sched.take_trace().is_empty());
    assert!(sched.take_trace().is_empty(), "taken once");
    sched.set_trace(None);
    run(&mut cache, &sched, &TOKENS, &POS).unwrap();
    assert!(sched.take_trace().is_empty());
}

#[test]
fn a_device_that_stages_traces_the_same_values_with_one_collection_per_split() {
    let collects = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let device = RefBackend::test_device()
        .claiming(DEVICE_OPS)
        .with_staged_trace(collects.clone());
    let (g, staged, _) = traced(split_alloc_with(device), 5);
    let (_, cpu, _) = traced(cpu_only(), 5);
    assert_eq!(
        staged, cpu,
        "staged captures are the host's, in execution order"
    );
    let sched = BackendScheduler::new();
    let device_splits = sched
        .split_graph(&g)
        .iter()
        .filter(|s| s.backend != Backend::CPU)
        .count();
    assert!(device_splits >= 2, "the graph alternates backends");
    assert_eq!(
        collects.load(std::sync::atomic::Ordering::SeqCst),
        device_splits,
        "one collection per device split, none per node"
    );
}

#[test]
fn a_device_that_cannot_stage_fails_the_traced_step_naming_it() {
    let device = RefBackend::test_device()
        .claiming(DEVICE_OPS)
        .hidden_from_trace();
    let p = params(4, false);
    let mut cache = GraphCache::new(split_alloc_with(device));
    let mut sched = BackendScheduler::new();
    ensure(&mut cache, &mut sched, &p);
    run(&mut cache, &sched, &TOKENS, &POS).expect("untraced, it runs");
    sched.set_trace(Some(8));
    let e = run(&mut cache, &sched, &TOKENS, &POS)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("test") && e.contains("stages no trace copies"),
        "{e}"
    );
}
