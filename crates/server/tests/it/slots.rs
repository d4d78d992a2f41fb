//! llama-server's slot routes over HTTP: a slot saved by one server and restored by a
//! new one continues exactly as the first would have, on the tiny model and on the
//! default model; names that leave the save directory, damaged files and bad requests
//! are refused.

use crate::common;

use std::path::Path;

use common::*;
use minfer_server::{start, Config};
use serde_json::{json, Value};

fn completion(prompt: &str) -> Value {
    json!({"prompt": prompt, "temperature": 0, "max_tokens": 8})
}

fn server(
    model: &Path,
    dir: &Path,
    edit: impl FnOnce(&mut Config),
) -> (minfer_server::Running, String) {
    let mut c = tiny_config(model, 1);
    c.slot_save_path = Some(dir.to_path_buf());
    edit(&mut c);
    let running = start(c).expect("starting the server");
    let base = format!("http://{}", running.addr());
    (running, base)
}

/// Request one, save, (stop, start, restore), request two: the second answer and its
/// reused prefix are those of a server that never stopped.
async fn save_stop_restore_continue(model: &Path, edit: fn(&mut Config)) {
    let dir = tempfile::tempdir().unwrap();
    let prompt = "def add(a, b):";
    let (a, base) = server(model, dir.path(), edit);
    let (st, first) = post(&base, "/v1/completions", completion(prompt)).await;
    assert_eq!(st, 200, "{first}");
    let text = first["choices"][0]["text"].as_str().unwrap().to_string();
    let (st, saved) = post(&base, "/slots/0?action=save", json!({"filename": "s.kv"})).await;
    assert_eq!(st, 200, "{saved}");
    assert!(saved["n_saved"].as_u64().unwrap() > 0, "{saved}");
    let next = format!("{prompt}{text}\n# and");
    let (st, want) = post(&base, "/v1/completions", completion(&next)).await;
    assert_eq!(st, 200, "{want}");
    a.stop().expect("stop");

    let (b, base) = server(model, dir.path(), edit);
    let (st, restored) = post(
        &base,
        "/slots/0?action=restore",
        json!({"filename": "s.kv"}),
    )
    .await;
    assert_eq!(st, 200, "{restored}");
    assert_eq!(restored["n_restored"], saved["n_saved"]);
    let (st, got) = post(&base, "/v1/completions", completion(&next)).await;
    assert_eq!(st, 200, "{got}");
    assert_eq!(got["choices"][0]["text"], want["choices"][0]["text"]);
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
    assert_eq!(cached(&got), cached(&want));
    assert!(cached(&got).as_u64().unwrap() > 0, "{got}");
    b.stop().expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_slot_continues_exactly_on_the_tiny_model() {
    let (_d, model) = tiny_model();
    save_stop_restore_continue(&model, |_| {}).await;
    save_stop_restore_continue(&model, |c| {
        c.cache_type_k = minfer_runtime::KvType::F16;
        c.cache_type_v = minfer_runtime::KvType::Q8_0;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_slot_continues_exactly_on_the_default_model() {
    save_stop_restore_continue(&real_model(), |c| {
        c.ctx = Some(512);
        c.threads = Some(2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_slot_requests_are_refused_and_leave_files_alone() {
    let (_d, model) = tiny_model();
    let dir = tempfile::tempdir().unwrap();
    let (s, base) = server(&model, dir.path(), |_| {});
    let (st, v) = post(&base, "/v1/completions", completion("hello")).await;
    assert_eq!(st, 200, "{v}");
    for name in [
        "../escape.kv",
        "/tmp/abs.kv",
        "sub/x.kv",
        "..",
        ".hidden",
        "",
    ] {
        for action in ["save", "restore"] {
            let (st, v) = post(
                &base,
                &format!("/slots/0?action={action}"),
                json!({"filename": name}),
            )
            .await;
            assert_eq!(st, 400, "{action} {name:?}: {v}");
            assert!(v.to_string().contains("filename"), "{v}");
        }
    }
    assert!(!dir.path().parent().unwrap().join("escape.kv").exists());
    let (st, v) = post(
        &base,
        "/slots/0?action=restore",
        json!({"filename": "absent.kv"}),
    )
    .await;
    assert_eq!(st, 404, "{v}");
    let (st, v) = post(&base, "/slots/7?action=save", json!({"filename": "a.kv"})).await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = post(&base, "/slots/0?action=fly", json!({"filename": "a.kv"})).await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = post(&base, "/slots/0?action=save", json!({"name": "a.kv"})).await;
    assert_eq!(st, 400, "{v}");
    // A damaged file is refused by name and left as it is.
    let (st, v) = post(
        &base,
        "/slots/0?action=save",
        json!({"filename": "good.kv"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let good = dir.path().join("good.kv");
    let mut bytes = std::fs::read(&good).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(&good, &bytes).unwrap();
    let (st, v) = post(
        &base,
        "/slots/0?action=restore",
        json!({"filename": "good.kv"}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(v.to_string().contains("damaged"), "{v}");
    assert_eq!(std::fs::read(&good).unwrap(), bytes);
    // A form post from another site's page is not JSON: refused before anything runs.
    let r = client()
        .post(format!("{base}/slots/0?action=erase"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("x=1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    let (st, v) = post(&base, "/slots/0?action=erase", json!({})).await;
    assert_eq!(st, 200, "{v}");
    assert!(v["n_erased"].as_u64().unwrap() > 0, "{v}");
    s.stop().expect("stop");

    // Without --slot-save-path, save and restore are not offered.
    let ts = tiny_server(1, |_| {});
    let (st, v) = post(
        &ts.base,
        "/slots/0?action=save",
        json!({"filename": "a.kv"}),
    )
    .await;
    assert_eq!(st, 501, "{v}");
    assert!(v.to_string().contains("--slot-save-path"), "{v}");
    ts.stop().expect("stop");
}
