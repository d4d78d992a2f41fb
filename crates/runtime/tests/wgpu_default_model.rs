//! The default model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M) through `Engine` with the
//! wgpu backend selected by the fence, against the CPU backend: teacher-forced top-1
//! agreement over the reference prompts, perplexity on the reference text, greedy
//! output across graph reuse, a batched request against the same request alone, and a
//! decode graph split many times between wgpu and the CPU.
//!
//! CI runs these on Mesa's lavapipe, a CPU emulation that runs this model at one to two
//! seconds a decode step on two cores, so the decode-heavy tests use a stated prefix of
//! the reference data (see each constant); prompts run in the matmul's wide token
//! tiles, so the perplexity check scores 512 tokens in two 512-token chunks, the
//! context of every published perplexity figure, whose 256-row logits output (155 MB)
//! exceeds lavapipe's largest storage binding (128 MiB).
//! Without an adapter they fail, unless `MINFER_WGPU_TESTS=skip` skips them explicitly.

// Release runs only: the `checked` profile's pass over this crate is for the graph
// invariant checks, which the CPU tests exercise, and would double lavapipe's minutes.
#![cfg(all(feature = "wgpu", not(debug_assertions)))]

use std::sync::Arc;
use std::time::Instant;

use minfer_gguf::GgufFile;
use minfer_graph::testing::Declining;
use minfer_graph::{Backend, BackendConfig, BackendFactory, BackendImpl, BackendScheduler};
use minfer_runtime::perplexity::perplexity;
use minfer_runtime::sampling::argmax;
use minfer_runtime::testing::{fenced, ids, reference, rel_err};
use minfer_runtime::{Engine, EngineOptions, MultiEngine, SeqStep};
use minfer_tokenizer::Tokenizer;

/// Tokens of each teacher-forced reference prompt that are scored (all four prompts).
const TEACHER_PREFIX: usize = 32;
/// Largest lead, in logits, that one backend's top-1 may have over the other's where
/// the two disagree. Both backends round a quantized matmul's activations to the same
/// Q8 levels, so they differ by float summation order only; where that moves an
/// activation across a rounding boundary the difference grows, which may flip a
/// near-tie but not a row with a clear winner. Measured: one disagreement, leads of
/// 0.021 and 0.002.
const TIE: f32 = 0.25;
/// Perplexity over the first [`PPL_CHUNKS`] chunks of this many tokens of the
/// reference text (the second half of each scored), on both backends.
const PPL_CTX: usize = 512;
/// Chunks scored: 2 x 256 = 512 scored tokens. Over fewer the near-tie noise of single
/// tokens does not average out: one 512-token chunk (256 scored) differs by 0.52%
/// (wgpu 4.9151, cpu 4.9407), one 64-token chunk (32 scored) by 2.4%.
const PPL_CHUNKS: usize = 2;
/// Greedy decode steps compared across graph reuse.
const GREEDY_STEPS: usize = 4;

/// The default model, shared by the engines of one test.
fn file() -> Arc<GgufFile> {
    minfer_hub::testing::default_model_file()
}

