//! The model store (`<home>/models`, the home `$MINFER_HOME` by default at the command line)
//! and how a file in it is known to be good.
//!
//! A pull writes `<file>.partial`, verifies it, writes the stamp `<file>.sha256`, then renames
//! the partial onto `<file>`. So `<file>` only ever appears complete and verified.
//!
//! The stamp records the digest, the size and the modification time the file had when it was
//! verified (first line `sha256sum`-compatible, then `size=` and `mtime_ns=` lines). A later
//! run trusts a file whose size and mtime still match its stamp instead of rehashing hundreds
//! of megabytes on every start; a file touched since (or one without a stamp) is rehashed once.

use crate::lock::PullLock;
use crate::progress::Progress;
use crate::HubError;
use minfer_gguf::{GgufError, GgufFile};
use sha2::{Digest, Sha256};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// The hub's home directory from the values the caller read: `minfer_home` (what
/// `MINFER_HOME` holds), else `home/.cache/minfer` (`HOME`), else `.minfer` in the
/// current directory. Empty values count as unset.
pub fn home_dir(minfer_home: Option<OsString>, home: Option<OsString>) -> PathBuf {
    if let Some(dir) = minfer_home.filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    match home.filter(|v| !v.is_empty()) {
        Some(home) => PathBuf::from(home).join(".cache").join("minfer"),
        None => PathBuf::from(".minfer"),
    }
}

/// A directory of model files with their partials and stamps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// The store of the hub home `home` (see [`home_dir`]): `home/models`.
    pub fn in_home(home: &Path) -> Self {
        Store {
            dir: home.join("models"),
        }
    }

    /// A store rooted at `dir` (created on the first pull).
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Store { dir: dir.into() }
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Final path of a model file.
    pub fn model_path(&self, file_name: &str) -> PathBuf {
        self.dir.join(file_name)
    }

    /// The in-progress download of a model file.
    pub fn partial_path(&self, file_name: &str) -> PathBuf {
        self.dir.join(format!("{file_name}.partial"))
    }

    /// Directory of already-fetched chunks of a wheel-published model.
    pub fn parts_dir(&self, file_name: &str) -> PathBuf {
        self.dir.join(format!("{file_name}.partial.d"))
    }

    /// The verification stamp of a model file.
    pub fn stamp_path(&self, file_name: &str) -> PathBuf {
        self.dir.join(format!("{file_name}.sha256"))
    }

    /// What a resumable URL download was fetched against (ETag, Last-Modified, size), kept
    /// beside its partial so that a later pull resumes only the same file.
    pub fn validator_path(&self, file_name: &str) -> PathBuf {
        self.dir.join(format!("{file_name}.partial.validator"))
    }

    /// The lock file held while a pull of `file_name` runs.
    pub fn lock_path(&self, file_name: &str) -> PathBuf {
        self.dir.join(format!("{file_name}.lock"))
    }

    /// Takes the pull lock of `file_name` (creating the store directory), waiting while
    /// another pull of the same file runs.
    pub(crate) fn lock(&self, file_name: &str, progress: Progress) -> Result<PullLock, HubError> {
        self.ensure_dir()?;
        PullLock::acquire(&self.lock_path(file_name), file_name, progress)
    }

    /// Temporaries of `file_name`'s pulls: its partial, the partial's validator, the parts
    /// directory and the lock file.
    fn temporaries(&self, file_name: &str) -> [PathBuf; 4] {
        [
            self.partial_path(file_name),
            self.validator_path(file_name),
            self.parts_dir(file_name),
            self.lock_path(file_name),
        ]
    }

    /// Whether any temporary of a pull of `file_name` is in the store.
    pub(crate) fn has_temporaries(&self, file_name: &str) -> bool {
        self.temporaries(file_name)
            .iter()
            .any(|p| fs::symlink_metadata(p).is_ok())
    }

    /// Removes what earlier (interrupted) pulls of `file_name` left behind, once the file
    /// itself is verified; the caller holds the pull lock, whose file goes when it is dropped.
    pub(crate) fn remove_temporaries(&self, file_name: &str) -> Result<(), HubError> {
        let [partial, validator, parts, _lock] = self.temporaries(file_name);
        remove_file_if_present(&partial)?;
        remove_file_if_present(&validator)?;
        remove_dir_if_present(&parts)
    }

    /// Creates the store directory if needed.
    pub(crate) fn ensure_dir(&self) -> Result<(), HubError> {
        fs::create_dir_all(&self.dir).map_err(|e| HubError::io("create directory", &self.dir, e))
    }

    /// The digest recorded for `file_name` if the file is present, has `expected_size` (when
    /// given) and still has the size and mtime its stamp recorded; `None` otherwise.
    pub fn stamped_digest(&self, file_name: &str, expected_size: Option<u64>) -> Option<String> {
        let meta = fs::metadata(self.model_path(file_name)).ok()?;
        if !meta.is_file() || expected_size.is_some_and(|s| s != meta.len()) {
            return None;
        }
        let stamp = Stamp::parse(&fs::read_to_string(self.stamp_path(file_name)).ok()?)?;
        let fresh = stamp.size == meta.len() && stamp.mtime_ns == mtime_ns(&meta);
        fresh.then_some(stamp.sha256)
    }

    /// Records `sha256` as the verified digest of `file` (a partial about to become
    /// `file_name`; the rename keeps its size and mtime).
    pub(crate) fn write_stamp(
        &self,
        file_name: &str,
        file: &Path,
        sha256: &str,
    ) -> Result<(), HubError> {
        let meta = fs::metadata(file).map_err(|e| HubError::io("inspect", file, e))?;
        let stamp = Stamp {
            sha256: sha256.to_string(),
            size: meta.len(),
            mtime_ns: mtime_ns(&meta),
        };
        let path = self.stamp_path(file_name);
        fs::write(&path, stamp.render(file_name)).map_err(|e| HubError::io("write", &path, e))
    }

    /// Moves a verified partial into place (the stamp must already be written).
    pub(crate) fn commit(&self, partial: &Path, file_name: &str) -> Result<PathBuf, HubError> {
        let target = self.model_path(file_name);
        fs::rename(partial, &target).map_err(|e| HubError::io("rename into place", partial, e))?;
        Ok(target)
    }
}

