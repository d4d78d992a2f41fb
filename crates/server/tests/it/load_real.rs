//! The mixed load on the real default model, in its own process so that the resident
//! memory it measures is this server's alone.

use crate::common;

use std::sync::Arc;
use std::time::Instant;

use common::mixed::*;
use common::*;
use minfer_server::{start, Config};

/// The same load on the real default model: memory after 200 mixed requests stays within
/// 10% of memory after the first request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_model_memory_after_the_load_is_within_ten_percent_of_the_first_request() {
    let mut cfg = Config::new(real_model());
    cfg.port = 0;
    cfg.slots = 4;
    cfg.ctx = Some(4 * 256);
    cfg.threads = Some(2);
    cfg.queue = 256;
    let running = start(cfg).expect("starting the server");
    let base = format!("http://{}", running.addr());
    let c = client();
    let mut reference = Vec::new();
    let mut rss0 = 0;
    for k in 0..PROMPTS {
        let (st, r) = one(&c, &base, k, 0).await;
        assert_eq!(st, 200);
        reference.push(r.expect("an answer"));
        if k == 0 {
            rss0 = rss_kb();
        }
    }
    let reference = Arc::new(reference);
    let t0 = Instant::now();
    run_load(&c, &base, &reference, REQUESTS).await;
    let elapsed = t0.elapsed();
    let rss1 = rss_kb();
    eprintln!("real model: {REQUESTS} requests in {elapsed:?}; RSS {rss0} kB after the first request -> {rss1} kB");
    assert!(
        rss1 as f64 <= rss0 as f64 * 1.10,
        "RSS grew from {rss0} kB to {rss1} kB"
    );
}
