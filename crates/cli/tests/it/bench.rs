//! `minfer bench` at a depth (`-d`, llama-bench's `--n-depth`): the tests run after that
//! many tokens already in the context, are named as llama-bench names them, and bad
//! combinations are refused.

use crate::common;

use common::{assert_refused, minfer_command, test_home, tiny_qwen2};

#[test]
fn depth_runs_pp_and_tg_after_the_given_context() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
    let m = m.to_str().unwrap();
    let home = test_home("bench");
    let out = minfer_command(&home)
        .args([
            "bench", "-m", m, "-p", "8", "-n", "4", "-d", "24", "-r", "2", "-t", "2", "-o", "json",
        ])
        .output()
        .expect("run minfer");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: serde_json::Value = serde_json::from_str(&text).expect("bench -o json");
    let rows = rows.as_array().expect("one row per test");
    let names: Vec<_> = rows.iter().map(|r| r["test"].as_str()).collect();
    assert_eq!(names, [Some("pp8 @ d24"), Some("tg4 @ d24")], "{text}");
    for r in rows {
        assert_eq!(r["n_depth"].as_u64(), Some(24), "{text}");
        let samples = r["samples_ts"].as_array().expect("samples");
        assert_eq!(samples.len(), 2, "{text}");
        assert!(r["avg_ts"].as_f64() > Some(0.0), "{text}");
    }

    // Without -d the names and the field say depth 0, as before.
    let out = minfer_command(&home)
        .args([
            "bench", "-m", m, "-p", "4", "-n", "0", "-r", "1", "-o", "json",
        ])
        .output()
        .expect("run minfer");
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench -o json");
    assert_eq!(rows[0]["test"].as_str(), Some("pp4"));
    assert_eq!(rows[0]["n_depth"].as_u64(), Some(0));

    // A context too small for depth + test is an error naming the context.
    let out = minfer_command(&home)
        .args([
            "bench", "-m", m, "-p", "8", "-n", "0", "-d", "30", "-c", "32",
        ])
        .output()
        .expect("run minfer");
    assert_refused(&out, "32");
    // The speculative test has its own prompt: a depth there is refused.
    let out = minfer_command(&home)
        .args(["bench", "-m", m, "-n", "4", "-d", "8", "--lookup"])
        .output()
        .expect("run minfer");
    assert_refused(&out, "-d");
}