/// Parsed contents of a `<file>.sha256` stamp.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    sha256: String,
    size: u64,
    /// `None` where the filesystem reports no mtime; then only the size is compared.
    mtime_ns: Option<u128>,
}

impl Stamp {
    fn render(&self, file_name: &str) -> String {
        let mut s = format!("{}  {}\nsize={}\n", self.sha256, file_name, self.size);
        if let Some(m) = self.mtime_ns {
            s.push_str(&format!("mtime_ns={m}\n"));
        }
        s
    }

    fn parse(text: &str) -> Option<Stamp> {
        let mut lines = text.lines();
        let sha256 = lines
            .next()?
            .split_whitespace()
            .next()?
            .to_ascii_lowercase();
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let (mut size, mut mtime_ns) = (None, None);
        for line in lines {
            if let Some(v) = line.strip_prefix("size=") {
                size = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("mtime_ns=") {
                mtime_ns = v.trim().parse().ok();
            }
        }
        Some(Stamp {
            sha256,
            size: size?,
            mtime_ns,
        })
    }
}

fn mtime_ns(meta: &fs::Metadata) -> Option<u128> {
    meta.modified()
        .ok()?
        .duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_nanos())
}

/// Checks that a downloaded `file` is a whole GGUF: it parses, and every tensor's data lies
/// inside it. A download cut short without the transfer noticing (no Content-Length, or a
/// catalog entry describing a cut file) fails here, not later as a broken model.
pub(crate) fn check_gguf(name: &str, file: &Path) -> Result<(), HubError> {
    let actual = fs::metadata(file)
        .map_err(|e| HubError::io("inspect", file, e))?
        .len();
    let truncated = |needed: u128| HubError::Truncated {
        name: name.to_string(),
        needed: u64::try_from(needed).unwrap_or(u64::MAX),
        actual,
    };
    match GgufFile::open(file) {
        Ok(_) => Ok(()),
        Err(GgufError::TensorOutOfBounds { end, .. }) => Err(truncated(end)),
        Err(GgufError::Truncated { offset, needed, .. }) => {
            Err(truncated(u128::from(offset) + u128::from(needed)))
        }
        Err(source) => Err(HubError::BadGguf {
            name: name.to_string(),
            source,
        }),
    }
}

