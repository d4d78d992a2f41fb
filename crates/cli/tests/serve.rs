//! The real `minfer serve` binary on a loopback port, driven by real clients: a raw
//! HTTP request and the official `openai` Python package (scripts/e2e_openai.py).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Kills the server when the test ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `minfer serve` on an ephemeral port and returns it with its address.
fn serve(args: &[&str]) -> (Server, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg("serve")
        .args(args)
        .args(["--host", "127.0.0.1", "--port", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start minfer serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Keep draining the log so the server never blocks on a full pipe.
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(addr) = line.split("listening on http://").nth(1) {
                let _ = tx.send(addr.trim().to_string());
            }
        }
    });
    let server = Server(child);
    let addr = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the server prints its address");
    (server, addr)
}

fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read response");
    out
}

#[test]
fn openai_python_client_against_the_minfer_serve_binary() {
    let probe = Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .expect("python3 runs");
    assert!(
        probe.status.success(),
        "the openai Python package is not importable (scripts/test.sh installs it with \
         `python3 -m pip install openai`): {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let model = minfer_hub::default_model_path();
    assert!(
        model.exists(),
        "run `minfer pull` first: {} is missing",
        model.display()
    );
    let (_server, addr) = serve(&[
        "-m",
        model.to_str().unwrap(),
        "--slots",
        "2",
        "-c",
        "2048",
        "-t",
        "2",
    ]);
    let health = http_get(&addr, "/health");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let missing = http_get(&addr, "/v2/nothing");
    assert!(
        missing.starts_with("HTTP/1.1 404") && missing.contains("\"error\""),
        "{missing}"
    );
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/e2e_openai.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["--base-url", &format!("http://{addr}/v1")])
        .output()
        .expect("run the e2e script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("e2e ok"),
        "e2e script failed\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `minfer serve` on a tiny model with `args`, which must make it exit on its own
/// with an error (a server that starts instead is killed and the test fails).
fn serve_refused(model: &std::path::Path, args: &[&str]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg("serve")
        .arg("-m")
        .arg(model)
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
    let model = dir.path().join("tiny-qwen2.gguf");
    minfer_models::testing::write_tiny_model(
        &model,
        &minfer_models::testing::TinySpec::qwen2(minfer_gguf::GgmlType::Q8_0, 7),
    )
    .expect("write tiny model");
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
