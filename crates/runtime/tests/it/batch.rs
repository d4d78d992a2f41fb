//! Multi-sequence batching: a request's greedy tokens and logits are bitwise the same
//! whether it runs alone or batched with others, slots never see each other's KV, and
//! the matmul kernels compute each token's row independently of the rest of the batch.

use std::sync::Arc;

use minfer_cpu::matmul::{matmul, matmul_repacked, MatmulScratch, QMatrix, RepackedMatrix};
use minfer_cpu::threadpool::ThreadPool;
use minfer_gguf::{GgmlType, GgufFile};
use minfer_models::testing::{golden_models, tiny_model_bytes, TinySpec};
use minfer_runtime::sampling::argmax;
use minfer_runtime::{Engine, EngineError, EngineOptions, MultiEngine, SeqStep};

fn opts(threads: usize, n_ctx: usize, n_batch: usize) -> EngineOptions {
    EngineOptions {
        n_threads: threads,
        n_ctx: Some(n_ctx),
        backend: None,
        n_batch,
        ..EngineOptions::default()
    }
}

fn tiny(spec: &TinySpec) -> Arc<GgufFile> {
    Arc::new(GgufFile::from_bytes(tiny_model_bytes(spec).expect("writer")).expect("reader"))
}

/// The tiny models: the golden set plus Q5_0 and Q4_K/Q5_K weights (repacked Q5_0
/// and the k-quant kernels).
fn tiny_specs() -> Vec<(String, TinySpec)> {
    let mut v: Vec<(String, TinySpec)> = golden_models()
        .into_iter()
        .map(|(n, s)| (n.to_string(), s))
        .collect();
    v.push(("qwen2-q5_0".into(), TinySpec::qwen2(GgmlType::Q5_0, 75)));
    v.push((
        "qwen3-q5_k".into(),
        TinySpec::qwen3_kquant(GgmlType::Q5K, 57),
    ));
    v
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One request: its slot, prompt, tokens to generate and the step it arrives at.
#[derive(Clone)]
struct Req {
    slot: usize,
    prompt: Vec<u32>,
    n_gen: usize,
    start: usize,
}

/// Greedy generation of every request through `m`, all active requests in one step:
/// each request's logits rows (prompt's last, then one per generated token but the last).
fn run_together(m: &mut MultiEngine, reqs: &[Req]) -> Vec<Vec<Vec<f32>>> {
    let mut rows: Vec<Vec<Vec<f32>>> = vec![Vec::new(); reqs.len()];
    let mut step = 0;
    loop {
        let mut batch = Vec::new();
        let mut who = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            let done = rows[i].len();
            if step < r.start || done >= r.n_gen {
                continue;
            }
            let s = if done == 0 {
                SeqStep {
                    slot: r.slot,
                    tokens: r.prompt.clone(),
                    pos0: 0,
                    n_out: 1,
                }
            } else {
                SeqStep {
                    slot: r.slot,
                    tokens: vec![argmax(&rows[i][done - 1])],
                    pos0: r.prompt.len() + done - 1,
                    n_out: 1,
                }
            };
            batch.push(s);
            who.push(i);
        }
        if batch.is_empty() && reqs.iter().all(|r| step >= r.start) {
            return rows;
        }
        if !batch.is_empty() {
            let out = m.step(&batch).expect("step");
            assert_eq!(out.len(), batch.len());
            for (i, l) in who.into_iter().zip(out) {
                assert_eq!(l.len(), m.n_vocab());
                rows[i].push(l);
            }
        }
        step += 1;
    }
}

/// The same request on a plain engine holding only the slot's share of the context.
fn run_alone(file: &Arc<GgufFile>, slot_ctx: usize, r: &Req) -> Vec<Vec<f32>> {
    let mut e = Engine::from_arc(Arc::clone(file), &opts(2, slot_ctx, 512)).expect("engine");
    let mut rows = vec![e.forward(&r.prompt, 0, 1).expect("prefill")];
    while rows.len() < r.n_gen {
        let n = rows.len();
        let t = argmax(&rows[n - 1]);
        rows.push(e.forward(&[t], r.prompt.len() + n - 1, 1).expect("decode"));
    }
    rows
}

fn assert_same(name: &str, what: &str, a: &[Vec<f32>], b: &[Vec<f32>]) {
    assert_eq!(a.len(), b.len(), "{name} {what}: row counts");
    for (k, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(
            argmax(x),
            argmax(y),
            "{name} {what}: greedy token {k} differs"
        );
        assert!(bits(x) == bits(y), "{name} {what}: logits row {k} differ");
    }
}

