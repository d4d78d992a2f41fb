//! Test fixtures: temporary directories and a scriptable local HTTP/1.1 server with Range.

#![allow(dead_code)] // Each test file uses a different subset.

use std::collections::VecDeque;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("minfer-hub-it-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Deterministic filler bytes behind a GGUF magic, so content checks are meaningful.
pub fn gguf_bytes(len: usize) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    let mut x: u32 = 0x1234_5678;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        v.push(x as u8);
    }
    v.truncate(len);
    v
}

/// How the server answers one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Honour Range, send everything.
    Full,
    /// Announce the full length, send this many body bytes, then close the connection.
    DropAfter(usize),
    /// Reply with this status and an empty body.
    Status(u16),
    /// Ignore Range and send the whole file with 200.
    IgnoreRange,
    /// Honour Range but append this many extra bytes (a broken server).
    Overlong(usize),
}

struct State {
    body: Vec<u8>,
    script: VecDeque<Mode>,
    /// The Range header of every request to the file, in order.
    ranges: Vec<Option<String>>,
}

/// Serves one file at `/model.gguf` (404 elsewhere), one connection at a time.
pub struct Server {
    base: String,
    state: Arc<Mutex<State>>,
}

impl Server {
    pub fn start(body: Vec<u8>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            body,
            script: VecDeque::new(),
            ranges: Vec::new(),
        }));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = serve(stream, &shared);
            }
        });
        Server { base, state }
    }

    pub fn url(&self) -> String {
        format!("{}/model.gguf", self.base)
    }

    pub fn missing_url(&self) -> String {
        format!("{}/missing.gguf", self.base)
    }

    /// Queues modes for the next requests; once used up, requests get [`Mode::Full`].
    pub fn script(&self, modes: &[Mode]) {
        self.state
            .lock()
            .unwrap()
            .script
            .extend(modes.iter().copied());
    }

    pub fn ranges(&self) -> Vec<Option<String>> {
        self.state.lock().unwrap().ranges.clone()
    }
}

fn serve(stream: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("range") {
                range = Some(v.trim().to_string());
            }
        }
    }
    let mut out = stream;
    if request_line.split_whitespace().nth(1) != Some("/model.gguf") {
        return respond(&mut out, "404 Not Found", &[], b"", None);
    }
    let (mode, body) = {
        let mut st = state.lock().unwrap();
        st.ranges.push(range.clone());
        (st.script.pop_front().unwrap_or(Mode::Full), st.body.clone())
    };
    let len = body.len();
    let start = match (mode, &range) {
        (Mode::IgnoreRange, _) | (_, None) => None,
        (_, Some(r)) => r
            .strip_prefix("bytes=")
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|s| s.parse::<usize>().ok()),
    };
    if let Mode::Status(code) = mode {
        return respond(&mut out, &format!("{code} Scripted"), &[], b"", None);
    }
    if start.is_some_and(|s| s >= len) {
        let cr = format!("Content-Range: bytes */{len}");
        return respond(&mut out, "416 Range Not Satisfiable", &[cr], b"", None);
    }
    let (status, headers, mut payload) = match start {
        Some(s) => (
            "206 Partial Content",
            vec![format!("Content-Range: bytes {s}-{}/{len}", len - 1)],
            body[s..].to_vec(),
        ),
        None => ("200 OK", vec![], body),
    };
    if let Mode::Overlong(extra) = mode {
        payload.resize(payload.len() + extra, 0xAB);
    }
    let cut = match mode {
        Mode::DropAfter(k) => Some(k.min(payload.len())),
        _ => None,
    };
    respond(&mut out, status, &headers, &payload, cut)
}

fn respond(
    out: &mut TcpStream,
    status: &str,
    headers: &[String],
    body: &[u8],
    cut: Option<usize>,
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    out.write_all(&body[..cut.unwrap_or(body.len())])?;
    out.flush()?;
    out.shutdown(Shutdown::Both)
}
