//! Catalog pulls from chunked wheels, with a fetcher that copies local zip files (no pip):
//! assembly and verification, resuming, leftovers of interrupted pulls, concurrent pulls.

mod common;

use common::{gguf_bytes, TempDir};
use minfer_hub::catalog::{CatalogEntry, WheelSource};
use minfer_hub::wheels::WheelFetcher;
use minfer_hub::{presence, pull_catalog, HubError, Presence, Store};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

/// Where the test model is cut into its two parts.
const CUT: usize = 1_500;

/// Serves wheels from local files and records which packages were asked for.
#[derive(Default)]
struct LocalFetcher {
    wheels: HashMap<String, PathBuf>,
    failing: Mutex<HashSet<String>>,
    calls: Mutex<Vec<String>>,
    /// How long each fetch takes (to make concurrent pulls overlap).
    delay: Duration,
}

impl LocalFetcher {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl WheelFetcher for LocalFetcher {
    fn fetch(&self, package: &str, version: &str, dest: &Path) -> Result<PathBuf, HubError> {
        self.calls.lock().unwrap().push(package.to_string());
        std::thread::sleep(self.delay);
        let src = self
            .wheels
            .get(package)
            .filter(|_| !self.failing.lock().unwrap().contains(package));
        let Some(src) = src else {
            return Err(HubError::PipFailed {
                package: package.into(),
                version: version.into(),
                status: "exit status: 1".into(),
                stderr: "ERROR: No matching distribution".into(),
            });
        };
        let dst = dest.join(src.file_name().unwrap());
        fs::copy(src, &dst).unwrap();
        Ok(dst)
    }
}

fn write_wheel(path: &Path, package_dir: &str, part: u32, data: &[u8]) {
    let mut zip = zip::ZipWriter::new(fs::File::create(path).unwrap());
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    zip.start_file(format!("{package_dir}/__init__.py"), opts)
        .unwrap();
    zip.start_file(format!("{package_dir}/data/part{part:02}.bin"), opts)
        .unwrap();
    zip.write_all(data).unwrap();
    zip.start_file(format!("{package_dir}-0.1.0.dist-info/RECORD"), opts)
        .unwrap();
    zip.finish().unwrap();
}

fn hex_sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

struct Fixture {
    tmp: TempDir,
    store: Store,
    fetcher: LocalFetcher,
    whole: Vec<u8>,
}

fn fixture(tag: &str) -> Fixture {
    fixture_of(tag, gguf_bytes(4_000))
}

/// Publishes `whole` as two wheels, cut at [`CUT`].
fn fixture_of(tag: &str, whole: Vec<u8>) -> Fixture {
    let tmp = TempDir::new(tag);
    let mut wheels = HashMap::new();
    for (part, data) in [(1, &whole[..CUT]), (2, &whole[CUT..])] {
        let path = tmp
            .path()
            .join(format!("fake_model_part{part}-0.1.0-py3-none-any.whl"));
        write_wheel(&path, &format!("fake_model_part{part}"), part, data);
        wheels.insert(format!("fake-model-part{part}"), path);
    }
    let fetcher = LocalFetcher {
        wheels,
        ..LocalFetcher::default()
    };
    let store = Store::at(tmp.path().join("models"));
    Fixture {
        tmp,
        store,
        fetcher,
        whole,
    }
}

/// Catalog entries are `'static`; leaking a few bytes per test is the simplest way to build one.
fn entry(size: u64, sha256: String) -> CatalogEntry {
    CatalogEntry {
        name: "fake-model",
        aliases: &[],
        description: "two-part test model",
        file_name: "fake-model.gguf",
        size,
        sha256: Box::leak(sha256.into_boxed_str()),
        source: WheelSource {
            package_prefix: "fake-model-part",
            parts: 2,
            version: "0.1.0",
        },
    }
}

#[test]
fn chunks_are_concatenated_in_order_verified_and_stamped() {
    let f = fixture("concat");
    let e = entry(f.whole.len() as u64, hex_sha256(&f.whole));
    assert_eq!(presence(&e, &f.store), Presence::Absent);
    let path = pull_catalog(&e, &f.store, &f.fetcher, false).unwrap();
    assert_eq!(path, f.store.model_path("fake-model.gguf"));
    assert_eq!(fs::read(&path).unwrap(), f.whole);
    assert_eq!(f.fetcher.calls(), ["fake-model-part1", "fake-model-part2"]);
    assert!(
        !f.store.parts_dir(e.file_name).exists() && !f.store.partial_path(e.file_name).exists()
    );
    assert_eq!(presence(&e, &f.store), Presence::Verified);

    // Present and stamped: nothing is fetched again.
    pull_catalog(&e, &f.store, &f.fetcher, false).unwrap();
    assert_eq!(f.fetcher.calls().len(), 2);
}

#[test]
fn a_wrong_hash_is_rejected_and_nothing_is_renamed_into_place() {
    let f = fixture("badhash");
    let e = entry(f.whole.len() as u64, hex_sha256(b"something else"));
    let err = pull_catalog(&e, &f.store, &f.fetcher, false).unwrap_err();
    match &err {
        HubError::ChecksumMismatch { actual, .. } => assert_eq!(*actual, hex_sha256(&f.whole)),
        other => panic!("expected a checksum mismatch, got {other:?}"),
    }
    assert!(!f.store.model_path(e.file_name).exists());
    assert!(!f.store.partial_path(e.file_name).exists());
    assert!(!f.store.stamp_path(e.file_name).exists());
}

#[test]
fn a_wrong_total_size_is_rejected() {
    let f = fixture("badsize");
    let e = entry(f.whole.len() as u64 + 1, hex_sha256(&f.whole));
    let err = pull_catalog(&e, &f.store, &f.fetcher, false).unwrap_err();
    assert!(matches!(err, HubError::SizeMismatch { .. }), "{err:?}");
    assert!(!f.store.model_path(e.file_name).exists());
}

#[test]
fn a_failed_part_keeps_earlier_parts_and_the_next_pull_resumes_there() {
    let f = fixture("resume");
    let e = entry(f.whole.len() as u64, hex_sha256(&f.whole));
    f.fetcher
        .failing
        .lock()
        .unwrap()
        .insert("fake-model-part2".into());
    let err = pull_catalog(&e, &f.store, &f.fetcher, false).unwrap_err();
    assert!(err.to_string().contains("fake-model-part2==0.1.0"), "{err}");
    assert!(
        err.to_string().contains("No matching distribution"),
        "{err}"
    );
    assert!(!f.store.model_path(e.file_name).exists());
    assert_eq!(
        fs::read(f.store.parts_dir(e.file_name).join("part01.bin")).unwrap(),
        &f.whole[..CUT]
    );

    f.fetcher.failing.lock().unwrap().clear();
    f.fetcher.calls.lock().unwrap().clear();
    let path = pull_catalog(&e, &f.store, &f.fetcher, false).unwrap();
    assert_eq!(f.fetcher.calls(), ["fake-model-part2"]);
    assert_eq!(fs::read(path).unwrap(), f.whole);
}

#[test]
fn an_unstamped_copy_is_hashed_once_and_a_corrupt_one_is_replaced() {
    let f = fixture("unstamped");
    let e = entry(f.whole.len() as u64, hex_sha256(&f.whole));
    fs::create_dir_all(f.store.dir()).unwrap();
    let target = f.store.model_path(e.file_name);
    fs::write(&target, &f.whole).unwrap();
    assert_eq!(presence(&e, &f.store), Presence::Unverified);
    pull_catalog(&e, &f.store, &f.fetcher, false).unwrap();
    assert!(
        f.fetcher.calls().is_empty(),
        "a good copy needs no download"
    );
    assert_eq!(presence(&e, &f.store), Presence::Verified);

    let mut corrupt = f.whole.clone();
    corrupt[CUT + 10] ^= 0xFF;
    fs::remove_file(f.store.stamp_path(e.file_name)).unwrap();
    fs::write(&target, &corrupt).unwrap();
    pull_catalog(&e, &f.store, &f.fetcher, false).unwrap();
    assert_eq!(f.fetcher.calls().len(), 2);
    assert_eq!(fs::read(&target).unwrap(), f.whole);
    assert!(f.tmp.path().exists());
}

/// Names in a directory, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// Leaves the state of a pull that died while assembling: every chunk extracted and recorded,
/// a half-written partial. (Assembly is made to fail by a directory in the partial's place.)
fn pull_killed_while_assembling(f: &Fixture, e: &CatalogEntry) {
    let partial = f.store.partial_path(e.file_name);
    fs::create_dir_all(&partial).unwrap();
    pull_catalog(e, &f.store, &f.fetcher, false).unwrap_err();
    fs::remove_dir(&partial).unwrap();
    fs::write(&partial, &f.whole[..CUT / 2]).unwrap();
    assert_eq!(f.fetcher.calls().len(), 2);
    f.fetcher.calls.lock().unwrap().clear();
}

#[test]
fn a_pull_killed_while_assembling_resumes_from_its_chunks() {
    let f = fixture("killedassembling");
    let e = entry(f.whole.len() as u64, hex_sha256(&f.whole));
    pull_killed_while_assembling(&f, &e);
    let path = pull_catalog(&e, &f.store, &f.fetcher, false).unwrap();
    assert!(f.fetcher.calls().is_empty(), "{:?}", f.fetcher.calls());
    assert!(fs::read(path).unwrap() == f.whole);
    assert_eq!(
        listing(f.store.dir()),
        ["fake-model.gguf", "fake-model.gguf.sha256"]
    );
}

#[test]
fn damaged_leftover_chunks_are_refetched_not_trusted() {
    let f = fixture("damagedchunks");
    let e = entry(f.whole.len() as u64, hex_sha256(&f.whole));
    pull_killed_while_assembling(&f, &e);
    let parts = f.store.parts_dir(e.file_name);
    // Same size, one byte changed; and one cut short.
    let mut one = fs::read(parts.join("part01.bin")).unwrap();
    one[100] ^= 0x01;
    fs::write(parts.join("part01.bin"), &one).unwrap();
    fs::write(parts.join("part02.bin"), &f.whole[CUT..CUT + 10]).unwrap();
    let path = pull_catalog(&e, &f.store, &f.fetcher, false).unwrap();
    assert_eq!(f.fetcher.calls(), ["fake-model-part1", "fake-model-part2"]);
    assert!(fs::read(path).unwrap() == f.whole);
}

#[test]
fn leftovers_beside_a_verified_model_are_removed_without_fetching() {
    let f = fixture("leftovers");
    let e = entry(f.whole.len() as u64, hex_sha256(&f.whole));
    pull_catalog(&e, &f.store, &f.fetcher, false).unwrap();
    // A pull killed right after the rename, and stray temporaries of earlier phases.
    let parts = f.store.parts_dir(e.file_name);
    fs::create_dir_all(parts.join("wheel-02")).unwrap();
    fs::write(parts.join("wheel-02/x.whl"), b"half a wheel").unwrap();
    fs::write(parts.join("part01.bin"), &f.whole[..CUT]).unwrap();
    fs::write(parts.join("part02.bin.tmp"), b"half a chunk").unwrap();
    fs::write(f.store.partial_path(e.file_name), &f.whole[..100]).unwrap();
    fs::write(f.store.lock_path(e.file_name), b"").unwrap();
    let path = pull_catalog(&e, &f.store, &f.fetcher, false).unwrap();
    assert_eq!(f.fetcher.calls().len(), 2, "nothing fetched again");
    assert!(fs::read(path).unwrap() == f.whole);
    assert_eq!(
        listing(f.store.dir()),
        ["fake-model.gguf", "fake-model.gguf.sha256"]
    );
}

#[test]
fn stray_temporaries_of_an_interrupted_fetch_are_swept_on_resume() {
    let f = fixture("sweep");
    let e = entry(f.whole.len() as u64, hex_sha256(&f.whole));
    f.fetcher
        .failing
        .lock()
        .unwrap()
        .insert("fake-model-part2".into());
    pull_catalog(&e, &f.store, &f.fetcher, false).unwrap_err();
    let parts = f.store.parts_dir(e.file_name);
    fs::create_dir_all(parts.join("wheel-07")).unwrap();
    fs::write(parts.join("part02.bin.tmp"), b"half a chunk").unwrap();
    fs::write(parts.join("part09.bin"), b"not a part of this model").unwrap();
    f.fetcher
        .failing
        .lock()
        .unwrap()
        .insert("fake-model-part2".into());
    pull_catalog(&e, &f.store, &f.fetcher, false).unwrap_err();
    assert_eq!(listing(&parts), ["part01.bin", "part01.bin.sha256"]);
}

#[test]
fn two_concurrent_pulls_of_one_model_fetch_each_part_once() {
    let mut f = fixture("concurrent");
    f.fetcher.delay = Duration::from_millis(150);
    let f = Arc::new(f);
    let e = entry(f.whole.len() as u64, hex_sha256(&f.whole));
    let start = Arc::new(Barrier::new(2));
    let pulls: Vec<_> = (0..2)
        .map(|_| {
            let (f, start) = (Arc::clone(&f), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                pull_catalog(&e, &f.store, &f.fetcher, false)
            })
        })
        .collect();
    for pull in pulls {
        let path = pull.join().unwrap().unwrap();
        assert!(fs::read(path).unwrap() == f.whole);
    }
    assert_eq!(
        f.fetcher.calls(),
        ["fake-model-part1", "fake-model-part2"],
        "the second pull waited for the first and found the model there"
    );
    assert_eq!(
        listing(f.store.dir()),
        ["fake-model.gguf", "fake-model.gguf.sha256"]
    );
}

#[test]
fn a_catalog_entry_describing_a_cut_file_is_rejected() {
    // The digest and size match what is served, but the GGUF itself is cut short.
    let whole = gguf_bytes(4_000);
    let f = fixture_of("cutentry", whole[..3_000].to_vec());
    let e = entry(f.whole.len() as u64, hex_sha256(&f.whole));
    let err = pull_catalog(&e, &f.store, &f.fetcher, false).unwrap_err();
    assert!(
        matches!(err, HubError::Truncated { actual: 3_000, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("downloaded file is truncated"),
        "{err}"
    );
    assert!(!f.store.model_path(e.file_name).exists());
    assert!(!f.store.parts_dir(e.file_name).exists());
}
