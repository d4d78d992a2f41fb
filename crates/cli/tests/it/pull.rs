//! `minfer pull` end to end: the built binary against a local HTTP server.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A fresh MINFER_HOME, removed on drop.
struct Home(PathBuf);

impl Home {
    fn new(tag: &str) -> Home {
        let dir =
            std::env::temp_dir().join(format!("minfer-cli-pull-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Home(dir)
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn minfer(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(args)
        .env("MINFER_HOME", home)
        .output()
        .unwrap()
}

/// Serves `body` with Range support and a fixed ETag; the first response is cut off after
/// `cut` bytes. Returns the URL and a counter of requests served.
fn serve(body: Vec<u8>, cut: usize) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://{}/files/tiny-model.gguf",
        listener.local_addr().unwrap()
    );
    let count = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut start = 0;
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(r) = lower.strip_prefix("range: bytes=") {
                    start = r.trim().trim_end_matches('-').parse().unwrap_or(0);
                }
            }
            let n = seen.fetch_add(1, Ordering::SeqCst);
            let rest = &body[start.min(body.len())..];
            let status = if start > 0 {
                format!(
                    "206 Partial Content\r\nContent-Range: bytes {start}-{}/{}",
                    body.len() - 1,
                    body.len()
                )
            } else {
                "200 OK".to_string()
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nETag: \"v1\"\r\nConnection: close\r\n\r\n",
                rest.len()
            );
            let send = if n == 0 { &rest[..cut] } else { rest };
            let _ = stream
                .write_all(head.as_bytes())
                .and_then(|()| stream.write_all(send));
            let _ = stream.shutdown(Shutdown::Both);
        }
    });
    (url, count)
}

#[test]
fn pulls_a_url_resuming_after_a_dropped_connection() {
    let home = Home::new("url");
    // A real (if meaningless) GGUF: a pull is only declared good once the file parses.
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut w = minfer_gguf::GgufWriter::new();
    w.add_tensor_bytes("blob", &[50_000], minfer_gguf::GgmlType::F32, data)
        .unwrap();
    let body = w.to_bytes().unwrap();
    let (url, requests) = serve(body.clone(), 64_000);

    let out = minfer(&home.0, &["pull", &url]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pull failed: {stderr}");
    assert!(
        stderr.contains("pulling"),
        "no progress note on stderr: {stderr}"
    );
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(path.starts_with(home.0.join("models")), "{path:?}");
    assert!(
        path.to_string_lossy().ends_with("-tiny-model.gguf"),
        "{path:?}"
    );
    assert!(fs::read(&path).unwrap() == body, "pulled bytes differ");
    assert_eq!(
        requests.load(Ordering::SeqCst),
        2,
        "one cut-off request, one resume"
    );

    // Already present and verified: same path, no request.
    let again = minfer(&home.0, &["pull", &url]);
    assert!(again.status.success());
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).trim(),
        path.to_string_lossy()
    );
    assert_eq!(requests.load(Ordering::SeqCst), 2);
}

#[test]
fn lists_the_catalog() {
    let home = Home::new("list");
    let out = minfer(&home.0, &["pull", "--list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = stdout
        .lines()
        .find(|l| l.starts_with("qwen2.5-coder-0.5b "))
        .expect(&stdout);
    assert!(
        row.contains("491.4 MB") && row.contains("absent") && row.contains("(default)"),
        "{row}"
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("qwen2.5-coder-1.5b ")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&home.0.join("models").display().to_string()),
        "{stdout}"
    );
}

#[test]
fn unknown_names_fail_with_the_known_ones() {
    let home = Home::new("unknown");
    let out = minfer(&home.0, &["pull", "no-such-model"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown model \"no-such-model\"") && stderr.contains("qwen2.5-coder-0.5b"),
        "{stderr}"
    );
    assert!(
        !home.0.join("models").exists(),
        "nothing may be created for a bad name"
    );
}
