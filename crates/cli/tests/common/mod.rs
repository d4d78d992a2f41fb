//! Shared by the binary's integration tests: `minfer` run under a home of its own, the
//! tiny model they run, `minfer serve` started on a loopback port and killed when the
//! test ends, and a raw HTTP/1.1 request to it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model, TinySpec};

/// The home (`MINFER_HOME`) of one test file's runs, `tag` naming the file: a fixed
/// directory under the system temp dir, so the runs never touch the user's models.
pub fn test_home(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("minfer-{tag}-test-home"))
}

/// A `minfer` command under `home`, with no backend fence inherited from the
/// environment (a test that fences says so in its arguments).
pub fn minfer_command(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_minfer"));
    c.env("MINFER_HOME", home).env_remove("MINFER_BACKENDS");
    c
}

/// Runs `cmd` with `input` written to its stdin through a pipe; what it printed once it
/// exits.
pub fn run_piped(cmd: &mut Command, input: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run minfer");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("wait")
}

/// Writes the tiny Qwen2 the tests run (Q8_0 matrices, PRNG seed `seed`) at `path`.
pub fn write_tiny_qwen2(path: &Path, seed: u64) {
    write_tiny_model(path, &TinySpec::qwen2(GgmlType::Q8_0, seed)).expect("write tiny model");
}

/// The tiny Qwen2 of seed 7, written into `dir` as `tiny-qwen2.gguf`.
pub fn tiny_qwen2(dir: &Path) -> PathBuf {
    let p = dir.join("tiny-qwen2.gguf");
    write_tiny_qwen2(&p, 7);
    p
}

/// A `minfer serve` process, killed when the test ends, however it ends.
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `cmd`, a `minfer serve` command, with its log on a pipe; returns the server
/// and the address it prints once listening (within two minutes, else a failure).
pub fn start_server(cmd: &mut Command) -> (Server, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start minfer serve");
    let stderr = child.stderr.take().expect("stderr");
    let server = Server(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Keep draining the log so the server never blocks on a full pipe.
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(addr) = line.split("listening on http://").nth(1) {
                let _ = tx.send(addr.trim().to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the server prints its address");
    (server, addr)
}

/// One request on a fresh connection that the server closes after answering: `head` is
/// the method and path (`"POST /v1/completions"`), `body` JSON (empty for none). The
/// whole raw response, status line and headers included; a silent server fails the
/// test after two minutes instead of hanging it.
pub fn http(addr: &str, head: &str, body: &str) -> String {
    http_with(
        addr,
        head,
        &[("host", addr), ("content-type", "application/json")],
        body,
    )
}

/// [`http`] with exactly the given headers (besides the length and `connection: close`),
/// for requests that must carry a foreign `Host`, an `Origin` or another content type.
pub fn http_with(addr: &str, head: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let mut req = format!("{head} HTTP/1.1\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!(
        "content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    ));
    s.write_all(req.as_bytes()).expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read response");
    out
}

/// The number that ends right before the first `marker` in `text`; panics, quoting
/// `text`, where there is none.
pub fn number_before(text: &str, marker: &str) -> usize {
    text.split(marker)
        .next()
        .and_then(|s| s.rsplit(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number before `{marker}` in:\n{text}"))
}

/// A refused invocation: non-zero exit, stderr naming `needle`, no panic.
pub fn assert_refused(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(
        err.contains(needle),
        "stderr does not name `{needle}`: {err}"
    );
}

/// A running `minfer viz`, stopped on drop.
pub struct Viz {
    child: Child,
    /// The page's address as the server printed it (`http://HOST:PORT/`).
    pub url: String,
}

impl Viz {
    /// `HOST:PORT` of the page, for raw requests.
    pub fn addr(&self) -> String {
        self.url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string()
    }
}

impl Drop for Viz {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `minfer viz ARGS --port 0 -t 2` (no backend fence or trace inherited) and
/// waits for the address it prints.
pub fn start_viz(args: &[&str]) -> Viz {
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg("viz")
        .args(args)
        .args(["--port", "0", "-t", "2"])
        .env_remove("MINFER_BACKENDS")
        .env_remove("MINFER_TRACE")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start minfer viz");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let url = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            panic!("minfer viz exited before listening");
        };
        if let Some(u) = line.strip_prefix("minfer viz: open ") {
            break u.trim().to_string();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Viz { child, url }
}
