//! Pulling a GGUF file from an `http(s)://` URL, resumable with Range requests.
//!
//! An interrupted download resumes with `Range` plus `If-Range` (the ETag, or Last-Modified),
//! so a file replaced on the server in between is fetched whole instead of spliced onto the
//! old one's start; without a validator it is never resumed.
//!
//! No digest is known in advance, so the download is verified by its length (Content-Length,
//! or the total in Content-Range) and by parsing it as GGUF with all tensor data inside the
//! file (which also catches a body cut short without a Content-Length); its sha256 is then
//! recorded in the stamp so later runs can trust the file without the network.

use crate::progress::Progress;
use crate::store::{self, hex, Store};
use crate::HubError;
use sha2::{Digest, Sha256};
use std::error::Error as StdError;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How hard a URL pull tries before giving up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Consecutive failed attempts allowed; an attempt that received data resets the count.
    pub attempts: u32,
    /// Pause before the first retry; doubled after each failure, capped at 16 s.
    pub first_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            first_delay: Duration::from_secs(1),
        }
    }
}

/// Whether `spec` is an `http://` or `https://` URL (scheme case-insensitive).
pub fn is_url(spec: &str) -> bool {
    let lower = spec.get(..8).unwrap_or(spec).to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// Store file name for a URL: a 12-hex-digit hash of the whole URL (so two URLs never share a
/// file), a dash, and the last path segment reduced to `[A-Za-z0-9._-]`, ending in `.gguf`.
pub fn url_file_name(url: &str) -> Result<String, HubError> {
    let bad = |reason: &str| HubError::BadUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    if !is_url(url) {
        return Err(bad("only http:// and https:// URLs can be pulled"));
    }
    if url.chars().any(char::is_whitespace) {
        return Err(bad("it contains blanks"));
    }
    let rest = url.split_once("://").map_or("", |(_, r)| r);
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    if host.is_empty() {
        return Err(bad("it has no host"));
    }
    let segment = path.rsplit('/').find(|s| !s.is_empty()).unwrap_or("");
    let clean: String = segment
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(96)
        .collect();
    let mut name = clean.trim_start_matches('.').to_string();
    if name.is_empty() {
        name = "model".into();
    }
    if !name.to_ascii_lowercase().ends_with(".gguf") {
        name.push_str(".gguf");
    }
    let digest = hex(&Sha256::digest(url.as_bytes()));
    Ok(format!("{}-{name}", &digest[..12]))
}

/// Pulls `url` into `store` unless a verified copy is there; returns the local path.
///
/// One pull of a URL runs at a time (a second one waits for the first); leftovers of
/// interrupted pulls are resumed from when the server confirms the file is unchanged, and
/// removed once the file is verified.
pub fn pull_url(
    url: &str,
    store: &Store,
    progress: bool,
    retry: &RetryPolicy,
) -> Result<PathBuf, HubError> {
    let file_name = url_file_name(url)?;
    let target = store.model_path(&file_name);
    if store.stamped_digest(&file_name, None).is_some() && !store.has_temporaries(&file_name) {
        return Ok(target);
    }
    let progress = Progress { enabled: progress };
    let _lock = store.lock(&file_name, progress)?;
    // Checked again under the lock: a concurrent pull may have finished meanwhile.
    if store.stamped_digest(&file_name, None).is_some() {
        store.remove_temporaries(&file_name)?;
        return Ok(target);
    }
    progress.note(&format!("pulling {url} into {}", target.display()));
    let partial = store.partial_path(&file_name);
    let validator = store.validator_path(&file_name);
    let total = download(url, &partial, &validator, progress, retry)?;
    let discard = || -> Result<(), HubError> {
        store::remove_file_if_present(&partial)?;
        store::remove_file_if_present(&validator)
    };
    let actual = fs::metadata(&partial)
        .map_err(|e| HubError::io("inspect", &partial, e))?
        .len();
    if let Some(expected) = total.filter(|&t| t != actual) {
        discard()?;
        return Err(HubError::SizeMismatch {
            name: url.into(),
            expected,
            actual,
        });
    }
    if let Err(e) = check_magic(url, &partial).and_then(|()| store::check_gguf(url, &partial)) {
        discard()?;
        return Err(e);
    }
    let bar = progress.bytes(Some(actual), format!("{file_name} verifying"));
    let digest = store::sha256_file(&partial, &bar);
    bar.finish_and_clear();
    store.write_stamp(&file_name, &partial, &digest?)?;
    let path = store.commit(&partial, &file_name)?;
    store::remove_file_if_present(&validator)?;
    Ok(path)
}

fn check_magic(url: &str, partial: &Path) -> Result<(), HubError> {
    let mut head = Vec::with_capacity(16);
    let file = File::open(partial).map_err(|e| HubError::io("open", partial, e))?;
    file.take(16)
        .read_to_end(&mut head)
        .map_err(|e| HubError::io("read", partial, e))?;
    if head.starts_with(b"GGUF") {
        return Ok(());
    }
    Err(HubError::NotGguf {
        url: url.into(),
        head: head.escape_ascii().to_string(),
    })
}

/// What identifies the version of the file a partial holds, as the server described it.
///
/// Kept beside the partial so a later attempt (or a later pull) resumes only that version:
/// the resume request carries it in `If-Range`, so a server whose file changed answers with
/// the whole new file instead of the tail of a different one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Validator {
    etag: Option<String>,
    last_modified: Option<String>,
    size: Option<u64>,
}