/// Two CPU threads beside the fenced backend, as every comparison here runs.
fn opts(backend: &str, n_ctx: usize) -> EngineOptions {
    fenced(backend, n_ctx, 2)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn teacher_forced_top1_agrees_with_the_cpu_backend() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let f = file();
    let mut g = Engine::from_arc(Arc::clone(&f), &opts("wgpu", 128)).expect("wgpu engine");
    let mut c = Engine::from_arc(f, &opts("cpu", 128)).expect("cpu engine");
    assert_eq!(g.backend_info()[0].name, "wgpu");
    let n_vocab = g.n_vocab();
    let (mut agree, mut total, mut max_err) = (0, 0, 0f32);
    // Agreement of each backend with llama.cpp's top-1 (its CPU path, Q8 activations),
    // for the record.
    let (mut g_llama, mut c_llama) = (0, 0);
    let t0 = Instant::now();
    for case in reference()["teacher_forced"].as_array().expect("cases") {
        let all = ids(&case["ids"]);
        let prompt = &all[..TEACHER_PREFIX.min(all.len())];
        let llama_top = case["top_ids"].as_array().expect("top ids");
        // One prefill per prompt, every row's logits.
        g.reset();
        c.reset();
        let lg = g.forward(prompt, 0, prompt.len()).expect("wgpu forward");
        let lc = c.forward(prompt, 0, prompt.len()).expect("cpu forward");
        for (p, (rg, rc)) in lg.chunks(n_vocab).zip(lc.chunks(n_vocab)).enumerate() {
            let llama = ids(&llama_top[p])[0];
            let (tg, tc) = (argmax(rg), argmax(rc));
            g_llama += usize::from(tg == llama);
            c_llama += usize::from(tc == llama);
            if tg != tc {
                let lead = |r: &[f32], a: u32, b: u32| r[a as usize] - r[b as usize];
                let (lg, lc) = (lead(rg, tg, tc), lead(rc, tc, tg));
                eprintln!(
                    "position {p}: wgpu {tg} (leads by {lg:.3}), cpu {tc} (leads by {lc:.3}), \
                     llama.cpp {llama}"
                );
                assert!(
                    lg < TIE && lc < TIE,
                    "position {p}: the backends disagree on a clear winner ({lg}, {lc})"
                );
            }
            agree += usize::from(tg == tc);
            max_err = max_err.max(rel_err(rg, rc));
            total += 1;
        }
    }
    eprintln!("top-1 agreement with llama.cpp: wgpu {g_llama}/{total}, cpu {c_llama}/{total}");
    let pct = 100.0 * agree as f64 / total as f64;
    eprintln!(
        "teacher-forced, first {TEACHER_PREFIX} tokens of each reference prompt: top-1 \
         agreement of wgpu with the CPU {agree}/{total} = {pct:.2}%, largest relative logits \
         difference {max_err:.2e}, {:.1?}",
        t0.elapsed()
    );
    assert!(total >= 4 * TEACHER_PREFIX, "{total} positions");
    // The acceptance: at least 99%. Measured on lavapipe: 127/128 (99.22%), the one
    // disagreement a near-tie (checked above); before the shaders rounded activations
    // as the CPU does, 125/128.
    assert!(pct >= 99.0, "top-1 agreement {pct:.2}%");
    // Float order amplified through 24 layers of roundings: an activation that lands
    // on the other side of a rounding boundary moves by a whole level. Measured: most
    // rows 1-2.5e-2, the largest 6.5e-2 (one row); a row without such a crossing
    // agrees to 3.3e-7 (the first prompt's first).
    assert!(
        max_err < 1e-1,
        "largest relative logits difference {max_err:e}"
    );
}

/// Perplexity of the reference text over `chunks` chunks of `n_ctx` on `backend`.
fn ppl(f: &Arc<GgufFile>, backend: &str, n_ctx: usize, chunks: usize) -> f64 {
    let tok = Tokenizer::from_gguf(f).expect("tokenizer");
    let tokens = tok.encode(include_str!("golden/ppl_text.txt"), true, false);
    let mut e = Engine::from_arc(Arc::clone(f), &opts(backend, n_ctx)).expect("engine");
    let acc = perplexity(&mut e, &tokens, n_ctx, Some(chunks), |_, _| {}).expect("perplexity");
    acc.estimate().0
}

/// wgpu's and the CPU's perplexity over `chunks` chunks of `n_ctx`, and their relative
/// difference, printed.
fn ppl_pair(n_ctx: usize, chunks: usize) -> f64 {
    let f = file();
    let t0 = Instant::now();
    let (pg, pc) = (
        ppl(&f, "wgpu", n_ctx, chunks),
        ppl(&f, "cpu", n_ctx, chunks),
    );
    let rel = (pg - pc).abs() / pc;
    eprintln!(
        "perplexity over {chunks} chunk(s) of {n_ctx} tokens of the reference text: wgpu \
         {pg:.4}, cpu {pc:.4}, relative difference {:.3}%, {:.1?}",
        rel * 100.0,
        t0.elapsed()
    );
    assert!(pg.is_finite() && pc.is_finite());
    rel
}

