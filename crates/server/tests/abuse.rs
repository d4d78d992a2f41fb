//! The server under abuse: eight clients run the mixed greedy load (streams, non-streams,
//! streams dropped after their first frame) while others post megabyte bodies to
//! /tokenize, trickle headers, send short bodies, open HTTP/2 prefaces and stall their
//! streams. No 5xx, every answer equals the same request run alone, and /health stays
//! under 50 ms at the 99th percentile throughout. Tiny model (the load is about the
//! server, not the model).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::mixed::*;
use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// How long the normal load runs beside the abuse.
const LOAD_TIME: Duration = Duration::from_secs(12);

/// Clients posting a megabyte to /tokenize, over and over.
const TOKENIZERS: usize = 6;

/// A tokenize body just under the 1 MiB body limit.
fn huge_text() -> String {
    let words = ["alpha ", "beta ", "gamma ", "delta ", "epsilon "];
    let mut s = String::with_capacity(1_000_010);
    let mut i = 0;
    while s.len() < 1_000_000 {
        s.push_str(words[i % words.len()]);
        i += 1;
    }
    s
}

/// The raw answer to a tokenize request (compared byte for byte with the solo run, so
/// that the client spends little time on it and the server's load is what is measured).
async fn tokenize(c: &reqwest::Client, base: &str, text: &str) -> (u16, axum::body::Bytes) {
    let r = c
        .post(format!("{base}/tokenize"))
        .json(&json!({ "content": text }))
        .send()
        .await
        .expect("tokenize");
    let st = r.status().as_u16();
    (st, r.bytes().await.expect("tokenize body"))
}

/// Reads whatever comes until the server closes; true when it closed within `limit`.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let until = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(until, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

/// One round of each kind of abuse; every one must be answered or closed in time.
async fn abuse(
    kind: usize,
    addr: std::net::SocketAddr,
    base: &str,
    text: &str,
    solo: &axum::body::Bytes,
) {
    let c = client();
    match kind {
        // A megabyte to tokenise: the answer must equal the solo run.
        k if k < TOKENIZERS => {
            let (st, got) = tokenize(&c, base, text).await;
            assert_eq!(st, 200, "a huge tokenize");
            assert!(got == solo, "a huge tokenize differs from its solo run");
        }
        // Headers a byte at a time: closed by the header timeout.
        k if k == TOKENIZERS => {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            let _ = s.write_all(b"GET /health HTTP/1.1\r\nX-Slow: ").await;
            let trickle = async {
                loop {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    if s.write_all(b"x").await.is_err() {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(5), trickle).await;
            assert!(
                closed_within(&mut s, Duration::from_secs(5)).await,
                "slow headers"
            );
        }
        // A body shorter than its length: 408 once the body timeout passes.
        k if k == TOKENIZERS + 1 => {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            let req = format!(
                "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\n\
                 content-type: application/json\r\ncontent-length: 500\r\n\r\n{{\"prompt\":"
            );
            s.write_all(req.as_bytes()).await.expect("send");
            let mut out = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
            let out = String::from_utf8_lossy(&out);
            assert!(out.starts_with("HTTP/1.1 408"), "short body: {out}");
        }
        // An HTTP/2 preface: told to use HTTP/1.1, then closed.
        k if k == TOKENIZERS + 2 => {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                .await
                .expect("send");
            assert!(
                closed_within(&mut s, Duration::from_secs(5)).await,
                "h2 preface"
            );
        }
        // A stream whose reader never reads: cut off by the write timeout.
        _ => {
            let sock = TcpSocket::new_v4().expect("socket");
            sock.set_recv_buffer_size(4096).expect("SO_RCVBUF");
            let mut s = sock.connect(addr).await.expect("connect");
            let body = json!({
                "prompt": "stall the stream", "max_tokens": 200, "temperature": 0,
                "stream": true, "logprobs": 5,
            })
            .to_string();
            let req = format!(
                "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\n\
                 content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            s.write_all(req.as_bytes()).await.expect("send");
            // Hold it unread past the write timeout, then go away.
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_clients_under_abuse_get_their_answers_and_health_stays_fast() {
    let s = tiny_server(4, |c| {
        c.queue = 256;
        c.header_timeout = Duration::from_secs(2);
        c.body_timeout = Duration::from_secs(1);
        c.write_timeout = Duration::from_secs(1);
        c.send_buffer = Some(16 * 1024);
    });
    let base = s.base.clone();
    let addr = s.running.addr();
    let c = client();
    let mut reference = Vec::new();
    for k in 0..PROMPTS {
        let (st, r) = one(&c, &base, k, 0).await;
        assert_eq!(st, 200);
        reference.push(r.expect("an answer"));
    }
    let reference = Arc::new(reference);
    let text = Arc::new(huge_text());
    let t0 = Instant::now();
    let (st, solo) = tokenize(&c, &base, &text).await;
    assert_eq!(st, 200);
    eprintln!(
        "a 1 MB tokenize alone: {} bytes of answer in {:?}",
        solo.len(),
        t0.elapsed()
    );
    let solo = Arc::new(solo);

    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    // /health, probed every 10 ms on its own connection throughout.
    let probe = {
        let (stop, base) = (stop.clone(), base.clone());
        tokio::spawn(async move {
            let c = client();
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = c
                    .get(format!("{base}/health"))
                    .send()
                    .await
                    .expect("health");
                assert_eq!(r.status().as_u16(), 200);
                let _ = r.bytes().await.expect("health body");
                lat.push(t.elapsed());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            lat
        })
    };
    let abusers: Vec<_> = (0..TOKENIZERS + 4)
        .map(|kind| {
            let (stop, rounds, base, text, solo) = (
                stop.clone(),
                rounds.clone(),
                base.clone(),
                text.clone(),
                solo.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    abuse(kind, addr, &base, &text, &solo).await;
                    rounds.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
        .collect();

    // The abuse gets going (megabyte tokenisations in progress), then the load runs
    // beside it for a while.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t1 = Instant::now();
    let mut served = 0;
    while t1.elapsed() < LOAD_TIME {
        run_load(&c, &base, &reference, 40).await;
        served += 40;
    }
    let load_time = t1.elapsed();
    stop.store(true, Ordering::Relaxed);
    for a in abusers {
        a.await.expect("an abuser failed");
    }
    let mut lat = probe.await.expect("the health probe failed");
    lat.sort();
    let p = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize];
    let (p50, p99, max) = (p(0.5), p(0.99), lat[lat.len() - 1]);
    eprintln!(
        "load of {served} requests in {load_time:?} beside {} abuse rounds; /health over {} \
         probes: p50 {p50:?}, p99 {p99:?}, max {max:?}",
        rounds.load(Ordering::Relaxed),
        lat.len()
    );
    let (_, m) = get(&base, "/metrics").await;
    assert!(!m.contains("status=\"5"), "no 5xx:\n{m}");
    assert!(p99 < Duration::from_millis(50), "/health p99 {p99:?}");
}
