//! `minfer run --session` and `--cache-type-k/--cache-type-v` as a user runs them: the
//! real binary, saving, exiting, restoring and continuing, on a tiny model and on the
//! default model.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model, TinySpec};

fn minfer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(args)
        .env(
            "MINFER_HOME",
            std::env::temp_dir().join("minfer-session-test-home"),
        )
        .env_remove("MINFER_BACKENDS")
        .output()
        .expect("run minfer")
}

fn ok(out: Output) -> (String, String) {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "minfer failed: {err}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), err)
}

fn tiny(dir: &Path, seed: u64) -> PathBuf {
    let p = dir.join(format!("tiny-{seed}.gguf"));
    write_tiny_model(&p, &TinySpec::qwen2(GgmlType::Q8_0, seed)).expect("write tiny model");
    p
}

/// Runs greedy `run` on `model` with `prompt`, `extra` flags appended.
fn greedy(model: &str, prompt: &str, n: &str, extra: &[&str]) -> Output {
    let mut a = vec![
        "run", "-m", model, "--temp", "0", "-n", n, "-t", "2", "-p", prompt,
    ];
    a.extend_from_slice(extra);
    minfer(&a)
}

/// Save, exit, restore, continue: the same text as one run that never stopped, with the
/// restored prefix not prefilled again.
fn check_continuation(model: &str, prompt: &str, n: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("chat.kv");
    let s = s.to_str().unwrap();
    let mut with = vec!["--session", s];
    with.extend_from_slice(extra);
    // First run: no file yet, so it starts fresh and saves.
    let (first, _) = ok(greedy(model, prompt, n, &with));
    let (plain, _) = ok(greedy(model, prompt, n, extra));
    assert_eq!(first, plain, "a new session changes nothing");
    assert!(Path::new(s).is_file(), "the session was saved");
    // The same prompt again: all but the last prompt token come from the file.
    let (again, err) = ok(greedy(model, prompt, n, &with));
    assert_eq!(again, plain, "a restored prompt generates the same text");
    assert!(err.contains("reusing"), "{err}");
    // Continue the conversation: the prompt extended by the answer and more text.
    let longer = format!("{prompt}{}{}", first.trim_end_matches('\n'), " And then");
    let (cont, err) = ok(greedy(model, &longer, n, &with));
    let (fresh, _) = ok(greedy(model, &longer, n, extra));
    assert_eq!(cont, fresh, "the continuation differs from never stopping");
    let reused: usize = err
        .split("reusing ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    assert!(reused > 2, "the stored prefix was reused: {err}");
}

#[test]
fn run_session_continues_exactly_on_a_tiny_model_in_every_kv_format() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path(), 7);
    let m = m.to_str().unwrap();
    for t in ["f32", "f16", "q8_0"] {
        check_continuation(
            m,
            "Once upon a time",
            "12",
            &["--cache-type-k", t, "--cache-type-v", t],
        );
    }
}

/// The tokens `minfer run` reports reusing from a session (0 when it says nothing).
fn reused(err: &str) -> usize {
    err.split("reusing ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or(0)
}

#[test]
fn run_session_carries_a_hybrid_recurrent_model_s_state() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("tiny-qwen35.gguf");
    write_tiny_model(&m, &TinySpec::qwen35(GgmlType::F32, 1)).expect("write tiny model");
    let m = m.to_str().unwrap();
    let s = dir.path().join("s.kv");
    let s = s.to_str().unwrap();
    // One token generated: the saved history is the prompt (the sampled token is never
    // fed back), so the longer prompt below extends it and the state goes on from it.
    ok(greedy(m, "Once upon a time", "1", &["--session", s]));
    let longer = "Once upon a time there";
    let (cont, err) = ok(greedy(m, longer, "8", &["--session", s]));
    let (fresh, _) = ok(greedy(m, longer, "8", &[]));
    assert_eq!(cont, fresh, "the continuation differs from never stopping");
    assert!(reused(&err) > 2, "the stored state was reused: {err}");
    // A prompt that leaves the stored history cannot rewind the state: all of it runs
    // again, and the answer is still a fresh run's.
    let other = "Once upon a day";
    let (cont, err) = ok(greedy(m, other, "8", &["--session", s]));
    assert_eq!(cont, ok(greedy(m, other, "8", &[])).0);
    assert_eq!(reused(&err), 0, "{err}");
}

#[test]
fn run_session_continues_exactly_on_the_default_model() {
    let model = minfer_hub::default_model_path();
    assert!(
        model.is_file(),
        "real model missing at {}: run `minfer pull` first",
        model.display()
    );
    check_continuation(
        model.to_str().unwrap(),
        "def fibonacci(n):",
        "8",
        &["-c", "256"],
    );
}

#[test]
fn a_foreign_or_damaged_session_is_refused_in_one_line_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (tiny(dir.path(), 7), tiny(dir.path(), 8));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let s = dir.path().join("s.kv");
    let sp = s.to_str().unwrap();
    ok(greedy(a, "Hello there", "4", &["--session", sp]));
    let saved = std::fs::read(&s).unwrap();
    let refused = |out: Output, needle: &str| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "expected a refusal: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.contains(needle),
            "stderr does not name `{needle}`: {err}"
        );
        assert_eq!(std::fs::read(&s).unwrap(), saved, "the file was modified");
    };
    refused(
        greedy(b, "Hello there", "4", &["--session", sp]),
        "another model",
    );
    refused(
        greedy(
            a,
            "Hello there",
            "4",
            &["--session", sp, "--cache-type-k", "f16"],
        ),
        "--cache-type-k",
    );
    refused(
        greedy(a, "Hello there", "4", &["--session", sp, "-c", "4"]),
        "raise -c",
    );
    let mut cut = saved.clone();
    cut.truncate(saved.len() / 2);
    std::fs::write(&s, &cut).unwrap();
    let out = greedy(a, "Hello there", "4", &["--session", sp]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("damaged"), "{err}");
    assert_eq!(
        std::fs::read(&s).unwrap(),
        cut,
        "the damaged file was left as it was"
    );
    // A bad cache type is refused by name before anything loads.
    let out = greedy(a, "Hi", "2", &["--cache-type-v", "q4_0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("q4_0") && err.contains("--cache-type-v"),
        "{err}"
    );
}
