//! A tiny Gemma 3 (local layers with a 4-row window, a global layer) run through prefill
//! and decode on the CPU backend and on the scalar reference backend: the two agree, and
//! both move when the window is taken out of the graph, so a kernel ignoring the window
//! could not pass.

use std::sync::Arc;

use minfer_cpu::CpuBackend;
use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::testing::RefBackend;
use minfer_graph::{
    BackendImpl, BackendScheduler, ComputeGraph, FusionPass, GraphAllocator, GraphCache, NodeMeta,
};
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_models::{load_model, params};

/// Eight prompt tokens (twice the window), then decode steps past it.
const PROMPT: [u32; 8] = [72, 101, 108, 108, 111, 44, 32, 300];
const DECODE: [u32; 4] = [9, 374, 8, 436];

/// Takes every sliding window out of `g`: each layer attends its whole causal range.
fn without_windows(mut g: ComputeGraph) -> ComputeGraph {
    for n in &mut g.nodes {
        if let NodeMeta::Attn(m) = &mut n.meta {
            m.window = None;
        }
    }
    g
}

/// The logits of the prompt's last token and of every decode step, on `backend`.
fn run(file: &Arc<GgufFile>, mut backend: Box<dyn BackendImpl>, windows: bool) -> Vec<Vec<f32>> {
    let model = load_model(file).expect("tiny gemma3 loads");
    backend.register_gguf(file).expect("weights");
    let alloc = GraphAllocator::new(vec![backend]).expect("allocator");
    let mut cache = GraphCache::new(alloc);
    let mut sched = BackendScheduler::new();
    let mut steps: Vec<(Vec<u32>, usize)> = vec![(PROMPT.to_vec(), 0)];
    steps.extend(
        DECODE
            .iter()
            .enumerate()
            .map(|(i, &t)| (vec![t], PROMPT.len() + i)),
    );
    let mut out = Vec::new();
    for (tokens, start) in steps {
        let nt = tokens.len();
        let p = params::graph_params(nt, 1, params::cpu_cparams(32)).expect("params");
        if !cache.try_reuse(&p) {
            let g = model.build_graph(&p);
            let g = if windows { g } else { without_windows(g) };
            cache
                .install(g, p, &mut sched, &FusionPass::new())
                .expect("install");
        }
        let (g, alloc) = cache.current().expect("graph");
        let pos: Vec<i32> = (start..start + nt).map(|i| i as i32).collect();
        alloc.fill_input_u32(g, "token_ids", &tokens).unwrap();
        alloc.fill_input_i32(g, "positions", &pos).unwrap();
        if nt > 1 {
            let tail = params::tail_ids(nt, 1);
            alloc.fill_input_i32(g, "tail_ids", &tail).unwrap();
        }
        sched.execute(g, alloc).expect("execute");
        out.push(alloc.copy_to_cpu(g.outputs[0]).expect("logits"));
    }
    out
}

/// Largest difference over all steps, relative to the largest reference logit.
fn rel_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let scale = b.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    let d = a
        .iter()
        .flatten()
        .zip(b.iter().flatten())
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    d / scale
}

#[test]
fn tiny_gemma3_on_the_cpu_matches_the_reference_and_honours_the_window() {
    let spec = TinySpec::gemma3(GgmlType::F32, 5);
    let file = Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap());
    let cpu = || -> Box<dyn BackendImpl> { Box::new(CpuBackend::new(2)) };
    let reference = || -> Box<dyn BackendImpl> { Box::new(RefBackend::cpu()) };

    let got = run(&file, cpu(), true);
    let want = run(&file, reference(), true);
    assert_eq!(got.len(), 1 + DECODE.len());
    assert!(got.iter().all(|l| l.len() == spec.n_vocab));
    // F32 weights: summation order, the vectorised exponential and tanh are all that
    // differ (measured about 1e-6 of the largest logit).
    let d = rel_diff(&got, &want);
    assert!(d < 1e-4, "CPU vs reference: {d:e}");

    // Without the window both backends compute another model: the difference is far
    // above the agreement above, on the CPU and on the reference alike.
    let cpu_full = run(&file, cpu(), false);
    let ref_full = run(&file, reference(), false);
    assert!(rel_diff(&cpu_full, &ref_full) < 1e-4);
    let moved = rel_diff(&cpu_full, &want);
    assert!(
        moved > 1e-2,
        "the window changed the logits by only {moved:e}"
    );
    // The prompt's last token already reads past the window in the local layers.
    let first = rel_diff(&got[..1], &cpu_full[..1]);
    eprintln!(
        "gemma3: CPU vs reference {d:.2e}; without the window {moved:.2e} (prefill {first:.2e})"
    );
    assert!(first > 1e-3, "prefill moved by only {first:e}");
}
