//! One pull per model at a time: an exclusive lock on `<file>.lock` in the store.
//!
//! Two pulls of the same model (two terminals, or `serve` and `pull` started together) would
//! otherwise write the same partial files and parts directory at once. The lock is an
//! advisory `flock(2)`, which the kernel releases when its holder exits however it exits, so a
//! killed pull never leaves a lock behind that blocks the next one. The holder removes the
//! lock file when it is done, so the store does not accumulate them.

use crate::progress::Progress;
use crate::HubError;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

/// Held while a pull of one model runs; dropping it removes the lock file and unlocks.
#[derive(Debug)]
pub(crate) struct PullLock {
    path: PathBuf,
    // Kept open for the lock's lifetime: closing the file releases the flock.
    _file: File,
}

impl PullLock {
    /// Takes the lock at `path`, waiting (with a note on stderr) while another pull holds it.
    pub(crate) fn acquire(path: &Path, what: &str, progress: Progress) -> Result<Self, HubError> {
        let on_wait = || {
            progress.note(&format!(
                "waiting for another pull of {what} to finish (lock {})",
                path.display()
            ))
        };
        let file = sys::lock(path, &on_wait).map_err(|e| HubError::io("lock", path, e))?;
        Ok(PullLock {
            path: path.to_path_buf(),
            _file: file,
        })
    }
}

impl Drop for PullLock {
    fn drop(&mut self) {
        // Removed while still locked (see `sys::lock`); a failure only leaves an empty file
        // that the next pull reuses, so it is not worth failing a finished pull over.
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(unix)]
mod sys {
    use rustix::fs::{flock, FlockOperation};
    use std::fs::{File, OpenOptions};
    use std::io;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    /// Opens (creating) `path` and holds an exclusive flock on it; calls `on_wait` once if
    /// another holder makes it wait.
    pub(super) fn lock(path: &Path, on_wait: &dyn Fn()) -> io::Result<File> {
        let mut noted = false;
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)?;
            match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    if !noted {
                        on_wait();
                        noted = true;
                    }
                    loop {
                        match flock(&file, FlockOperation::LockExclusive) {
                            Err(rustix::io::Errno::INTR) => continue,
                            other => break other?,
                        }
                    }
                }
                Err(e) => return Err(e.into()),
            }
            // The previous holder removes the file before unlocking, so the inode locked
            // here may no longer be the one at `path`, and a newcomer could lock a fresh file
            // there too. Only a lock on the file still at `path` excludes everyone else.
            if let (Ok(a), Ok(b)) = (file.metadata(), std::fs::metadata(path)) {
                if a.dev() == b.dev() && a.ino() == b.ino() {
                    return Ok(file);
                }
            }
        }
    }
}

#[cfg(not(unix))]
mod sys {
    use std::fs::{File, OpenOptions};
    use std::io;
    use std::path::Path;

    /// Without flock, the lock file's existence is the lock: it is created exclusively, so a
    /// second pull refuses to start rather than corrupt the first one's files. A pull killed
    /// here leaves the file behind, and the error says so.
    pub(super) fn lock(path: &Path, _on_wait: &dyn Fn()) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => io::Error::new(
                    e.kind(),
                    "another pull of this model is running (remove the lock file if none is)",
                ),
                _ => e,
            })
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::testutil::TempDir;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn a_second_holder_waits_until_the_first_is_done_and_the_file_is_removed() {
        let tmp = TempDir::new("lock");
        let path = tmp.path().join("m.gguf.lock");
        let quiet = Progress { enabled: false };
        let first = PullLock::acquire(&path, "m", quiet).unwrap();
        let (tx, rx) = mpsc::channel();
        let waiter = {
            let path = path.clone();
            std::thread::spawn(move || {
                let second = PullLock::acquire(&path, "m", quiet).unwrap();
                tx.send(()).unwrap();
                drop(second);
            })
        };
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the second pull must wait for the first"
        );
        drop(first);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the second pull gets the lock once the first is done");
        waiter.join().unwrap();
        assert!(
            !path.exists(),
            "the lock file is removed by its last holder"
        );
    }
}