/// Lower-case hex of a byte string.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of a file as lower-case hex, advancing `bar` by the bytes read.
pub(crate) fn sha256_file(path: &Path, bar: &indicatif::ProgressBar) -> Result<String, HubError> {
    let mut file = File::open(path).map_err(|e| HubError::io("open", path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| HubError::io("read", path, e))?;
        if n == 0 {
            return Ok(hex(&hasher.finalize()));
        }
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
}

/// Flushes a finished partial to disk so that the rename never exposes unwritten data.
pub(crate) fn sync_file(file: &mut File, path: &Path) -> Result<(), HubError> {
    file.flush()
        .and_then(|()| file.sync_all())
        .map_err(|e| HubError::io("write", path, e))
}

/// Removes a file, treating "already gone" as success.
pub(crate) fn remove_file_if_present(path: &Path) -> Result<(), HubError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(HubError::io("remove", path, e)),
        _ => Ok(()),
    }
}

/// Removes a directory tree, treating "already gone" as success.
pub(crate) fn remove_dir_if_present(path: &Path) -> Result<(), HubError> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(HubError::io("remove", path, e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_home_is_minfer_home_else_the_user_cache_else_the_current_directory() {
        let some = |s: &str| Some(OsString::from(s));
        assert_eq!(home_dir(some("/m"), some("/u")), PathBuf::from("/m"));
        assert_eq!(
            home_dir(some(""), some("/u")),
            PathBuf::from("/u/.cache/minfer")
        );
        assert_eq!(home_dir(None, some("")), PathBuf::from(".minfer"));
        assert_eq!(
            Store::in_home(Path::new("/m")).dir(),
            Path::new("/m/models")
        );
    }
    use crate::testutil::TempDir;

    const DIGEST: &str = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32";

    #[test]
    fn paths_sit_side_by_side_in_the_store() {
        let s = Store::at("/models");
        assert_eq!(s.model_path("m.gguf"), Path::new("/models/m.gguf"));
        assert_eq!(
            s.partial_path("m.gguf"),
            Path::new("/models/m.gguf.partial")
        );
        assert_eq!(s.parts_dir("m.gguf"), Path::new("/models/m.gguf.partial.d"));
        assert_eq!(s.stamp_path("m.gguf"), Path::new("/models/m.gguf.sha256"));
    }

    #[test]
    fn stamp_round_trips_and_rejects_garbage() {
        let st = Stamp {
            sha256: DIGEST.into(),
            size: 42,
            mtime_ns: Some(7),
        };
        let text = st.render("m.gguf");
        assert!(text.starts_with(&format!("{DIGEST}  m.gguf\n")));
        assert_eq!(Stamp::parse(&text), Some(st));
        assert_eq!(Stamp::parse("xyz  m.gguf\nsize=1\n"), None);
        assert_eq!(
            Stamp::parse(&format!("{DIGEST}  m.gguf\n")),
            None,
            "size is required"
        );
    }

    #[test]
    fn stamp_is_trusted_only_while_the_file_is_unchanged() {
        let tmp = TempDir::new("stamp");
        let store = Store::at(tmp.path());
        store.ensure_dir().unwrap();
        let partial = store.partial_path("m.gguf");
        fs::write(&partial, b"GGUF0123").unwrap();
        store.write_stamp("m.gguf", &partial, DIGEST).unwrap();
        assert_eq!(
            store.stamped_digest("m.gguf", None),
            None,
            "no final file yet"
        );
        store.commit(&partial, "m.gguf").unwrap();
        assert_eq!(
            store.stamped_digest("m.gguf", Some(8)).as_deref(),
            Some(DIGEST)
        );
        assert_eq!(
            store.stamped_digest("m.gguf", Some(9)),
            None,
            "catalog size differs"
        );
        fs::write(store.model_path("m.gguf"), b"GGUF01234").unwrap();
        assert_eq!(
            store.stamped_digest("m.gguf", None),
            None,
            "file changed since stamping"
        );
    }

    #[test]
    fn hashes_files() {
        let tmp = TempDir::new("hash");
        let p = tmp.path().join("abc");
        fs::write(&p, b"abc").unwrap();
        let bar = indicatif::ProgressBar::hidden();
        let want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_file(&p, &bar).unwrap(), want);
        assert_eq!(bar.position(), 3);
    }
}
