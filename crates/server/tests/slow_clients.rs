//! Slow and stalled clients cannot hold the server: headers sent a byte at a time, a
//! body shorter than its `Content-Length`, an HTTP/2 preface, a stream whose reader
//! stopped reading, and more connections than the cap each get a bounded answer, and a
//! stalled reader gives its slot up to the requests queued behind it.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Reads until the server closes (or `limit` passes); returns what came and when it ended.
async fn read_until_close(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, Duration) {
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((t0 + limit).into(), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (out, t0.elapsed()),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "the server kept the connection open for {limit:?}; got {:?}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_sent_a_byte_a_second_are_cut_off() {
    let s = tiny_server(1, |c| c.header_timeout = Duration::from_millis(800));
    let mut c = TcpStream::connect(s.running.addr()).await.expect("connect");
    let head = format!(
        "GET /health HTTP/1.1\r\nHost: {}\r\nX-Slow: ",
        s.running.addr()
    );
    c.write_all(head.as_bytes()).await.expect("send");
    let t0 = Instant::now();
    // Keep trickling: the server must close the connection long before we would finish.
    let trickle = async {
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if c.write_all(b"a").await.is_err() {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), trickle).await;
    let (_, _) = read_until_close(&mut c, Duration::from_secs(5)).await;
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_shorter_than_its_content_length_is_a_408() {
    let s = tiny_server(1, |c| c.body_timeout = Duration::from_millis(800));
    let mut c = TcpStream::connect(s.running.addr()).await.expect("connect");
    let req = format!(
        "POST /tokenize HTTP/1.1\r\nHost: {}\r\ncontent-type: application/json\r\n\
         content-length: 100\r\n\r\n{{\"content\":",
        s.running.addr()
    );
    c.write_all(req.as_bytes()).await.expect("send");
    let (out, took) = read_until_close(&mut c, Duration::from_secs(5)).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    assert!(out.contains("did not arrive"), "{out}");
    assert!(took < Duration::from_secs(3), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_preface_is_told_to_use_http1() {
    let s = tiny_server(1, |_| {});
    let mut c = TcpStream::connect(s.running.addr()).await.expect("connect");
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("send");
    // A prior-knowledge client also sends its SETTINGS right away.
    c.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .expect("send");
    let (out, took) = read_until_close(&mut c, Duration::from_secs(5)).await;
    assert!(took < Duration::from_secs(2), "{took:?}");
    // SETTINGS, then GOAWAY (type 7) with HTTP_1_1_REQUIRED (0xd).
    assert!(out.len() > 9 + 17, "{out:?}");
    assert_eq!(out[3], 4, "{out:?}");
    assert_eq!(out[9 + 3], 7, "{out:?}");
    assert_eq!(&out[9 + 13..9 + 17], &[0, 0, 0, 0xd], "{out:?}");
}

/// Opens a stream that never reads its answer, on a socket with a small receive buffer,
/// so that the server's writes stall after a few kilobytes.
async fn stalled_stream(addr: std::net::SocketAddr, max_tokens: usize) -> TcpStream {
    let sock = TcpSocket::new_v4().expect("socket");
    sock.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut c = sock.connect(addr).await.expect("connect");
    let body = json!({
        "prompt": format!("a {}", minfer_server::openai::SLOW_MARKER),
        "max_tokens": max_tokens, "temperature": 0, "stream": true, "logprobs": 5,
    })
    .to_string();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.expect("send");
    c
}

async fn metric(base: &str, name: &str) -> f64 {
    let (_, m) = get(base, "/metrics").await;
    m.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing in\n{m}"))
}

async fn busy_slots(base: &str) -> f64 {
    metric(base, "minfer_busy_slots").await
}

/// The stalled stream was stopped early: far fewer than its 200 tokens were generated.
async fn stopped_early(base: &str) {
    let generated = metric(base, "minfer_generated_tokens_total").await;
    assert!(generated < 150.0, "{generated} tokens generated in all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_is_cut_off_and_frees_its_slot() {
    let s = tiny_server(1, |c| {
        c.fault_injection = true;
        c.send_buffer = Some(4096);
        c.write_timeout = Duration::from_secs(1);
    });
    let stalled = stalled_stream(s.running.addr(), 200).await;
    // Wait until the stalled stream holds the only slot.
    let t0 = Instant::now();
    while busy_slots(&s.base).await < 1.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the stream never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The next request waits for the slot; it gets it once the stalled writer is cut off.
    let t1 = Instant::now();
    let r = client()
        .post(format!("{}/v1/completions", s.base))
        .timeout(Duration::from_secs(15))
        .json(&json!({"prompt": "b", "max_tokens": 4, "temperature": 0}))
        .send()
        .await
        .expect("the queued request is answered");
    assert_eq!(r.status().as_u16(), 200);
    assert!(t1.elapsed() < Duration::from_secs(6), "{:?}", t1.elapsed());
    stopped_early(&s.base).await;
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_deadline_holds_while_its_reader_is_stalled() {
    // The write timeout is long here: only the request's own deadline can free the slot.
    let s = tiny_server(1, |c| {
        c.fault_injection = true;
        c.send_buffer = Some(4096);
        c.write_timeout = Duration::from_secs(60);
        c.request_timeout = Duration::from_secs(2);
    });
    let stalled = stalled_stream(s.running.addr(), 200).await;
    let t0 = Instant::now();
    while busy_slots(&s.base).await < 1.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the stream never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Queued behind the stalled stream; its own 2 s deadline leaves it time to run once
    // the stalled one is dropped at its deadline.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = client()
        .post(format!("{}/v1/completions", s.base))
        .timeout(Duration::from_secs(15))
        .json(&json!({"prompt": "b", "max_tokens": 4, "temperature": 0}))
        .send()
        .await
        .expect("the queued request is answered");
    let st = r.status().as_u16();
    let took = t0.elapsed();
    assert_eq!(st, 200, "{}", r.text().await.unwrap_or_default());
    assert!(took < Duration::from_secs(5), "{took:?}");
    stopped_early(&s.base).await;
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_get_a_503() {
    let s = tiny_server(1, |c| c.max_connections = 3);
    let addr = s.running.addr();
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(TcpStream::connect(addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = tokio::task::spawn_blocking(move || {
        raw(
            addr,
            &format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nconnection: close\r\n\r\n"),
        )
    })
    .await
    .expect("raw request");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("--max-connections"), "{answer}");
    assert_eq!(raw_header(&answer, "retry-after").as_deref(), Some("1"));
    // Closing one frees its place.
    drop(idle.pop());
    let t0 = Instant::now();
    loop {
        let a = tokio::task::spawn_blocking(move || {
            raw(
                addr,
                &format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nconnection: close\r\n\r\n"),
            )
        })
        .await
        .expect("raw request");
        if a.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{a}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
