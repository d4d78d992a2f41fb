//! URL pulls against a local server: resume with Range and If-Range, retries, atomicity,
//! verification, leftovers and concurrent pulls.

mod common;

use common::{gguf_bytes, gguf_bytes_seeded, Mode, Seen, Server, TempDir, Version};
use minfer_hub::http::{pull_url, url_file_name, RetryPolicy};
use minfer_hub::{HubError, Store};
use std::error::Error;
use std::fs;
use std::sync::{Arc, Barrier};
use std::time::Duration;

fn fast(attempts: u32) -> RetryPolicy {
    RetryPolicy {
        attempts,
        first_delay: Duration::from_millis(10),
    }
}

struct Fixture {
    _tmp: TempDir,
    store: Store,
    server: Server,
    body: Vec<u8>,
}

fn fixture(tag: &str, body: Vec<u8>) -> Fixture {
    fixture_version(tag, Version::tagged(body, "v1"))
}

fn fixture_version(tag: &str, version: Version) -> Fixture {
    let tmp = TempDir::new(tag);
    let store = Store::at(tmp.path().join("models"));
    let body = version.body.clone();
    let server = Server::start_version(version);
    Fixture {
        _tmp: tmp,
        store,
        server,
        body,
    }
}

impl Fixture {
    fn name(&self) -> String {
        url_file_name(&self.server.url()).unwrap()
    }
}

#[test]
fn dropped_connection_is_resumed_with_a_range_request() {
    let f = fixture("resume", gguf_bytes(300_000));
    f.server.script(&[Mode::DropAfter(100_000)]);
    let path = pull_url(&f.server.url(), &f.store, false, &fast(3)).unwrap();
    assert_eq!(path, f.store.model_path(&f.name()));
    assert!(fs::read(&path).unwrap() == f.body, "content differs");
    assert_eq!(
        f.server.seen()[1],
        Seen {
            range: Some("bytes=100000-".into()),
            if_range: Some("\"v1\"".into()),
        },
        "the resume names the version it continues"
    );
    assert_eq!(f.server.ranges()[0], None);
    assert!(!f.store.partial_path(&f.name()).exists());
    assert!(!f.store.validator_path(&f.name()).exists());
    let stamp = fs::read_to_string(f.store.stamp_path(&f.name())).unwrap();
    assert!(stamp.contains("size=300000"), "{stamp}");
}

#[test]
fn a_server_ignoring_range_restarts_the_file_cleanly() {
    let f = fixture("norange", gguf_bytes(50_000));
    f.server
        .script(&[Mode::DropAfter(1_000), Mode::IgnoreRange]);
    let path = pull_url(&f.server.url(), &f.store, false, &fast(3)).unwrap();
    assert!(fs::read(&path).unwrap() == f.body, "content differs");
    assert_eq!(f.server.ranges()[1].as_deref(), Some("bytes=1000-"));
}

#[test]
fn interrupted_pull_leaves_only_the_partial_and_the_next_one_resumes() {
    let f = fixture("interrupt", gguf_bytes(20_000));
    f.server
        .script(&[Mode::DropAfter(5_000), Mode::Status(503), Mode::Status(503)]);
    let err = pull_url(&f.server.url(), &f.store, false, &fast(2)).unwrap_err();
    assert!(
        matches!(err, HubError::Download { attempts: 2, .. }),
        "{err:?}"
    );
    assert!(
        !f.store.model_path(&f.name()).exists(),
        "no final file after a failed pull"
    );
    assert!(!f.store.stamp_path(&f.name()).exists());
    assert_eq!(
        fs::metadata(f.store.partial_path(&f.name())).unwrap().len(),
        5_000
    );

    let path = pull_url(&f.server.url(), &f.store, false, &fast(2)).unwrap();
    assert!(fs::read(&path).unwrap() == f.body, "content differs");
    assert_eq!(
        f.server.ranges().last().unwrap().as_deref(),
        Some("bytes=5000-")
    );
}

#[test]
fn non_gguf_content_is_rejected_and_not_renamed() {
    let f = fixture("notgguf", b"<html>rate limited</html>".to_vec());
    let err = pull_url(&f.server.url(), &f.store, false, &fast(2)).unwrap_err();
    assert!(matches!(err, HubError::NotGguf { .. }), "{err:?}");
    assert!(err.to_string().contains("<html>"), "{err}");
    assert!(!f.store.model_path(&f.name()).exists());
    assert!(!f.store.partial_path(&f.name()).exists());
}

#[test]
fn wrong_size_is_rejected_and_not_renamed() {
    let f = fixture("oversize", gguf_bytes(10_000));
    f.server
        .script(&[Mode::DropAfter(4_000), Mode::Overlong(7)]);
    let err = pull_url(&f.server.url(), &f.store, false, &fast(3)).unwrap_err();
    match err {
        HubError::SizeMismatch {
            expected, actual, ..
        } => assert_eq!((expected, actual), (10_000, 10_007)),
        other => panic!("expected a size mismatch, got {other:?}"),
    }
    assert!(!f.store.model_path(&f.name()).exists());
    assert!(!f.store.partial_path(&f.name()).exists());
}

