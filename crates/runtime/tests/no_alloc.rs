//! After warm-up, a decode step (graph reuse, input fill, execution on the CPU backend,
//! logits read-back, the sampler chain) performs no heap allocation on any thread.
//!
//! Runs with `harness = false` (see Cargo.toml): the process holds only this thread and the
//! engine's pool, so every counted allocation is the engine's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use minfer_gguf::{GgmlType, GgufFile};
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::{Engine, EngineOptions, Sampler, SamplingParams};

/// Counts every allocation and reallocation in the process.
struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn decode_allocations(spec: TinySpec) -> usize {
    let file = GgufFile::from_bytes(tiny_model_bytes(&spec).expect("writer")).expect("reader");
    let opts = EngineOptions {
        n_threads: 2,
        n_ctx: Some(64),
        backend: None,
        n_batch: 512,
        ..EngineOptions::default()
    };
    let mut e = Engine::from_gguf(file, &opts).expect("engine");
    // Under debug assertions every reuse is checked against a freshly built graph, which
    // allocates by design; this test measures the release path.
    e.set_check_reuse(false);
    let prompt = [72u32, 101, 108, 108, 111];
    let mut logits = e.prefill(&prompt, 0).expect("prefill");
    let mut pos = prompt.len();
    // The full sampler chain, penalties included, runs inside the measured steps too.
    let mut sampler = Sampler::new(SamplingParams {
        repeat_penalty: 1.1,
        presence_penalty: 0.2,
        frequency_penalty: 0.1,
        ..SamplingParams::default()
    })
    .expect("sampler");
    // Warm-up: the decode graph is built and every buffer reaches its size.
    for _ in 0..3 {
        let t = sampler.sample(&mut logits);
        sampler.accept(t);
        e.forward_into(&[t], pos, 1, &mut logits).expect("decode");
        pos += 1;
    }
    let before = ALLOCS.load(Relaxed);
    for _ in 0..8 {
        let t = sampler.sample(&mut logits);
        sampler.accept(t);
        e.forward_into(&[t], pos, 1, &mut logits).expect("decode");
        pos += 1;
    }
    ALLOCS.load(Relaxed) - before
}

fn main() {
    let specs = [
        TinySpec::qwen2(GgmlType::Q8_0, 7),
        TinySpec::qwen2(GgmlType::Q5_0, 7),
        TinySpec::qwen3_kquant(GgmlType::Q4K, 7),
    ];
    let total = specs.len();
    let mut failed = 0;
    for spec in specs {
        let name = format!("{} {}", spec.arch, spec.wtype);
        let n = decode_allocations(spec);
        if n == 0 {
            println!("no_alloc {name}: ok");
        } else {
            println!("no_alloc {name}: FAILED, {n} allocations in 8 decode steps");
            failed += 1;
        }
    }
    println!("{} passed, {failed} failed", total - failed);
    if failed > 0 {
        std::process::exit(1);
    }
}
