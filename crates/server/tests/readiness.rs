//! The loading state: the socket answers before the default model is loaded, `/health`
//! says 503 until the model can serve and 200 after, other routes refuse with 503 in the
//! meantime, and `/version` and `/metrics` (with the `vllm:*` names gateways read)
//! answer throughout.

mod common;

use std::time::{Duration, Instant};

use common::*;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[test]
fn health_is_503_while_the_model_loads_and_200_after() {
    let (_dir, path) = tiny_model();
    let mut c = tiny_config(&path, 1);
    let port = free_port();
    c.port = port;
    c.load_delay = Duration::from_millis(1500);
    let server = std::thread::spawn(move || minfer_server::start(c).expect("start"));
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let get = |path: &str| {
        let a = raw(
            addr,
            &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"),
        );
        let status: u16 = a
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, a)
    };
    // Wait for the socket.
    let t0 = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the socket never opened"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (st, a) = get("/health");
    assert_eq!(st, 503, "{a}");
    assert!(a.contains("Loading model"), "{a}");
    assert_eq!(raw_header(&a, "retry-after").as_deref(), Some("1"), "{a}");
    let (st, a) = get("/v1/models");
    assert_eq!(st, 503, "{a}");
    let (st, a) = get("/version");
    assert_eq!(st, 200, "{a}");
    assert!(a.contains("\"name\":\"minfer\""), "{a}");
    let (st, a) = get("/metrics");
    assert_eq!(st, 200, "{a}");
    assert!(a.contains("vllm:num_requests_waiting 0"), "{a}");
    let running = server.join().expect("the start thread");
    // Loaded: healthy, and the routes serve.
    let (st, a) = get("/health");
    assert_eq!(st, 200, "{a}");
    let (st, a) = get("/v1/models");
    assert_eq!(st, 200, "{a}");
    running.stop().expect("stop");
}

#[test]
fn a_model_that_cannot_load_stops_the_server_with_the_reason() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("broken.gguf");
    std::fs::write(&path, b"GGUF\x03\0\0\0 truncated").unwrap();
    let mut c = tiny_config(&path, 1);
    c.port = free_port();
    let e = match minfer_server::start(c) {
        Ok(_) => panic!("a broken model must not serve"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("broken.gguf") || e.contains("truncat") || e.contains("GGUF"),
        "{e}"
    );
}