fn requests() -> Vec<Req> {
    let prompt = |seed: u32, n: u32| (0..n).map(|i| (seed * 97 + i * 31) % 500).collect();
    vec![
        Req {
            slot: 0,
            prompt: prompt(1, 7),
            n_gen: 16,
            start: 0,
        },
        Req {
            slot: 2,
            prompt: prompt(2, 3),
            n_gen: 16,
            start: 0,
        },
        // Arrives mid-stream (its prompt shares a step with decodes) and ends last.
        Req {
            slot: 1,
            prompt: prompt(3, 11),
            n_gen: 12,
            start: 5,
        },
        Req {
            slot: 3,
            prompt: prompt(4, 1),
            n_gen: 6,
            start: 2,
        },
    ]
}

#[test]
fn batched_requests_match_each_request_alone_bitwise() {
    for (name, spec) in tiny_specs() {
        let file = tiny(&spec);
        let reqs = requests();
        let mut m = MultiEngine::from_shared(Arc::clone(&file), &opts(2, 256, 512), 4).unwrap();
        m.set_batching(true);
        assert_eq!(m.slot_ctx(), 64);
        let together = run_together(&mut m, &reqs);

        let mut serial =
            MultiEngine::from_shared(Arc::clone(&file), &opts(2, 256, 512), 4).unwrap();
        serial.set_batching(false);
        let one_by_one = run_together(&mut serial, &reqs);

        for (i, r) in reqs.iter().enumerate() {
            assert_eq!(together[i].len(), r.n_gen);
            assert_same(
                &name,
                "batched vs plain engine",
                &together[i],
                &run_alone(&file, 64, r),
            );
            assert_same(&name, "batched vs serial", &together[i], &one_by_one[i]);
            let mut fresh =
                MultiEngine::from_shared(Arc::clone(&file), &opts(2, 256, 512), 4).unwrap();
            fresh.set_batching(true);
            let solo = run_together(
                &mut fresh,
                &[Req {
                    start: 0,
                    ..r.clone()
                }],
            );
            assert_same(
                &name,
                "batched vs alone in a fresh MultiEngine",
                &together[i],
                &solo[0],
            );
        }
    }
}

#[test]
fn prompts_cut_by_n_batch_and_several_output_rows_match_the_plain_engine() {
    let spec = TinySpec::qwen2(GgmlType::Q8_0, 75);
    let file = tiny(&spec);
    let long: Vec<u32> = (0..13).map(|i| (i * 37 + 5) % 500).collect();
    let short: Vec<u32> = vec![9, 8, 7];
    // n_batch 4: the long prompt is cut across executions, next to the short one.
    let mut m = MultiEngine::from_shared(Arc::clone(&file), &opts(1, 64, 4), 2).unwrap();
    m.set_batching(true);
    let out = m
        .step(&[
            SeqStep {
                slot: 1,
                tokens: short.clone(),
                pos0: 0,
                n_out: 2,
            },
            SeqStep {
                slot: 0,
                tokens: long.clone(),
                pos0: 0,
                n_out: 5,
            },
        ])
        .unwrap();
    let mut e = Engine::from_arc(Arc::clone(&file), &opts(1, 32, 512)).unwrap();
    assert!(
        bits(&out[1]) == bits(&e.forward(&long, 0, 5).unwrap()),
        "long prompt rows"
    );
    e.reset();
    assert!(
        bits(&out[0]) == bits(&e.forward(&short, 0, 2).unwrap()),
        "short prompt rows"
    );
    assert_eq!((m.slot_len(0).unwrap(), m.slot_len(1).unwrap()), (13, 3));
}