/// The acceptance figure: perplexity within 0.5% of the CPU backend's, at the 512-token
/// context whose logits exceed lavapipe's largest storage binding. Measured 0.028% on
/// lavapipe (wgpu 6.8587, cpu 6.8607).
#[test]
fn perplexity_is_within_half_a_percent_of_the_cpu_backend() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    // The scoring graph's head: on the device where its output fits the adapter's
    // reported limit, on the CPU (placed so, not failed at read-back) where it does not.
    let mut e = Engine::from_arc(file(), &opts("wgpu", PPL_CTX)).expect("wgpu engine");
    let limit = e.backend_info()[0]
        .device
        .as_ref()
        .and_then(|d| d.max_binding_bytes.min(d.max_buffer_bytes))
        .expect("the adapter's limits");
    // One piece per chunk (n_batch), its second half scored: the graph perplexity runs.
    assert!(e.n_batch() >= PPL_CTX);
    let graph = e.preview_graph(PPL_CTX, PPL_CTX / 2).expect("graph");
    let head = &graph.nodes[graph.outputs[0]];
    let bytes = head.n_elements() as u64 * 4;
    let want = if bytes > limit {
        Backend::CPU
    } else {
        Backend::WGPU
    };
    eprintln!("logits of {bytes} bytes against a limit of {limit}: head on {want}");
    assert_eq!(head.backend, Some(want));
    drop(e);
    let rel = ppl_pair(PPL_CTX, PPL_CHUNKS);
    assert!(rel < 0.005, "relative difference {:.3}%", rel * 100.0);
}

#[test]
fn greedy_output_is_bitwise_identical_across_graph_reuse() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let f = file();
    let prompt = [750u32, 75698, 1445, 1648];
    let t0 = Instant::now();
    let run = |rebuild: bool| {
        let mut e = Engine::from_arc(Arc::clone(&f), &opts("wgpu", 64)).expect("engine");
        e.set_rebuild_every_step(rebuild);
        let mut logits = e.prefill(&prompt, 0).expect("prefill");
        let mut all = logits.clone();
        let mut tokens = Vec::new();
        for i in 0..GREEDY_STEPS {
            let t = argmax(&logits);
            tokens.push(t);
            logits = e.forward(&[t], prompt.len() + i, 1).expect("decode");
            all.extend_from_slice(&logits);
        }
        (tokens, bits(&all), e.counters())
    };
    let (t_reused, reused, c_reused) = run(false);
    let (t_fresh, fresh, c_fresh) = run(true);
    eprintln!(
        "greedy on wgpu, {GREEDY_STEPS} steps: {t_reused:?} with reuse, {t_fresh:?} rebuilt, {:.1?}",
        t0.elapsed()
    );
    assert_eq!(t_reused, t_fresh, "greedy tokens differ");
    assert!(reused == fresh, "logits differ between reuse and rebuild");
    assert_eq!(c_reused.builds, 2, "{c_reused:?}");
    assert_eq!(c_reused.reuses, GREEDY_STEPS as u64 - 1, "{c_reused:?}");
    assert_eq!(c_fresh.builds, GREEDY_STEPS as u64 + 1, "{c_fresh:?}");
}

/// Greedy generation of each request through `m`, all active ones in one step: each
/// request's logits rows (the prompt's last, then one per generated token but the last).
fn generate(m: &mut MultiEngine, reqs: &[(usize, Vec<u32>)], n_gen: usize) -> Vec<Vec<Vec<f32>>> {
    let mut rows: Vec<Vec<Vec<f32>>> = vec![Vec::new(); reqs.len()];
    for step in 0..n_gen {
        let batch: Vec<SeqStep> = reqs
            .iter()
            .zip(&rows)
            .map(|((slot, prompt), r)| match step {
                0 => SeqStep {
                    slot: *slot,
                    tokens: prompt.clone(),
                    pos0: 0,
                    n_out: 1,
                },
                _ => SeqStep {
                    slot: *slot,
                    tokens: vec![argmax(&r[step - 1])],
                    pos0: prompt.len() + step - 1,
                    n_out: 1,
                },
            })
            .collect();
        for (r, l) in rows.iter_mut().zip(m.step(&batch).expect("step")) {
            r.push(l);
        }
    }
    rows
}