#[test]
fn http_errors_are_reported_without_leaving_files() {
    let f = fixture("404", gguf_bytes(1000));
    let url = f.server.missing_url();
    let err = pull_url(&url, &f.store, false, &fast(2)).unwrap_err();
    assert!(
        matches!(err, HubError::HttpStatus { status: 404, .. }),
        "{err:?}"
    );
    let name = url_file_name(&url).unwrap();
    assert!(!f.store.partial_path(&name).exists() && !f.store.model_path(&name).exists());
}

#[test]
fn a_verified_file_is_not_downloaded_again_but_a_tampered_one_is() {
    let f = fixture("present", gguf_bytes(30_000));
    let path = pull_url(&f.server.url(), &f.store, false, &fast(2)).unwrap();
    let mtime = fs::metadata(&path).unwrap().modified().unwrap();
    assert_eq!(
        pull_url(&f.server.url(), &f.store, false, &fast(2)).unwrap(),
        path
    );
    assert_eq!(
        f.server.ranges().len(),
        1,
        "second pull must not touch the network"
    );
    assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), mtime);

    let mut bad = f.body.clone();
    bad.truncate(29_000);
    fs::write(&path, &bad).unwrap();
    assert_eq!(
        pull_url(&f.server.url(), &f.store, false, &fast(2)).unwrap(),
        path
    );
    assert_eq!(f.server.ranges().len(), 2);
    assert!(
        fs::read(&path).unwrap() == f.body,
        "tampered file was replaced"
    );
}

/// The text of an error and all its causes.
fn chain(err: &HubError) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Interrupts a first pull after `cut` bytes (one attempt, so it gives up with the partial).
fn interrupted_pull(f: &Fixture, cut: usize) {
    f.server.script(&[Mode::DropAfter(cut)]);
    let err = pull_url(&f.server.url(), &f.store, false, &fast(1)).unwrap_err();
    assert!(matches!(err, HubError::Download { .. }), "{err:?}");
    assert_eq!(
        fs::metadata(f.store.partial_path(&f.name())).unwrap().len(),
        cut as u64
    );
}

#[test]
fn a_file_replaced_between_pulls_is_fetched_whole_not_spliced() {
    let old = gguf_bytes_seeded(200_000, 1);
    let f = fixture_version("changed", Version::tagged(old, "old"));
    interrupted_pull(&f, 80_000);
    // Same size, new content: only the validator tells the versions apart.
    let new = gguf_bytes_seeded(200_000, 2);
    f.server.publish(Version {
        last_modified: Some("Wed, 02 Dec 2026 09:00:00 GMT".into()),
        ..Version::tagged(new.clone(), "new")
    });
    let path = pull_url(&f.server.url(), &f.store, false, &fast(2)).unwrap();
    assert!(
        fs::read(&path).unwrap() == new,
        "the old partial was spliced onto the new file"
    );
    let seen = f.server.seen();
    assert_eq!(seen.len(), 2, "the If-Range answer is the whole new file");
    assert_eq!(seen[1].if_range.as_deref(), Some("\"old\""));
}

#[test]
fn without_a_validator_an_interrupted_download_restarts_from_zero() {
    let unlabelled = |body| Version {
        body,
        etag: None,
        last_modified: None,
    };
    let f = fixture_version("novalidator", unlabelled(gguf_bytes_seeded(100_000, 3)));
    interrupted_pull(&f, 30_000);
    let new = gguf_bytes_seeded(100_000, 4);
    f.server.publish(unlabelled(new.clone()));
    let path = pull_url(&f.server.url(), &f.store, false, &fast(2)).unwrap();
    assert!(fs::read(&path).unwrap() == new, "content was spliced");
    assert_eq!(
        f.server.seen()[1],
        Seen {
            range: None,
            if_range: None
        },
        "nothing proves the partial is still current, so it is not resumed"
    );
}

#[test]
fn last_modified_is_the_validator_when_the_etag_is_weak_or_absent() {
    let date = "Tue, 01 Dec 2026 09:00:00 GMT";
    for etag in [None, Some("W/\"weak\"".to_string())] {
        let f = fixture_version(
            "lastmod",
            Version {
                body: gguf_bytes(60_000),
                etag: etag.clone(),
                last_modified: Some(date.into()),
            },
        );
        f.server.script(&[Mode::DropAfter(20_000)]);
        let path = pull_url(&f.server.url(), &f.store, false, &fast(3)).unwrap();
        assert!(fs::read(&path).unwrap() == f.body, "content differs");
        assert_eq!(
            f.server.seen()[1],
            Seen {
                range: Some("bytes=20000-".into()),
                if_range: Some(date.into()),
            },
            "etag {etag:?}"
        );
    }
}

