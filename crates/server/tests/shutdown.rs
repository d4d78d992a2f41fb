//! A graceful stop: requests that finish within the shutdown timeout get their whole
//! answer, a stream still running then ends with an error event and `[DONE]` (not a
//! reset), and the stop itself is bounded. The signals that trigger it in `minfer serve`
//! are tested on the real binary (crates/cli/tests/serve.rs).

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_finishes_short_requests_and_ends_long_streams_with_an_error_event() {
    let s = tiny_server(2, |c| {
        c.fault_injection = true;
        c.shutdown_timeout = Duration::from_millis(500);
    });
    let base = s.base.clone();
    // A slow stream (200 tokens at 10 ms) that cannot finish within the timeout.
    let r = client()
        .post(format!("{base}/v1/completions"))
        .json(&json!({
            "prompt": format!("a {}", minfer_server::openai::SLOW_MARKER),
            "max_tokens": 200, "temperature": 0, "stream": true,
        }))
        .send()
        .await
        .expect("stream");
    assert_eq!(r.status().as_u16(), 200);
    let mut body = r.bytes_stream();
    let mut text =
        String::from_utf8_lossy(&body.next().await.expect("a frame").expect("bytes")).into_owned();
    // A short request (10 tokens at 10 ms) in flight when the stop begins finishes
    // normally.
    let short = {
        let base = base.clone();
        tokio::spawn(async move {
            post(
                &base,
                "/v1/completions",
                json!({
                    "prompt": format!("b {}", minfer_server::openai::SLOW_MARKER),
                    "max_tokens": 10, "temperature": 0,
                }),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let t0 = Instant::now();
    let addr = s.running.addr();
    let stopping = tokio::task::spawn_blocking(move || s.stop());
    // New connections are no longer accepted.
    let t1 = Instant::now();
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(t1.elapsed() < Duration::from_millis(300), "still accepting");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(
            &chunk.expect("a clean end, not a reset"),
        ));
    }
    let ended = t0.elapsed();
    let frames = sse_data(&text);
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"), "{text}");
    let err: Value = serde_json::from_str(&frames[frames.len() - 2]).expect("error frame");
    assert_eq!(err["error"]["type"], "server_overloaded", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("shutting down"),
        "{err}"
    );
    assert!(ended >= Duration::from_millis(400), "{ended:?}");
    let (st, v) = short.await.expect("short request");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 10, "{v}");
    stopping
        .await
        .expect("stop")
        .expect("the server stops cleanly");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}
