//! The real `minfer serve` binary on a loopback port, driven by real clients: a raw
//! HTTP request, the official `openai` and `ollama` Python packages
//! (scripts/e2e_openai.py, scripts/e2e_ollama.py), llama-server's native routes and
//! switches, and its shutdown on SIGTERM and SIGINT with a stream in flight.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{http, start_server, tiny_qwen2, write_tiny_qwen2, Server};

/// Starts `minfer serve` on an ephemeral port and returns it with its address.
fn serve(args: &[&str]) -> (Server, String) {
    start_server(
        Command::new(env!("CARGO_BIN_EXE_minfer"))
            .arg("serve")
            .args(args)
            .args(["--host", "127.0.0.1", "--port", "0"]),
    )
}

fn http_get(addr: &str, path: &str) -> String {
    http(addr, &format!("GET {path}"), "")
}

fn http_post(addr: &str, path: &str, body: &str) -> String {
    http(addr, &format!("POST {path}"), body)
}

/// Checks that the Python client package `module` is importable and the default model is
/// pulled, then serves the default model with two slots.
fn serve_default_model_for(module: &str) -> (Server, String) {
    let probe = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .expect("python3 runs");
    assert!(
        probe.status.success(),
        "the {module} Python package is not importable (scripts/test.sh installs it with \
         `python3 -m pip install {module}`): {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let model = minfer_hub::testing::default_model();
    serve(&[
        "-m",
        model.to_str().unwrap(),
        "--slots",
        "2",
        "-c",
        "2048",
        "-t",
        "2",
    ])
}

/// Runs `scripts/NAME` with `args` and asserts it finished with `e2e ok`.
fn run_e2e_script(name: &str, args: &[&str]) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name);
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .expect("run the e2e script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("e2e ok"),
        "{name} failed\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn openai_python_client_against_the_minfer_serve_binary() {
    let (_server, addr) = serve_default_model_for("openai");
    let health = http_get(&addr, "/health");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let missing = http_get(&addr, "/v2/nothing");
    assert!(
        missing.starts_with("HTTP/1.1 404") && missing.contains("\"error\""),
        "{missing}"
    );
    run_e2e_script(
        "e2e_openai.py",
        &["--base-url", &format!("http://{addr}/v1")],
    );
}

#[test]
fn ollama_python_client_against_the_minfer_serve_binary() {
    let (_server, addr) = serve_default_model_for("ollama");
    run_e2e_script("e2e_ollama.py", &["--host", &format!("http://{addr}")]);
}

#[test]
fn llama_server_native_routes_and_switches_on_the_binary() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let model = tiny_qwen2(dir.path());
    let path = model.to_str().unwrap();
    let (server, addr) = serve(&["-m", path, "-c", "512", "-t", "1"]);
    let r = http_post(
        &addr,
        "/completion",
        r#"{"prompt":"hello","n_predict":3,"temperature":0,"ignore_eos":true,"n_probs":1}"#,
    );
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    for field in [
        "\"timings\"",
        "\"predicted_n\":3",
        "\"completion_probabilities\"",
        "\"stop_type\":\"limit\"",
    ] {
        assert!(r.contains(field), "{field} missing: {r}");
    }
    let r = http_post(
        &addr,
        "/completion",
        r#"{"prompt":"hello","n_predict":2,"temperature":0,"ignore_eos":true,"stream":true}"#,
    );
    assert!(
        r.starts_with("HTTP/1.1 200") && r.contains("text/event-stream"),
        "{r}"
    );
    assert!(r.contains("\"stop\":true") && !r.contains("[DONE]"), "{r}");
    assert!(http_get(&addr, "/props").contains("\"total_slots\":4"));
    // /slots and /metrics are on by default.
    assert!(http_get(&addr, "/slots").starts_with("HTTP/1.1 200"));
    let m = http_get(&addr, "/metrics");
    assert!(
        m.starts_with("HTTP/1.1 200") && m.contains("llamacpp:tokens_predicted_total 5"),
        "{m}"
    );
    drop(server);

    let (_server, addr) = serve(&[
        "-m",
        path,
        "-c",
        "512",
        "-t",
        "1",
        "--no-slots",
        "--no-metrics",
    ]);
    for (route, flag) in [("/slots", "--no-slots"), ("/metrics", "--no-metrics")] {
        let r = http_get(&addr, route);
        assert!(r.starts_with("HTTP/1.1 501"), "{route}: {r}");
        assert!(
            r.contains("not_supported_error") && r.contains(flag),
            "{route}: {r}"
        );
    }
}

