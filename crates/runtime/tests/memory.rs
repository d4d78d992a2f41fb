//! Resets, repeated generations and perplexity chunks leave the engine's memory flat:
//! a reset allocates no KV region and keeps the graph (positions are data), so the CPU
//! pool holds the same buffers after 200 of them and the process RSS does not grow. The
//! rows of an earlier sequence stay in the KV, so no step may start past the rows the
//! current one has written.

use std::sync::{Arc, Mutex};

use minfer_gguf::{GgmlType, GgufFile};
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::perplexity::perplexity;
use minfer_runtime::{greedy_tokens, Engine, EngineError, EngineOptions};

fn opts(n_ctx: usize) -> EngineOptions {
    EngineOptions {
        n_threads: 2,
        n_ctx: Some(n_ctx),
        backend: None,
        n_batch: 512,
        ..EngineOptions::default()
    }
}

/// Anonymous resident memory of this process, in bytes (`RssAnon` of
/// /proc/self/status): the heap and the pools. File-backed pages are left out: the
/// mapped weights page in as new tokens' embedding rows are first read.
fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon line");
    kb * 1024
}

/// RSS is per process: the tests here take turns so one's allocations are not
/// counted as the other's growth.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// RSS may move by allocator noise; a leak of one KV region per layer and reset grows
/// it by far more than this over 200 resets.
const RSS_SLACK: usize = 8 << 20;

#[test]
fn two_hundred_resets_keep_the_pool_and_rss_flat() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let spec = TinySpec::qwen3(GgmlType::Q8_0, 147);
    let file = Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap());
    // A large context makes every leaked KV region large too.
    let mut e = Engine::from_arc(file, &opts(4096)).unwrap();
    let prompt = [3u32, 141, 59, 26, 5];
    let first = greedy_tokens(&mut e, &prompt, 4).unwrap();
    // The second request may still place a graph in storage the first left idle at
    // other lengths; from then on every request finds its buffers.
    assert_eq!(greedy_tokens(&mut e, &prompt, 4).unwrap(), first);
    let pool = e.pool_len();
    let rss = rss_bytes();
    for i in 0..200 {
        // greedy_tokens resets, prefills and decodes: one whole request.
        let again = greedy_tokens(&mut e, &prompt, 4).unwrap();
        assert_eq!(again, first, "request {i} after resets");
        assert_eq!(e.pool_len(), pool, "pool grew at reset {i}");
    }
    // Repetitions of one step shape after resets (a benchmark's) reuse one graph.
    let builds = e.counters().builds;
    for _ in 0..20 {
        e.reset();
        e.prefill(&prompt, 0).unwrap();
    }
    assert_eq!(e.counters().builds, builds + 1, "resets rebuilt the graph");
    assert_eq!(e.pool_len(), pool);
    let grown = rss_bytes().saturating_sub(rss);
    assert!(
        grown < RSS_SLACK,
        "anonymous RSS grew by {grown} bytes over 200 resets"
    );
}

#[test]
fn two_hundred_perplexity_chunks_of_the_default_model_keep_memory_flat() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = minfer_hub::default_model_path();
    assert!(
        path.exists(),
        "the default model is missing at {}: run `minfer pull` (scripts/test.sh does)",
        path.display()
    );
    let mut e = Engine::load(&path, &opts(256)).unwrap();
    let tokens: Vec<u32> = (0..4 * 220).map(|i| (i * 7919 + 13) % 30000).collect();
    // Warm-up: the chunk graph exists and every scratch buffer has grown to size.
    perplexity(&mut e, &tokens[..4 * 20], 4, None, |_, _| {}).unwrap();
    let (pool, builds) = (e.pool_len(), e.counters().builds);
    let rss = rss_bytes();
    let mut chunks = 0;
    let acc = perplexity(&mut e, &tokens[4 * 20..], 4, Some(200), |c, _| chunks = c).unwrap();
    assert_eq!(chunks, 200);
    assert!(acc.ppl().is_finite());
    assert_eq!(e.pool_len(), pool, "the pool grew over 200 chunks");
    assert_eq!(e.counters().builds, builds, "a chunk rebuilt the graph");
    let grown = rss_bytes().saturating_sub(rss);
    assert!(
        grown < RSS_SLACK,
        "anonymous RSS grew by {grown} bytes over 200 chunks"
    );
}

const PROMPT: [u32; 7] = [11, 250, 3, 499, 17, 42, 8];

#[test]
fn after_a_reset_no_step_can_read_the_last_sequences_rows() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let spec = TinySpec::qwen2(GgmlType::Q8_0, 75);
    let file = GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap();
    let mut e = Engine::from_gguf(file, &opts(32)).unwrap();
    e.forward(&PROMPT, 0, 1).unwrap();
    e.reset();
    // Rows 0..7 still hold the last sequence; reading them as this one's is refused.
    let err = e.forward(&[5], PROMPT.len(), 1).unwrap_err();
    assert!(
        matches!(err, EngineError::Param { name: "pos0", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("holds 0 positions"), "{err}");
    // A start past the context is the context's error, before the sequence's.
    let err = e.forward(&[5], usize::MAX, 1).unwrap_err();
    assert!(matches!(err, EngineError::ContextOverflow { .. }), "{err}");
}

#[test]
fn prompts_of_ever_new_lengths_keep_the_pool_bounded() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let spec = TinySpec::qwen2(GgmlType::Q8_0, 75);
    let file = Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap());
    let prompt: Vec<u32> = (0..128).map(|i| (i * 37 + 5) % 500).collect();
    // The longest prompt alone: the most one request needs.
    let mut alone = Engine::from_arc(Arc::clone(&file), &opts(256)).unwrap();
    greedy_tokens(&mut alone, &prompt, 2).unwrap();
    let largest = alone.pool_elems();

    let mut e = Engine::from_arc(file, &opts(256)).unwrap();
    for n in (1..=prompt.len()).rev().chain(1..=prompt.len()) {
        // Each length is a new prefill graph with buffers of new lengths.
        greedy_tokens(&mut e, &prompt[..n], 2).unwrap();
        let held = e.pool_elems();
        assert!(
            held <= 2 * largest,
            "after a prompt of {n}: the pool holds {held} elements, the longest request needs {largest}"
        );
    }
}