impl Validator {
    fn from_headers(headers: &ureq::http::HeaderMap, size: Option<u64>) -> Self {
        let get = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        Validator {
            etag: get("etag"),
            last_modified: get("last-modified"),
            size,
        }
    }

    /// The `If-Range` value: a strong ETag, else Last-Modified. A weak ETag may not be sent
    /// in If-Range (RFC 9110, 13.1.5), and without either there is nothing to resume safely.
    fn if_range(&self) -> Option<&str> {
        self.etag
            .as_deref()
            .filter(|e| !e.starts_with("W/"))
            .or(self.last_modified.as_deref())
    }

    /// Whether `answer` (a response's validators) shows a different version of the file.
    /// A server that honours Range but ignores If-Range is caught here.
    fn contradicts(&self, answer: &Validator) -> bool {
        fn differ<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
            matches!((a, b), (Some(a), Some(b)) if a != b)
        }
        differ(&self.etag, &answer.etag)
            || differ(&self.last_modified, &answer.last_modified)
            || differ(&self.size, &answer.size)
    }

    /// The validator saved at `path`; `None` if there is none or it is unreadable.
    fn load(path: &Path) -> Option<Validator> {
        let text = fs::read_to_string(path).ok()?;
        let mut v = Validator::default();
        for line in text.lines() {
            let (key, value) = line.split_once('=')?;
            match key {
                "etag" => v.etag = Some(value.to_string()),
                "last-modified" => v.last_modified = Some(value.to_string()),
                "size" => v.size = Some(value.parse().ok()?),
                _ => return None,
            }
        }
        Some(v)
    }

    /// Saves the validator at `path`, or removes the file when there is nothing to save.
    fn save(&self, path: &Path) -> Result<(), HubError> {
        if self.etag.is_none() && self.last_modified.is_none() {
            return store::remove_file_if_present(path);
        }
        let mut text = String::new();
        if let Some(e) = &self.etag {
            text.push_str(&format!("etag={e}\n"));
        }
        if let Some(m) = &self.last_modified {
            text.push_str(&format!("last-modified={m}\n"));
        }
        if let Some(s) = self.size {
            text.push_str(&format!("size={s}\n"));
        }
        fs::write(path, text).map_err(|e| HubError::io("write", path, e))
    }
}

/// Why one attempt ended without the whole file.
enum Failure {
    /// Worth retrying (network trouble, 5xx, short body); the partial keeps what arrived.
    Retry(Box<dyn StdError + Send + Sync>),
    /// Retrying cannot help.
    Fatal(HubError),
}

fn retry(msg: impl Into<String>) -> Failure {
    Failure::Retry(msg.into().into())
}