#[test]
fn a_reset_slot_forgets_its_request_and_never_sees_its_neighbours() {
    let spec = TinySpec::qwen3(GgmlType::Q8_0, 147);
    let file = tiny(&spec);
    let a: Vec<u32> = (0..20).map(|i| (i * 13 + 1) % 500).collect();
    let b: Vec<u32> = (0..9).map(|i| (i * 29 + 3) % 500).collect();
    let c: Vec<u32> = vec![42, 17, 99];
    let mut m = MultiEngine::from_shared(Arc::clone(&file), &opts(2, 128, 512), 2).unwrap();
    let step = |slot, tokens: &[u32], pos0| SeqStep {
        slot,
        tokens: tokens.to_vec(),
        pos0,
        n_out: 1,
    };
    m.step(&[step(0, &a, 0), step(1, &b, 0)]).unwrap();
    m.reset_slot(0).unwrap();
    assert_eq!(m.slot_len(0).unwrap(), 0);
    // After the reset, slot 0 cannot continue the old sequence.
    let e = m.step(&[step(0, &[5], 20)]).unwrap_err();
    assert!(matches!(e, EngineError::Param { name: "pos0", .. }), "{e}");
    // The new request in slot 0 and the continuation of slot 1 both match fresh runs.
    let out = m.step(&[step(0, &c, 0), step(1, &[7], 9)]).unwrap();
    let mut e = Engine::from_arc(Arc::clone(&file), &opts(2, 64, 512)).unwrap();
    assert!(
        bits(&out[0]) == bits(&e.forward(&c, 0, 1).unwrap()),
        "slot 0 saw stale KV"
    );
    e.reset();
    e.forward(&b, 0, 1).unwrap();
    assert!(
        bits(&out[1]) == bits(&e.forward(&[7], 9, 1).unwrap()),
        "slot 1 changed"
    );
    // Rewinding a slot (a step starting inside its sequence) overwrites the rest.
    let again = m.step(&[step(0, &c, 0)]).unwrap();
    assert!(bits(&again[0]) == bits(&out[0]));
    assert_eq!(m.slot_len(0).unwrap(), 3);
}

#[test]
fn a_copied_prefix_continues_exactly_as_the_prefilled_sequence() {
    let spec = TinySpec::qwen3(GgmlType::Q8_0, 147);
    let file = tiny(&spec);
    let a: Vec<u32> = (0..20).map(|i| (i * 13 + 1) % 500).collect();
    let junk: Vec<u32> = (0..30).map(|i| (i * 7 + 5) % 500).collect();
    let mut m = MultiEngine::from_shared(Arc::clone(&file), &opts(2, 192, 512), 3).unwrap();
    let step = |slot, tokens: &[u32], pos0| SeqStep {
        slot,
        tokens: tokens.to_vec(),
        pos0,
        n_out: 1,
    };
    // Slot 2 holds another sequence whose rows the copy must replace.
    m.step(&[step(0, &a, 0), step(2, &junk, 0)]).unwrap();
    m.copy_prefix(0, 1, a.len()).unwrap();
    m.copy_prefix(0, 2, a.len()).unwrap();
    assert_eq!(m.slot_len(1).unwrap(), a.len());
    assert_eq!(m.slot_len(2).unwrap(), a.len());
    let out = m
        .step(&[step(0, &[7], 20), step(1, &[7], 20), step(2, &[9], 20)])
        .unwrap();
    let mut e = Engine::from_arc(Arc::clone(&file), &opts(2, 64, 512)).unwrap();
    e.forward(&a, 0, 1).unwrap();
    let want7 = e.forward(&[7], 20, 1).unwrap();
    e.reset();
    e.forward(&a, 0, 1).unwrap();
    let want9 = e.forward(&[9], 20, 1).unwrap();
    assert!(bits(&out[0]) == bits(&want7), "the source changed");
    assert!(bits(&out[1]) == bits(&want7), "the copy differs");
    assert!(bits(&out[2]) == bits(&want9), "the copy kept stale rows");
    // More positions than the source holds, or a slot out of range, are refused.
    let e = m.copy_prefix(0, 1, 22).unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::Param {
                name: "copy_prefix",
                ..
            }
        ),
        "{e}"
    );
    assert!(m.copy_prefix(0, 3, 1).is_err());
}

#[test]
fn decode_steps_of_one_shape_reuse_one_graph() {
    let file = tiny(&TinySpec::qwen2(GgmlType::F32, 75));
    let mut m = MultiEngine::from_shared(file, &opts(1, 64, 512), 4).unwrap();
    m.set_batching(true);
    let prompt = |slot| SeqStep {
        slot,
        tokens: vec![1, 2, 3],
        pos0: 0,
        n_out: 1,
    };
    m.step(&[prompt(0), prompt(1), prompt(2)]).unwrap();
    let before = m.engine().counters();
    for p in 3..10 {
        // Three one-token entries: a 3-token graph whatever the slots.
        let slots = if p % 2 == 0 { [0, 1, 2] } else { [2, 0, 1] };
        let batch: Vec<SeqStep> = slots
            .iter()
            .map(|&slot| SeqStep {
                slot,
                tokens: vec![4],
                pos0: p,
                n_out: 1,
            })
            .collect();
        m.step(&batch).unwrap();
    }
    let after = m.engine().counters();
    // One build for the first 3-token step, then six reuses.
    assert_eq!(
        (after.builds, after.reuses),
        (before.builds + 1, before.reuses + 6),
        "decode rebuilt: {before:?} -> {after:?}"
    );
}

