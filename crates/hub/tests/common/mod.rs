//! Test fixtures: temporary directories and a scriptable local HTTP/1.1 server with Range.

#![allow(dead_code)] // Each test file uses a different subset.

use minfer_gguf::{GgmlType, GgufWriter, MetaValue};
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

/// A valid GGUF file of exactly `len` bytes: one F32 tensor whose data is deterministic
/// filler drawn from `seed`, covering all but the last few (under 32) bytes of the file, so
/// cutting the file almost anywhere cuts the tensor and content checks are meaningful.
pub fn gguf_bytes_seeded(len: usize, seed: u32) -> Vec<u8> {
    let mut rng = minfer_testkit::Rng::new(u64::from(seed));
    let mut filler = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.next_u64() as u8).collect() };
    let build = |data: Vec<u8>| {
        let mut w = GgufWriter::new();
        w.add_meta("general.architecture", MetaValue::String("test".into()));
        let dims = [data.len() as u64 / 4];
        w.add_tensor_bytes("blob", &dims, GgmlType::F32, data)
            .unwrap();
        w.to_bytes().unwrap()
    };
    let header = build(Vec::new()).len();
    assert!(len >= header, "a GGUF needs at least {header} bytes");
    // The writer pads tensor data to 32 bytes; the remainder is appended after the tensor,
    // where the format allows trailing bytes.
    let mut bytes = build(filler((len - header) / 32 * 32));
    let rest = len - bytes.len();
    bytes.extend(filler(rest));
    assert_eq!(bytes.len(), len);
    bytes
}

/// [`gguf_bytes_seeded`] with a fixed seed.
pub fn gguf_bytes(len: usize) -> Vec<u8> {
    gguf_bytes_seeded(len, 0x1234_5678)
}

/// How the server answers one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Honour Range (subject to If-Range), send everything.
    Full,
    /// Announce the full length, send this many body bytes, then close the connection.
    DropAfter(usize),
    /// Reply with this status and an empty body.
    Status(u16),
    /// Ignore Range and send the whole file with 200.
    IgnoreRange,
    /// Honour Range but append this many extra bytes (a broken server).
    Overlong(usize),
    /// Send no Content-Length: at most this many body bytes, then close (the end of the
    /// connection is the end of the body, so a cut looks complete).
    NoLength(usize),
    /// Honour Range even when If-Range does not match (a broken server).
    IgnoreIfRange,
    /// Wait this many milliseconds, then answer as [`Mode::Full`].
    Delay(u64),
}

/// The headers of one request to the file that matter to resuming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub range: Option<String>,
    pub if_range: Option<String>,
}

/// The version of the file the server has, and how it identifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub body: Vec<u8>,
    /// Sent as `ETag` (include the quotes, or `W/` for a weak one).
    pub etag: Option<String>,
    /// Sent as `Last-Modified`.
    pub last_modified: Option<String>,
}

impl Version {
    /// `body` with a strong ETag and a Last-Modified date.
    pub fn tagged(body: Vec<u8>, tag: &str) -> Version {
        Version {
            body,
            etag: Some(format!("\"{tag}\"")),
            last_modified: Some("Tue, 01 Dec 2026 09:00:00 GMT".into()),
        }
    }
}

struct State {
    version: Version,
    script: VecDeque<Mode>,
    /// Every request to the file, in order.
    seen: Vec<Seen>,
}

/// Serves one file at `/model.gguf` (404 elsewhere), one connection at a time, with Range
/// and If-Range as a conforming server does (unless scripted otherwise).
pub struct Server {
    base: String,
    state: Arc<Mutex<State>>,
}

impl Server {
    /// Serves `body` with a strong ETag and a Last-Modified date.
    pub fn start(body: Vec<u8>) -> Server {
        Server::start_version(Version::tagged(body, "v1"))
    }

    pub fn start_version(version: Version) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            version,
            script: VecDeque::new(),
            seen: Vec::new(),
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

    /// Replaces the file (a new upload at the same URL).
    pub fn publish(&self, version: Version) {
        self.state.lock().unwrap().version = version;
    }

    pub fn ranges(&self) -> Vec<Option<String>> {
        self.seen().into_iter().map(|s| s.range).collect()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }
}

fn serve(stream: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let (mut range, mut if_range) = (None, None);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("range") {
                range = Some(v.trim().to_string());
            } else if k.eq_ignore_ascii_case("if-range") {
                if_range = Some(v.trim().to_string());
            }
        }
    }
    let mut out = stream;
    if request_line.split_whitespace().nth(1) != Some("/model.gguf") {
        return respond(&mut out, "404 Not Found", &[], b"", None, true);
    }
    let (mode, version) = {
        let mut st = state.lock().unwrap();
        st.seen.push(Seen {
            range: range.clone(),
            if_range: if_range.clone(),
        });
        (
            st.script.pop_front().unwrap_or(Mode::Full),
            st.version.clone(),
        )
    };
    if let Mode::Delay(ms) = mode {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    let body = &version.body;
    let len = body.len();
    // RFC 9110 13.1.5: a Range is honoured only if If-Range (when sent) matches the current
    // strong ETag or Last-Modified exactly; otherwise the whole file is sent with 200.
    let matches = |v: &str| {
        let strong = version.etag.as_deref().filter(|e| !e.starts_with("W/"));
        Some(v) == strong || Some(v) == version.last_modified.as_deref()
    };
    let range_applies = match (mode, if_range.as_deref()) {
        (Mode::IgnoreRange, _) => false,
        (Mode::IgnoreIfRange, _) | (_, None) => true,
        (_, Some(v)) => matches(v),
    };
    let start = range
        .as_deref()
        .filter(|_| range_applies)
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|s| s.parse::<usize>().ok());
    let mut headers = Vec::new();
    if let Some(e) = &version.etag {
        headers.push(format!("ETag: {e}"));
    }
    if let Some(m) = &version.last_modified {
        headers.push(format!("Last-Modified: {m}"));
    }
    if let Mode::Status(code) = mode {
        return respond(&mut out, &format!("{code} Scripted"), &[], b"", None, true);
    }
    if start.is_some_and(|s| s >= len) {
        headers.push(format!("Content-Range: bytes */{len}"));
        return respond(
            &mut out,
            "416 Range Not Satisfiable",
            &headers,
            b"",
            None,
            true,
        );
    }
    let (status, mut payload) = match start {
        Some(s) => {
            headers.push(format!("Content-Range: bytes {s}-{}/{len}", len - 1));
            ("206 Partial Content", body[s..].to_vec())
        }
        None => ("200 OK", body.clone()),
    };
    if let Mode::Overlong(extra) = mode {
        payload.resize(payload.len() + extra, 0xAB);
    }
    let cut = match mode {
        Mode::DropAfter(k) | Mode::NoLength(k) => Some(k.min(payload.len())),
        _ => None,
    };
    let with_length = !matches!(mode, Mode::NoLength(_));
    respond(&mut out, status, &headers, &payload, cut, with_length)
}

fn respond(
    out: &mut TcpStream,
    status: &str,
    headers: &[String],
    body: &[u8],
    cut: Option<usize>,
    with_length: bool,
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    if with_length {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
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
