//! `--lookup`, `--draft` and `--draft-max` on the real binary: the same greedy text as
//! plain decode, the counters on stderr, bench's speculative test, and refusals by name.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{assert_refused, minfer_command, test_home};
use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model, TinySpec};

fn minfer(args: &[&str]) -> Output {
    minfer_command(&test_home("spec"))
        .args(args)
        .output()
        .expect("run minfer")
}

fn tiny(dir: &Path, name: &str, spec: &TinySpec) -> PathBuf {
    let p = dir.join(name);
    write_tiny_model(&p, spec).expect("write tiny model");
    p
}

#[test]
fn speculative_runs_print_plain_decodes_text_and_their_counters() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(
        dir.path(),
        "target.gguf",
        &TinySpec::qwen2(GgmlType::Q8_0, 7),
    );
    let d = tiny(
        dir.path(),
        "draft.gguf",
        &TinySpec::qwen2(GgmlType::Q8_0, 8),
    );
    let (m, d) = (m.to_str().unwrap(), d.to_str().unwrap());
    let prompt = "ab ab ab ab ab ab";
    let base = ["run", "-m", m, "--temp", "0", "-n", "40", "-t", "1", prompt];
    let plain = minfer(&base);
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    for extra in [
        vec!["--lookup"],
        vec!["--lookup", "--draft-max", "3"],
        vec!["--draft", d],
    ] {
        let mut args = base.to_vec();
        args.extend(&extra);
        let out = minfer(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{extra:?}: {err}");
        assert_eq!(out.stdout, plain.stdout, "{extra:?} changed the text");
        assert!(
            err.contains("speculative (") && err.contains("drafted"),
            "{err}"
        );
    }
}

#[test]
fn bench_reports_the_speculative_test_and_its_acceptance() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(
        dir.path(),
        "target.gguf",
        &TinySpec::qwen2(GgmlType::Q8_0, 7),
    );
    let out = minfer(&[
        "bench",
        "-m",
        m.to_str().unwrap(),
        "-t",
        "1",
        "-p",
        "0",
        "-n",
        "16",
        "-r",
        "1",
        "--lookup",
        "-c",
        "512",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("plain |") && text.contains("lookup |"),
        "{text}"
    );
    assert!(text.contains("acceptance"), "{text}");
}

#[test]
fn bad_speculative_flags_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(
        dir.path(),
        "target.gguf",
        &TinySpec::qwen2(GgmlType::Q8_0, 7),
    );
    let mut other = TinySpec::qwen2(GgmlType::Q8_0, 8);
    other.n_vocab += 3;
    let o = tiny(dir.path(), "other.gguf", &other);
    let (m, o) = (m.to_str().unwrap(), o.to_str().unwrap());
    for bad in ["0", "17", "x"] {
        let out = minfer(&["run", "-m", m, "--lookup", "--draft-max", bad, "hi"]);
        assert_refused(&out, "--draft-max");
    }
    let out = minfer(&["run", "-m", m, "--lookup", "--draft", m, "hi"]);
    assert_refused(&out, "--lookup");
    let out = minfer(&["run", "-m", m, "-n", "4", "--draft", o, "hi"]);
    assert_refused(&out, "vocabulary");
    // The server takes a draft model, and refuses one of another vocabulary at start-up.
    let out = minfer(&["serve", "-m", m, "--draft", o, "--port", "0"]);
    assert_refused(&out, "vocabulary");
    let out = minfer(&["bench", "-m", m, "-f", "prompt.txt"]);
    assert_refused(&out, "--lookup");
}