/// Runs attempts until the partial holds the whole body; returns the total size if known.
fn download(
    url: &str,
    partial: &Path,
    validator: &Path,
    progress: Progress,
    policy: &RetryPolicy,
) -> Result<Option<u64>, HubError> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .timeout_per_read(Some(Duration::from_secs(60)))
        .user_agent(concat!("minfer/", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let bar = progress.bytes(None, url_file_name(url)?);
    let mut known_total = None;
    let (mut failures, mut delay) = (0u32, policy.first_delay);
    let outcome = loop {
        let before = file_len(partial);
        match attempt(&agent, url, partial, validator, &mut known_total, &bar) {
            Ok(total) => break Ok(total),
            Err(Failure::Fatal(e)) => break Err(e),
            Err(Failure::Retry(cause)) => {
                // Progress made means the link works; only consecutive fruitless tries count.
                if file_len(partial) > before {
                    failures = 0;
                    delay = policy.first_delay;
                }
                failures += 1;
                if failures >= policy.attempts.max(1) {
                    break Err(HubError::Download {
                        url: url.into(),
                        attempts: failures,
                        source: cause,
                    });
                }
                bar.suspend(|| progress.note(&format!("{url}: {cause}; retrying")));
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_secs(16));
            }
        }
    };
    bar.finish_and_clear();
    outcome
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map_or(0, |m| m.len())
}

/// Empties the partial and forgets its validator: what follows starts from byte 0.
fn start_over(partial: &Path, validator: &Path) -> Result<(), HubError> {
    File::create(partial).map_err(|e| HubError::io("truncate", partial, e))?;
    store::remove_file_if_present(validator)
}

/// One request: resumes from the partial's length when its validator allows, else restarts.
fn attempt(
    agent: &ureq::Agent,
    url: &str,
    partial: &Path,
    validator_path: &Path,
    known_total: &mut Option<u64>,
    bar: &indicatif::ProgressBar,
) -> Result<Option<u64>, Failure> {
    let mut have = file_len(partial);
    let mut stored = Validator::load(validator_path).filter(|_| have > 0);
    let if_range = stored
        .as_ref()
        .and_then(Validator::if_range)
        .map(str::to_owned);
    if have > 0 && if_range.is_none() {
        // Without a validator nothing proves the server still has the file these bytes came
        // from; appending its current tail could splice two versions into one file.
        start_over(partial, validator_path).map_err(Failure::Fatal)?;
        (have, stored) = (0, None);
    }
    if known_total.is_none() {
        *known_total = stored.as_ref().and_then(|v| v.size);
    }
    let mut request = agent.get(url);
    if let Some(value) = if_range.filter(|_| have > 0) {
        request = request
            .header("Range", format!("bytes={have}-"))
            .header("If-Range", value);
    }
    let response = match request.call() {
        Ok(r) => r,
        Err(e @ (ureq::Error::BadUri(_) | ureq::Error::Http(_))) => {
            return Err(Failure::Fatal(HubError::BadUrl {
                url: url.into(),
                reason: e.to_string(),
            }));
        }
        Err(e) => return Err(Failure::Retry(Box::new(e))),
    };
    let status = response.status().as_u16();
    let content_range = response
        .headers()
        .get("content-range")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let restart = |why: String| -> Failure {
        match start_over(partial, validator_path) {
            Ok(()) => retry(why),
            Err(e) => Failure::Fatal(e),
        }
    };
    let changed = |answer: &Validator| stored.as_ref().is_some_and(|s| s.contradicts(answer));
    let (append, total) = match status {
        206 => {
            let Some((start, total)) = content_range.as_deref().and_then(parse_content_range)
            else {
                let reason = format!("206 with unusable Content-Range {content_range:?}");
                return Err(Failure::Fatal(HubError::BadResponse {
                    url: url.into(),
                    reason,
                }));
            };
            if changed(&Validator::from_headers(response.headers(), total)) {
                return Err(restart(
                    "the file changed on the server since the partial download; restarting".into(),
                ));
            }
            if start != have {
                return Err(restart(format!(
                    "server resumed at byte {start}, not {have}; restarting"
                )));
            }
            (have > 0, total)
        }
        // Also the answer to a resume whose If-Range no longer matches: the file changed, and
        // this is the whole new one.
        200 => (false, response.body().content_length()),
        416 => {
            let total = content_range.as_deref().and_then(parse_unsatisfied_range);
            let same = !changed(&Validator::from_headers(response.headers(), total));
            if have > 0 && same && total == Some(have) && known_total.is_none_or(|t| t == have) {
                return Ok(total);
            }
            return Err(restart(
                "server cannot resume this partial; restarting".into(),
            ));
        }
        408 | 429 | 500..=599 => return Err(retry(format!("HTTP status {status}"))),
        _ => {
            return Err(Failure::Fatal(HubError::HttpStatus {
                url: url.into(),
                status,
            }))
        }
    };
    if let (Some(old), Some(new)) = (*known_total, total) {
        if old != new && append {
            *known_total = Some(new);
            return Err(restart(format!(
                "file size changed from {old} to {new}; restarting"
            )));
        }
    }
    if total.is_some() {
        *known_total = total;
    }
    let mut file = if append {
        OpenOptions::new().append(true).open(partial)
    } else {
        File::create(partial)
    }
    .map_err(|e| Failure::Fatal(HubError::io("write", partial, e)))?;
    if !append {
        // Saved before any byte arrives, so a partial on disk always has the validator of
        // the version it holds (or none, and then it is never resumed).
        Validator::from_headers(response.headers(), total)
            .save(validator_path)
            .map_err(Failure::Fatal)?;
    }
    bar.set_length(total.unwrap_or(0));
    bar.set_position(if append { have } else { 0 });
    let mut reader = response.into_body().into_reader();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => return Err(Failure::Retry(Box::new(e))),
        };
        file.write_all(&buf[..n])
            .map_err(|e| Failure::Fatal(HubError::io("write", partial, e)))?;
        bar.inc(n as u64);
    }
    store::sync_file(&mut file, partial).map_err(Failure::Fatal)?;
    let len = file_len(partial);
    match total {
        Some(t) if len < t => Err(retry(format!("connection ended at byte {len} of {t}"))),
        // Without a length, the end of the connection is the only end of the body, so a cut
        // transfer looks complete; the GGUF header says how long the file must be.
        None => match store::check_gguf(url, partial) {
            Err(e @ HubError::Truncated { .. }) => Err(Failure::Retry(Box::new(e))),
            // Anything else is judged once the download is over, with the right error.
            _ => Ok(None),
        },
        _ => Ok(total),
    }
}