#[test]
fn a_batched_request_is_bitwise_identical_to_the_same_request_alone() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let f = file();
    let reqs = vec![
        (0usize, vec![750u32, 75698, 1445, 1648]),
        (1usize, vec![151644u32, 872, 198]),
    ];
    let n_gen = 3;
    let t0 = Instant::now();
    let multi = || {
        let mut m = MultiEngine::from_shared(Arc::clone(&f), &opts("wgpu", 128), 2).expect("multi");
        m.set_batching(true);
        assert_eq!(m.engine().backend_info()[0].name, "wgpu");
        m
    };
    let together = generate(&mut multi(), &reqs, n_gen);
    // The first request alone (each engine compiles its pipelines anew, which lavapipe
    // makes slow; the CPU's batch tests cover every request of a larger mix).
    for (i, r) in reqs.iter().enumerate().take(1) {
        let alone = generate(&mut multi(), std::slice::from_ref(r), n_gen);
        for (k, (a, b)) in together[i].iter().zip(&alone[0]).enumerate() {
            assert_eq!(
                argmax(a),
                argmax(b),
                "request {i}: greedy token {k} differs"
            );
            assert!(bits(a) == bits(b), "request {i}: logits row {k} differ");
        }
    }
    eprintln!(
        "batched against alone on wgpu: {} requests batched, {n_gen} tokens each, the first \
         bitwise identical alone, {:.1?}",
        reqs.len(),
        t0.elapsed()
    );
}

/// wgpu declining RMSNorm and RoPE, so every layer alternates between the backends.
fn declining_wgpu(cfg: &BackendConfig) -> Result<Box<dyn BackendImpl>, String> {
    let inner = (minfer_wgpu::FACTORY.create)(cfg)?;
    Ok(Box::new(Declining::new(inner, &["rms_norm", "rope"])))
}

const DECLINING_WGPU: BackendFactory = BackendFactory {
    create: declining_wgpu,
    ..minfer_wgpu::FACTORY
};

#[test]
fn a_decode_graph_split_between_wgpu_and_the_cpu_matches_the_cpu() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let f = file();
    let factories = [minfer_cpu::FACTORY, DECLINING_WGPU];
    let mut mixed =
        Engine::with_factories(Arc::clone(&f), &opts("wgpu", 64), &factories).expect("mixed");
    let mut c = Engine::from_arc(f, &opts("cpu", 64)).expect("cpu engine");
    // The decode graph's splits, as the scheduler cuts them.
    let graph = mixed.preview_graph(1, 1).expect("decode graph");
    let splits = BackendScheduler::new().split_graph(&graph);
    let count = |b| splits.iter().filter(|s| s.backend == b).count();
    let (on_gpu, on_cpu) = (count(Backend::WGPU), count(Backend::CPU));
    let to_gpu: usize = splits
        .iter()
        .filter(|s| s.backend == Backend::WGPU)
        .map(|s| s.inputs.len())
        .sum();
    let to_cpu: usize = splits
        .iter()
        .filter(|s| s.backend == Backend::CPU)
        .map(|s| s.inputs.len())
        .sum();
    eprintln!(
        "decode graph: {} splits ({on_gpu} wgpu, {on_cpu} cpu), {to_gpu} values staged to wgpu, \
         {to_cpu} to the CPU",
        splits.len()
    );
    assert!(
        on_gpu > 1 && on_cpu > 1,
        "{on_gpu} wgpu and {on_cpu} cpu splits"
    );
    assert!(to_gpu > 0 && to_cpu > 0, "staging both ways");
    let prompt = [750u32, 75698, 1445, 1648];
    let (mut lm, mut lc) = (
        mixed.prefill(&prompt, 0).expect("mixed prefill"),
        c.prefill(&prompt, 0).expect("cpu prefill"),
    );
    let mut max_err = rel_err(&lm, &lc);
    for (i, t) in [198u32, 262].into_iter().enumerate() {
        lm = mixed
            .forward(&[t], prompt.len() + i, 1)
            .expect("mixed decode");
        lc = c.forward(&[t], prompt.len() + i, 1).expect("cpu decode");
        max_err = max_err.max(rel_err(&lm, &lc));
        assert_eq!(argmax(&lm), argmax(&lc), "decode step {i}: top-1 differs");
    }
    eprintln!("split graph against the CPU: largest relative logits difference {max_err:.2e}");
    // As for the all-wgpu graph: float order, amplified where it crosses a rounding.
    assert!(
        max_err < 5e-2,
        "largest relative logits difference {max_err:e}"
    );
}
