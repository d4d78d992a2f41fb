//! A panic inside a kernel, on a thread-pool thread, does not poison the engine: the
//! buffers the node had moved out go back into the pool, the next step rebuilds its
//! graph, and that step's logits are bitwise those of a fresh engine.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::Op;
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::{Engine, EngineOptions, MultiEngine, SeqStep};

fn opts(threads: usize, n_ctx: usize) -> EngineOptions {
    EngineOptions {
        n_threads: threads,
        n_ctx: Some(n_ctx),
        backend: None,
        n_batch: 512,
        ..EngineOptions::default()
    }
}

fn tiny() -> Arc<GgufFile> {
    let spec = TinySpec::qwen2(GgmlType::Q8_0, 75);
    Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec).expect("writer")).expect("reader"))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const PROMPT: [u32; 7] = [11, 250, 3, 499, 17, 42, 8];

/// Runs `f`, which must panic with the injected kernel fault.
fn expect_kernel_panic<T>(f: impl FnOnce() -> T) {
    let payload = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(_) => panic!("the armed node did not panic"),
        Err(p) => p,
    };
    let text = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(text.contains("injected kernel fault"), "{text}");
}

#[test]
fn a_kernel_panic_leaves_the_next_prefill_and_decode_bitwise_fresh() {
    let file = tiny();
    let mut fresh = Engine::from_arc(Arc::clone(&file), &opts(2, 32)).unwrap();
    let want_prefill = fresh.forward(&PROMPT, 0, 1).unwrap();
    let want_decode = fresh.forward(&[5], PROMPT.len(), 1).unwrap();

    let mut e = Engine::from_arc(Arc::clone(&file), &opts(2, 32)).unwrap();
    e.forward(&PROMPT, 0, 1).unwrap();
    e.forward(&[5], PROMPT.len(), 1).unwrap();
    let pool = e.pool_len();
    // Nodes the kernels run in a decode step (prefill runs the same ones, wider).
    let g = e.preview_graph(1, 1).unwrap();
    let kernels = g
        .nodes
        .iter()
        .filter(|n| !g.is_dead(n.id) && !matches!(n.op, Op::Input | Op::KvcacheLoad { .. }))
        .count();
    assert!(kernels > 20, "{kernels}");
    // The first, the last and nodes in between (KV stores and attention among them).
    for nth in (1..=kernels).step_by(7).chain([kernels]) {
        e.reset();
        e.inject_kernel_panic(nth);
        expect_kernel_panic(|| e.forward(&PROMPT, 0, 1));
        assert_eq!(e.seq_len(), 0, "a failed prefill holds no positions");
        let got = e.forward(&PROMPT, 0, 1).expect("the engine recovers");
        assert!(
            bits(&got) == bits(&want_prefill),
            "prefill after a panic at node {nth}"
        );
        // A panic in a decode step keeps the prompt: the step is simply run again.
        e.inject_kernel_panic(nth);
        expect_kernel_panic(|| e.forward(&[5], PROMPT.len(), 1));
        assert_eq!(e.seq_len(), PROMPT.len());
        let got = e.forward(&[5], PROMPT.len(), 1).expect("decode recovers");
        assert!(
            bits(&got) == bits(&want_decode),
            "decode after a panic at node {nth}"
        );
    }
    assert_eq!(
        e.pool_len(),
        pool,
        "recovery recycles the pool instead of growing it"
    );
}

#[test]
fn a_kernel_panic_in_one_step_leaves_other_slots_intact() {
    let file = tiny();
    let a: Vec<u32> = (0..9).map(|i| (i * 29 + 3) % 500).collect();
    let b: Vec<u32> = vec![42, 17, 99];
    let step = |slot, tokens: &[u32], pos0| SeqStep {
        slot,
        tokens: tokens.to_vec(),
        pos0,
        n_out: 1,
    };
    let mut reference = MultiEngine::from_shared(Arc::clone(&file), &opts(2, 64), 2).unwrap();
    reference.step(&[step(0, &a, 0)]).unwrap();
    let want_b = reference.step(&[step(1, &b, 0)]).unwrap();
    let want_a = reference.step(&[step(0, &[7], a.len())]).unwrap();

    let mut m = MultiEngine::from_shared(Arc::clone(&file), &opts(2, 64), 2).unwrap();
    m.step(&[step(0, &a, 0)]).unwrap();
    m.inject_kernel_panic(10);
    expect_kernel_panic(|| m.step(&[step(1, &b, 0)]));
    assert_eq!(m.slot_len(1).unwrap(), 0, "the failed slot holds nothing");
    assert_eq!(
        m.slot_len(0).unwrap(),
        a.len(),
        "the other slot keeps its sequence"
    );
    // The failed request, run again, and the other slot's continuation match a run in
    // which nothing failed.
    let got_b = m.step(&[step(1, &b, 0)]).unwrap();
    assert!(
        bits(&got_b[0]) == bits(&want_b[0]),
        "slot 1 after the panic"
    );
    let got_a = m.step(&[step(0, &[7], a.len())]).unwrap();
    assert!(
        bits(&got_a[0]) == bits(&want_a[0]),
        "slot 0 after the panic"
    );
}