/// `bytes START-END/TOTAL` -> (START, TOTAL if not `*`).
fn parse_content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let rest = value.trim().strip_prefix("bytes")?.trim_start();
    let (range, total) = rest.split_once('/')?;
    let (start, end) = range.split_once('-')?;
    let (start, end): (u64, u64) = (start.trim().parse().ok()?, end.trim().parse().ok()?);
    let total = match total.trim() {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    (end >= start && total.is_none_or(|t| end < t)).then_some((start, total))
}

/// `bytes */TOTAL` (sent with 416) -> TOTAL.
fn parse_unsatisfied_range(value: &str) -> Option<u64> {
    value
        .trim()
        .strip_prefix("bytes")?
        .trim_start()
        .strip_prefix("*/")?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_urls() {
        assert!(is_url("https://example.org/m.gguf"));
        assert!(is_url("HTTP://example.org/m.gguf"));
        assert!(!is_url("ftp://example.org/m.gguf"));
        assert!(!is_url("models/http.gguf"));
        assert!(!is_url("http"));
    }

    #[test]
    fn names_files_after_the_url() {
        let a = url_file_name(
            "https://example.org/org/repo/resolve/main/Model-Q4_K_M.gguf?download=true",
        )
        .unwrap();
        assert_eq!(a.len(), 13 + "Model-Q4_K_M.gguf".len());
        assert!(a.ends_with("-Model-Q4_K_M.gguf"), "{a}");
        assert!(a[..12].bytes().all(|b| b.is_ascii_hexdigit()));
        let b = url_file_name("https://example.org/other/Model-Q4_K_M.gguf").unwrap();
        assert_ne!(a, b, "same last segment, different URLs");
        assert!(url_file_name("http://h/x/..%2F..%2Fetc passwd").is_err());
        assert!(url_file_name("http://h/x/..%2F..%2Fetc")
            .unwrap()
            .ends_with("-_2F.._2Fetc.gguf"));
        assert!(url_file_name("http://h/").unwrap().ends_with("-model.gguf"));
        assert!(url_file_name("http:///m.gguf").is_err());
        assert!(url_file_name("file:///m.gguf").is_err());
    }

    #[test]
    fn parses_content_ranges() {
        assert_eq!(
            parse_content_range("bytes 100-199/200"),
            Some((100, Some(200)))
        );
        assert_eq!(parse_content_range("bytes 0-9/*"), Some((0, None)));
        assert_eq!(parse_content_range("bytes 10-5/200"), None);
        assert_eq!(parse_content_range("bytes 0-200/200"), None);
        assert_eq!(parse_content_range("items 0-1/2"), None);
        assert_eq!(parse_unsatisfied_range("bytes */1234"), Some(1234));
        assert_eq!(parse_unsatisfied_range("bytes 0-1/2"), None);
    }
}
