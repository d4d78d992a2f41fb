//! Load: 8 concurrent clients send 200 greedy requests (streaming, non-streaming, and
//! streams dropped after their first frame). No 5xx, every answer equals the same request
//! run alone, and memory does not grow.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::mixed::*;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_clients_two_hundred_requests() {
    let s = tiny_server(4, |c| c.queue = 256);
    let base = s.base.clone();
    let c = client();

    // Each prompt alone, one at a time: the reference answers.
    let mut reference = Vec::new();
    for k in 0..PROMPTS {
        let (st, r) = one(&c, &base, k, 0).await;
        assert_eq!(st, 200);
        reference.push(r.expect("an answer"));
    }
    let distinct: std::collections::HashSet<_> = reference.iter().map(|r| &r.0).collect();
    assert!(
        distinct.len() >= PROMPTS / 2,
        "answers should tell prompts apart: {reference:?}"
    );

    // Warm-up: the same mixed load once, so that one-time allocations (every slot's
    // buffers and graphs for each batch shape, per-thread arenas, pooled connections)
    // precede the baseline; growth after it would be a leak.
    let reference = Arc::new(reference);
    run_load(&c, &base, &reference, REQUESTS).await;
    let rss0 = rss_kb();
    let t0 = Instant::now();
    run_load(&c, &base, &reference, REQUESTS).await;
    let elapsed = t0.elapsed();
    assert!(elapsed < Duration::from_secs(60), "{elapsed:?}");

    // Dropped streams free their slots within a step or so.
    let t1 = Instant::now();
    loop {
        let (_, m) = get(&base, "/metrics").await;
        if m.contains("\nminfer_busy_slots 0\n") && m.contains("\nminfer_queue_length 0\n") {
            assert!(!m.contains("status=\"5"), "no 5xx: {m}");
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(5),
            "slots stay busy:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rss1 = rss_kb();
    eprintln!("{REQUESTS} requests in {elapsed:?}; RSS {rss0} kB -> {rss1} kB");
    assert!(
        rss1 as f64 <= rss0 as f64 * 1.10,
        "RSS grew from {rss0} kB to {rss1} kB"
    );
}