/// Runs `minfer serve` on a tiny model with `args`, which must make it exit on its own
/// with an error (a server that starts instead is killed and the test fails).
fn serve_refused(model: &std::path::Path, args: &[&str]) -> String {
    let mut all = vec!["-m", model.to_str().expect("a UTF-8 path")];
    all.extend_from_slice(args);
    serve_refused_with(&all)
}

/// Like `serve_refused`, with every argument given.
fn serve_refused_with(args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg("serve")
        .args(args)
        .args(["--host", "127.0.0.1", "--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start minfer serve");
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for minfer serve") {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("minfer serve {args:?} kept running instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    assert!(!status.success(), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    err
}

#[test]
fn numeric_flags_outside_their_range_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let model = tiny_qwen2(dir.path());
    for (flag, args) in [
        ("--queue", ["--queue", "18446744073709551615"]),
        ("--queue", ["--queue", "1000000000"]),
        ("--timeout", ["--timeout", "18446744073709551615"]),
        ("--timeout", ["--timeout", "0"]),
        ("--slots", ["--slots", "0"]),
        ("-c", ["-c", "100000000"]),
        ("-t", ["-t", "0"]),
    ] {
        let err = serve_refused(&model, &args);
        assert!(err.contains(flag), "{args:?} does not name {flag}: {err}");
    }
}

#[test]
fn several_models_by_flag_and_directory_with_aliases() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let a = dir.path().join("a.gguf");
    write_tiny_qwen2(&a, 7);
    let zoo = dir.path().join("zoo");
    std::fs::create_dir(&zoo).unwrap();
    write_tiny_qwen2(&zoo.join("b.gguf"), 9);
    let err = serve_refused(&a, &["--alias", "x", "--alias", "y"]);
    assert!(err.contains("one --alias per --model"), "{err}");
    // Models of --models-dir are named by their file stems, never by --alias.
    let err = serve_refused_with(&["--models-dir", zoo.to_str().unwrap(), "--alias", "x"]);
    assert!(err.contains("one --alias per --model"), "{err}");
    let err = serve_refused(&a, &["--max-models", "0"]);
    assert!(err.contains("--max-models"), "{err}");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = serve_refused(&a, &["--models-dir", empty.to_str().unwrap()]);
    assert!(err.contains("holds no .gguf file"), "{err}");

    let (_server, addr) = serve(&[
        "-m",
        a.to_str().unwrap(),
        "--alias",
        "coder",
        "--models-dir",
        zoo.to_str().unwrap(),
        "--max-models",
        "2",
        "-c",
        "256",
        "--slots",
        "1",
        "-t",
        "1",
    ]);
    let models = http_get(&addr, "/v1/models");
    assert!(
        models.contains("\"id\":\"coder\"") && models.contains("\"id\":\"b\""),
        "{models}"
    );
    for (name, want) in [("coder", "coder"), ("b", "b"), ("nope", "model_not_found")] {
        let body = format!(r#"{{"model":"{name}","prompt":"x","max_tokens":2}}"#);
        let out = http_post(&addr, "/v1/completions", &body);
        assert!(out.contains(&format!("\"{want}\"")), "{name}: {out}");
    }
}

/// Starts a long greedy stream on a raw connection and returns it once the first token
/// has arrived, with what was read so far.
fn stream_in_flight(addr: &str) -> (TcpStream, String) {
    let body =
        r#"{"prompt":"1, 2, 3, 4, 5, 6, 7, 8,","max_tokens":1500,"temperature":0,"stream":true}"#;
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while !seen.contains("\"text\"") {
        // A signal meant for a server (or a child exiting) may interrupt the read.
        let n = match s.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => r.expect("the stream starts"),
        };
        assert!(n > 0, "the stream ended before its first token: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    (s, seen)
}

fn signal(server: &Server, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &server.0.id().to_string()])
        .status()
        .expect("run kill");
    assert!(ok.success(), "kill {sig}");
}