#[test]
fn bad_steps_are_refused_by_name_and_change_nothing() {
    let file = tiny(&TinySpec::qwen2(GgmlType::F32, 75));
    let mut m = MultiEngine::from_shared(file, &opts(1, 64, 512), 2).unwrap();
    let s = |slot, tokens: Vec<u32>, pos0, n_out| SeqStep {
        slot,
        tokens,
        pos0,
        n_out,
    };
    m.step(&[s(0, vec![1, 2], 0, 1)]).unwrap();
    let cases = [
        (vec![s(2, vec![1], 0, 1)], "slot"),
        (vec![s(0, vec![1], 2, 1), s(0, vec![2], 3, 1)], "twice"),
        (vec![s(1, vec![], 0, 1)], "0 tokens"),
        (vec![s(1, vec![1], 0, 2)], "2 output rows"),
        (vec![s(1, vec![1], 1, 1)], "cannot start at 1"),
        (vec![s(1, vec![1; 33], 0, 1)], "33 positions"),
        (vec![s(1, vec![512], 0, 1)], "token id 512"),
    ];
    for (batch, want) in cases {
        let e = m.step(&batch).unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
    assert_eq!((m.slot_len(0).unwrap(), m.slot_len(1).unwrap()), (2, 0));
    assert!(MultiEngine::from_shared(
        tiny(&TinySpec::qwen2(GgmlType::F32, 75)),
        &opts(1, 4, 512),
        5
    )
    .is_err());
}

/// The kernels' claim batching rests on: a token's output row does not depend on how
/// many tokens share the call (1 to 9, so groups of 4, 3, 2 and 1) or on the threads.
#[test]
fn matmul_rows_do_not_depend_on_the_batch() {
    let (rows, cols) = (40, 512);
    let x: Vec<f32> = (0..9 * cols)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 1.5)
        .collect();
    let wf: Vec<f32> = (0..rows * cols)
        .map(|i| (i * 104729 % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let types = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
    ];
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        for ty in types {
            let data = minfer_gguf::quant::quantize_to_vec(ty, &wf).expect("quantize");
            let w = QMatrix {
                ty,
                data: &data,
                rows,
                cols,
            };
            let repacked = RepackedMatrix::supports(ty)
                .then(|| RepackedMatrix::from_qmatrix(&w).expect("repack"));
            let mm = |xs: &[f32], nt: usize, packed: bool| {
                let mut y = vec![f32::NAN; nt * rows];
                let mut s = MatmulScratch::new();
                match (&repacked, packed) {
                    (Some(r), true) => matmul_repacked(&pool, r, xs, nt, &mut y, &mut s),
                    _ => matmul(&pool, &w, xs, nt, &mut y, &mut s),
                }
                .expect("matmul");
                y
            };
            for packed in [false, true] {
                let single: Vec<Vec<f32>> = (0..9)
                    .map(|t| mm(&x[t * cols..(t + 1) * cols], 1, packed))
                    .collect();
                for nt in 1..=9 {
                    let y = mm(&x[..nt * cols], nt, packed);
                    for (t, one) in single.iter().enumerate().take(nt) {
                        assert!(
                            bits(&y[t * rows..(t + 1) * rows]) == bits(one),
                            "{ty} repacked={packed} t={threads}: token {t} of {nt} differs from it alone"
                        );
                    }
                }
            }
        }
    }
}

fn model_path() -> std::path::PathBuf {
    let p = minfer_hub::default_model_path();
    assert!(
        p.exists(),
        "the default model is missing at {}: run `minfer pull`",
        p.display()
    );
    p
}

/// The default model: three requests decoding together match each one alone, bitwise.
#[test]
fn default_model_batched_decode_matches_each_request_alone() {
    let path = model_path();
    let file = Arc::new(GgufFile::open(&path).expect("default model opens"));
    let prompt = |s: u32| {
        (0..5)
            .map(|i| 1000 + s * 500 + i * 17)
            .collect::<Vec<u32>>()
    };
    let reqs: Vec<Req> = (0..3)
        .map(|s| Req {
            slot: s as usize,
            prompt: prompt(s),
            n_gen: 4,
            start: s as usize,
        })
        .collect();
    let mut m = MultiEngine::from_shared(Arc::clone(&file), &opts(2, 96, 512), 3).unwrap();
    m.set_batching(true);
    let together = run_together(&mut m, &reqs);
    for (i, r) in reqs.iter().enumerate() {
        assert_same(
            "default model",
            "batched vs alone",
            &together[i],
            &run_alone(&file, 32, r),
        );
    }
}