#[test]
fn a_server_that_ignores_if_range_is_caught_by_the_etag_it_answers_with() {
    let f = fixture_version(
        "ignoreifrange",
        Version::tagged(gguf_bytes_seeded(90_000, 5), "old"),
    );
    interrupted_pull(&f, 40_000);
    let new = gguf_bytes_seeded(90_000, 6);
    f.server.publish(Version::tagged(new.clone(), "new"));
    f.server.script(&[Mode::IgnoreIfRange]);
    let path = pull_url(&f.server.url(), &f.store, false, &fast(3)).unwrap();
    assert!(fs::read(&path).unwrap() == new, "content was spliced");
    let seen = f.server.seen();
    assert_eq!(seen.last().unwrap().range, None, "restarted from zero");
}

#[test]
fn a_body_cut_short_without_content_length_is_resumed_not_stored() {
    let f = fixture("nolength", gguf_bytes(150_000));
    f.server.script(&[Mode::NoLength(50_000)]);
    let path = pull_url(&f.server.url(), &f.store, false, &fast(3)).unwrap();
    assert!(
        fs::read(&path).unwrap() == f.body,
        "a cut body was stored as complete"
    );
    assert_eq!(f.server.ranges()[1].as_deref(), Some("bytes=50000-"));
}

#[test]
fn a_body_cut_without_content_length_fails_naming_the_truncation_once_retries_run_out() {
    let f = fixture("cutnolength", gguf_bytes(150_000));
    f.server.script(&[Mode::NoLength(50_000)]);
    let err = pull_url(&f.server.url(), &f.store, false, &fast(1)).unwrap_err();
    let text = chain(&err);
    assert!(matches!(err, HubError::Download { .. }), "{err:?}");
    assert!(
        text.contains("downloaded file is truncated")
            && text.contains("needs at least")
            && text.contains("the file has 50000"),
        "{text}"
    );
    assert!(!f.store.model_path(&f.name()).exists());
    assert!(!f.store.stamp_path(&f.name()).exists());
}

#[test]
fn a_cut_file_served_with_its_own_length_is_rejected_and_discarded() {
    let whole = gguf_bytes(40_000);
    let f = fixture("cutfile", whole[..25_000].to_vec());
    let err = pull_url(&f.server.url(), &f.store, false, &fast(2)).unwrap_err();
    match &err {
        HubError::Truncated { needed, actual, .. } => {
            assert_eq!(*actual, 25_000);
            assert!(*needed > 25_000, "{err}");
        }
        other => panic!("expected a truncation error, got {other:?}"),
    }
    assert!(
        err.to_string().contains("downloaded file is truncated"),
        "{err}"
    );
    assert!(!f.store.model_path(&f.name()).exists());
    assert!(!f.store.partial_path(&f.name()).exists());
    assert!(!f.store.validator_path(&f.name()).exists());
}

#[test]
fn leftovers_beside_a_verified_file_are_removed_without_a_download() {
    let f = fixture("leftovers", gguf_bytes(30_000));
    pull_url(&f.server.url(), &f.store, false, &fast(2)).unwrap();
    // What a pull killed at the wrong moment leaves next to a good file.
    let name = f.name();
    fs::write(f.store.partial_path(&name), &f.body[..10_000]).unwrap();
    fs::write(f.store.validator_path(&name), "etag=\"v1\"\n").unwrap();
    fs::write(f.store.lock_path(&name), "").unwrap();
    pull_url(&f.server.url(), &f.store, false, &fast(2)).unwrap();
    assert_eq!(f.server.seen().len(), 1, "no second download");
    for p in [
        f.store.partial_path(&name),
        f.store.validator_path(&name),
        f.store.lock_path(&name),
    ] {
        assert!(!p.exists(), "{} left behind", p.display());
    }
    let mut left: Vec<_> = fs::read_dir(f.store.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, [name.clone(), format!("{name}.sha256")]);
}

#[test]
fn two_concurrent_pulls_of_one_url_download_it_once() {
    let f = Arc::new(fixture("concurrent", gguf_bytes(120_000)));
    // The first answer is slow, so both pulls are under way before either finishes.
    f.server.script(&[Mode::Delay(300)]);
    let start = Arc::new(Barrier::new(2));
    let pulls: Vec<_> = (0..2)
        .map(|_| {
            let (f, start) = (Arc::clone(&f), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                pull_url(&f.server.url(), &f.store, false, &fast(2))
            })
        })
        .collect();
    for pull in pulls {
        let path = pull.join().unwrap().unwrap();
        assert!(fs::read(&path).unwrap() == f.body, "content differs");
    }
    assert_eq!(
        f.server.seen().len(),
        1,
        "the second pull waited for the first"
    );
    assert!(!f.store.lock_path(&f.name()).exists());
}