/// Waits up to `limit` for the server to exit; its status and when it exited.
fn exited(server: &mut Server, limit: Duration) -> (std::process::ExitStatus, Duration) {
    let t0 = Instant::now();
    loop {
        if let Some(st) = server.0.try_wait().expect("try_wait") {
            return (st, t0.elapsed());
        }
        assert!(
            t0.elapsed() < limit,
            "the server did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Serves the default model with one slot and `--shutdown-timeout SECS`.
fn serve_default_model_with_shutdown_timeout(secs: &str) -> (Server, String) {
    let model = minfer_hub::testing::default_model();
    let model = model.to_str().expect("UTF-8 path");
    serve(&[
        "-m",
        model,
        "--slots",
        "1",
        "-c",
        "2048",
        "-t",
        "2",
        "--shutdown-timeout",
        secs,
    ])
}

#[test]
fn sigterm_ends_a_stream_in_flight_cleanly_and_exits_within_the_shutdown_timeout() {
    let (mut server, addr) = serve_default_model_with_shutdown_timeout("1");
    let (mut s, mut seen) = stream_in_flight(&addr);
    // A client trickling its headers must not hold the exit up.
    let mut slow = TcpStream::connect(&addr).expect("connect");
    write!(slow, "GET /health HTTP/1.1\r\nHost: {addr}\r\nX-Slow: a").expect("send");
    let t0 = Instant::now();
    signal(&server, "-TERM");
    // The rest of the stream: cancelled after the shutdown timeout with an error event,
    // then [DONE], then a proper close (not a reset).
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)
        .expect("the stream ends with a clean close");
    seen.push_str(&String::from_utf8_lossy(&rest));
    let ended = t0.elapsed();
    let error = seen
        .find("shutting down")
        .unwrap_or_else(|| panic!("no error event: {seen}"));
    let done = seen
        .rfind("data: [DONE]")
        .unwrap_or_else(|| panic!("no [DONE]: {seen}"));
    assert!(error < done, "{seen}");
    assert!(
        seen.trim_end().ends_with("0"),
        "the chunked body is terminated: {seen}"
    );
    assert!(
        ended >= Duration::from_millis(900),
        "cancelled before the timeout: {ended:?}"
    );
    let (status, _) = exited(&mut server, Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "exit took {:?}",
        t0.elapsed()
    );
}

#[test]
fn a_second_signal_exits_at_once() {
    let (mut server, addr) = serve_default_model_with_shutdown_timeout("60");
    let (_s, _) = stream_in_flight(&addr);
    signal(&server, "-TERM");
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    signal(&server, "-INT");
    let (status, _) = exited(&mut server, Duration::from_secs(10));
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(status.code(), Some(130), "{status:?}");
}

#[test]
fn embeddings_through_the_openai_and_ollama_clients_equal_minfer_embed() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let texts = dir.path().join("texts.txt");
    let topics = [
        "rust", "python", "cats", "rain", "the sea", "graphs", "tokens", "music",
    ];
    let lines: Vec<String> = (0..64)
        .map(|i| format!("text number {i} about {}", topics[i % topics.len()]))
        .collect();
    std::fs::write(&texts, lines.join("\n") + "\n").expect("write the texts");
    let model = minfer_hub::testing::default_model();
    let out = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["embed", "-t", "2", "-m", model.to_str().unwrap(), "-f"])
        .arg(&texts)
        .output()
        .expect("run minfer embed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference = dir.path().join("reference.json");
    std::fs::write(&reference, &out.stdout).expect("write the reference");
    let (_server, addr) = serve(&[
        "-m",
        model.to_str().unwrap(),
        "--slots",
        "2",
        "-c",
        "2048",
        "-t",
        "2",
        "--rerank",
    ]);
    run_e2e_script(
        "e2e_embed.py",
        &[
            "--host",
            &format!("http://{addr}"),
            "--texts",
            texts.to_str().unwrap(),
            "--reference",
            reference.to_str().unwrap(),
        ],
    );
}
