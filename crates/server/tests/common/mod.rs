//! Shared helpers: a tiny model on disk, a server on a loopback port, SSE parsing.
#![allow(dead_code)]

pub mod mixed;
pub mod python;
pub mod spec;

use std::path::PathBuf;

use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model, TinySpec};
use minfer_server::{start, Config, Running};
use serde_json::Value;

/// A tiny Qwen2 written to a temporary directory (kept alive by the returned guard).
pub fn tiny_model() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("tiny-qwen2.gguf");
    write_tiny_model(&path, &TinySpec::qwen2(GgmlType::Q8_0, 7)).expect("writing the tiny model");
    (dir, path)
}

/// A config for the tiny model on an ephemeral loopback port: `slots` slots of 256
/// positions, one inference thread.
pub fn tiny_config(path: &std::path::Path, slots: usize) -> Config {
    let mut c = Config::new(path);
    c.port = 0;
    c.slots = slots;
    c.ctx = Some(256 * slots);
    c.threads = Some(1);
    c
}

/// A started server and the model directory it reads.
pub struct TestServer {
    pub running: Running,
    pub base: String,
    pub _dir: Option<tempfile::TempDir>,
}

impl TestServer {
    /// Stops the server gracefully (see `Running::stop`), keeping the model until then.
    pub fn stop(self) -> Result<(), minfer_server::ServerError> {
        let TestServer { running, _dir, .. } = self;
        running.stop()
    }
}

/// Starts a tiny-model server, letting `edit` adjust the config first.
pub fn tiny_server(slots: usize, edit: impl FnOnce(&mut Config)) -> TestServer {
    let (dir, path) = tiny_model();
    let mut c = tiny_config(&path, slots);
    edit(&mut c);
    let running = start(c).expect("starting the server");
    let base = format!("http://{}", running.addr());
    TestServer {
        running,
        base,
        _dir: Some(dir),
    }
}

/// Starts a one-slot server on a tiny Qwen3 (seed 11) whose GGUF carries the chat
/// `template`, served as model `name`, for tests of what a template sets up (reasoning,
/// call formats).
pub fn tiny_server_with_template(name: &str, template: &str) -> TestServer {
    tiny_server_with_template_and(name, template, |_| {})
}

/// [`tiny_server_with_template`] with `edit` applied to the server's configuration.
pub fn tiny_server_with_template_and(
    name: &str,
    template: &str,
    edit: impl FnOnce(&mut Config),
) -> TestServer {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join(format!("{name}.gguf"));
    minfer_models::testing::write_tiny_model_with_template(
        &path,
        &TinySpec::qwen3(GgmlType::Q8_0, 11),
        template,
    )
    .expect("writing the tiny model");
    let mut cfg = tiny_config(&path, 1);
    edit(&mut cfg);
    let running = start(cfg).expect("starting the server");
    TestServer {
        base: format!("http://{}", running.addr()),
        running,
        _dir: Some(dir),
    }
}

/// Starts a one-slot server on the tiny F32 BERT encoder (embeddings only).
pub fn tiny_bert_server() -> TestServer {
    let spec =
        minfer_models::testing::TinyBert::new(GgmlType::F32, minfer_models::testing::BERT_SEED);
    bert_server(&spec, |_| {})
}

/// Starts a one-slot server on the tiny BERT `spec` describes, its config edited by `edit`.
pub fn bert_server(
    spec: &minfer_models::testing::TinyBert,
    edit: impl FnOnce(&mut Config),
) -> TestServer {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("tiny-bert.gguf");
    minfer_models::testing::write_tiny_bert(&path, spec).expect("writing the tiny BERT");
    let mut c = tiny_config(&path, 1);
    edit(&mut c);
    let running = start(c).expect("starting the server");
    TestServer {
        base: format!("http://{}", running.addr()),
        running,
        _dir: Some(dir),
    }
}

/// The real default model, or a loud failure telling how to get it.
pub fn real_model() -> PathBuf {
    minfer_hub::testing::default_model()
}

/// A client without connection reuse surprises.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .expect("HTTP client")
}

/// POSTs JSON and returns (status, response headers, body text).
pub async fn post_text(
    base: &str,
    path: &str,
    body: Value,
) -> (u16, reqwest::header::HeaderMap, String) {
    let r = client()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.expect("body");
    (status, headers, text)
}

/// POSTs JSON and returns (status, parsed body).
pub async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let (status, _, text) = post_text(base, path, body).await;
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, v)
}

/// GETs and returns (status, body text).
pub async fn get(base: &str, path: &str) -> (u16, String) {
    let r = client()
        .get(format!("{base}{path}"))
        .send()
        .await
        .expect("request");
    (r.status().as_u16(), r.text().await.expect("body"))
}

/// The `data:` payloads of an SSE body, in order.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|frame| {
            let lines: Vec<&str> = frame
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|l| l.strip_prefix(' ').unwrap_or(l))
                .collect();
            (!lines.is_empty()).then(|| lines.join("\n"))
        })
        .collect()
}

/// POSTs a streaming request and returns (status, data payloads).
pub async fn post_stream(base: &str, path: &str, body: Value) -> (u16, Vec<String>) {
    let r = client()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    (status, sse_data(&text))
}

/// Text of a streamed chat or completion, its finish reason and its usage (if sent).
pub fn stream_summary(frames: &[String]) -> (String, Option<String>, Option<Value>) {
    assert_eq!(
        frames.last().map(String::as_str),
        Some("[DONE]"),
        "{frames:?}"
    );
    let mut text = String::new();
    let mut finish = None;
    let mut usage = None;
    for f in &frames[..frames.len() - 1] {
        let v: Value = serde_json::from_str(f).expect("frame is JSON");
        assert!(v.get("error").is_none(), "error frame: {f}");
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = Some(u.clone());
        }
        for c in v["choices"].as_array().expect("choices") {
            if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(t) = c["text"].as_str() {
                text.push_str(t);
            }
            if let Some(r) = c["finish_reason"].as_str() {
                finish = Some(r.to_string());
            }
        }
    }
    (text, finish, usage)
}

/// Resident set size of this process, in kB.
pub fn rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS line")
}

/// A raw request `head` (`METHOD /path`) with `headers` (each ending in CRLF) and
/// `body`, sent by [`raw`]: its answer's status and JSON body (panics on no JSON).
pub fn raw_json(addr: std::net::SocketAddr, head: &str, headers: &str, body: &str) -> (u16, Value) {
    let a = raw(
        addr,
        &format!(
            "{head} HTTP/1.1\r\nHost: {addr}\r\n{headers}content-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        ),
    );
    let status = a
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("status in {a}"));
    let text = a.split("\r\n\r\n").nth(1).unwrap_or("");
    let v = serde_json::from_str(text).unwrap_or_else(|_| panic!("JSON body in {a}"));
    (status, v)
}

/// Sends `request` verbatim on a fresh connection and returns everything the server
/// answers until it closes (requests should say `Connection: close`).
pub fn raw(addr: std::net::SocketAddr, request: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("read timeout");
    s.write_all(request.as_bytes()).expect("send");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// The value of header `name` (lower-case) in a raw HTTP answer.
pub fn raw_header(answer: &str, name: &str) -> Option<String> {
    let head = answer.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}
