//! `minfer run` and `minfer perplexity` as a user runs them: the real binary on a tiny
//! model written by the project's writer, and on bad parameters.

use crate::common;

use std::process::Output;

use common::{assert_refused, minfer_command, number_before, test_home, tiny_qwen2};
use minfer_gguf::{GgufWriter, MetaValue};

fn minfer(args: &[&str]) -> Output {
    minfer_command(&test_home("run"))
        .args(args)
        .output()
        .expect("run minfer")
}

/// A run that succeeded; its stderr is the failure message otherwise.
fn assert_ran(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn greedy_run_streams_text_and_prints_a_timing_summary() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
    let m = m.to_str().unwrap();
    let a = minfer(&[
        "run", "-m", m, "--temp", "0", "-n", "12", "-t", "2", "Hello",
    ]);
    assert_ran(&a);
    let err = String::from_utf8_lossy(&a.stderr);
    assert!(
        err.contains("prompt") && err.contains("generated") && err.contains("t/s"),
        "{err}"
    );
    let b = minfer(&[
        "run", "-m", m, "--temp", "0", "-n", "12", "-t", "1", "-p", "Hello",
    ]);
    assert_eq!(
        a.stdout, b.stdout,
        "greedy output depends on -t or on how the prompt is given"
    );
    assert!(!a.stdout.is_empty());
    // Seeded sampling is reproducible.
    let s1 = minfer(&[
        "run", "-m", m, "--seed", "5", "--temp", "1.5", "-n", "16", "Hi",
    ]);
    let s2 = minfer(&[
        "run", "-m", m, "--seed", "5", "--temp", "1.5", "-n", "16", "Hi",
    ]);
    assert!(s1.status.success());
    assert_eq!(s1.stdout, s2.stdout);
}

#[test]
fn graph_dumps_write_dot_and_json_and_exit_before_decoding() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
    let dot = dir.path().join("g.dot");
    let json = dir.path().join("g.json");
    let (m, d, j) = (
        m.to_str().unwrap(),
        dot.to_str().unwrap(),
        json.to_str().unwrap(),
    );
    let out = minfer(&[
        "run",
        "-m",
        m,
        "--dump-graph",
        d,
        "--dump-graph-json",
        j,
        "--dump-kind",
        "decode",
        "hi",
    ]);
    assert_ran(&out);
    assert!(out.stdout.is_empty(), "no decoding happens");
    let d = std::fs::read_to_string(&dot).unwrap();
    assert!(d.starts_with("digraph") && d.contains("lightyellow"), "{d}");
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(j["format"], "minfer-graph");
    assert_eq!(j["kind"], "decode");
    let ops: Vec<&str> = j["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["op"].as_str())
        .collect();
    assert!(ops.contains(&"swiglu"), "the dump is after fusion: {ops:?}");
    let g = minfer_graph::import_json_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(g.inputs.len(), 2, "decode has token_ids and positions only");
}

#[test]
fn bad_parameters_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
    let m = m.to_str().unwrap();
    assert_refused(
        &minfer(&["run", "-m", m, "--temp", "-1", "hi"]),
        "temperature",
    );
    assert_refused(
        &minfer(&["run", "-m", m, "--temp", "nan", "hi"]),
        "temperature",
    );
    assert_refused(&minfer(&["run", "-m", m, "--top-p", "0", "hi"]), "top-p");
    assert_refused(&minfer(&["run", "-m", m, "--top-p", "1.5", "hi"]), "top-p");
    assert_refused(&minfer(&["run", "-m", m, "-c", "0", "hi"]), "--ctx-size");
    assert_refused(
        &minfer(&["run", "-m", m, "--backend", "warp", "hi"]),
        "unknown backend 'warp'",
    );
    assert_refused(
        &minfer(&["run", "-m", m, "--backend", "cuda", "hi"]),
        "not compiled",
    );
    assert_refused(&minfer(&["run", "-m", m, "-t", "0", "hi"]), "threads");
    let missing = dir.path().join("nope.gguf");
    assert_refused(
        &minfer(&["run", "-m", missing.to_str().unwrap(), "hi"]),
        "not found",
    );
    // A well-formed GGUF of an architecture minfer does not run.
    let other = dir.path().join("mamba.gguf");
    let mut w = GgufWriter::new();
    w.add_meta("general.architecture", MetaValue::String("mamba".into()));
    w.write_to(&other).unwrap();
    assert_refused(
        &minfer(&["run", "-m", other.to_str().unwrap(), "hi"]),
        "unsupported architecture `mamba`; supported: qwen2, qwen3",
    );
}

#[test]
fn perplexity_reports_a_ppl_line() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
    let text = dir.path().join("t.txt");
    std::fs::write(
        &text,
        "the quick brown fox jumps over the lazy dog. ".repeat(40),
    )
    .unwrap();
    let (m, t) = (m.to_str().unwrap(), text.to_str().unwrap());
    let perplexity = |ctx: &str| minfer(&["perplexity", "-m", m, "-f", t, "-c", ctx]);
    let out = perplexity("64");
    assert_ran(&out);
    let s = String::from_utf8_lossy(&out.stdout);
    let ppl: f64 = s
        .trim()
        .strip_prefix("PPL = ")
        .and_then(|r| r.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no PPL line: {s}"));
    assert!(ppl.is_finite() && ppl > 1.0, "{ppl}");
    assert_refused(&perplexity("0"), "--ctx-size");
}

#[test]
fn numeric_flags_outside_their_range_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
    let m = m.to_str().unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(&text, "some text to score. ".repeat(20)).unwrap();
    let t = text.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["run", "-m", m, "-t", "100000", "hi"], "--threads"),
        (
            &["run", "-m", m, "-t", "18446744073709551616", "hi"],
            "--threads",
        ),
        (&["run", "-m", m, "-c", "1000000000", "hi"], "--ctx-size"),
        (
            &["run", "-m", m, "-c", "18446744073709551615", "hi"],
            "--ctx-size",
        ),
        (
            &["run", "-m", m, "--repeat-last-n", "100000000", "hi"],
            "--repeat-last-n",
        ),
        (&["run", "-m", m, "--temp", "1e39", "hi"], "--temp"),
        (&["run", "-m", m, "--temp", "inf", "hi"], "--temp"),
        (
            &["run", "-m", m, "--presence-penalty=-inf", "hi"],
            "--presence-penalty",
        ),
        (
            &["run", "-m", m, "--frequency-penalty", "nan", "hi"],
            "--frequency-penalty",
        ),
        (
            &[
                "run",
                "-m",
                m,
                "--repeat-penalty",
                "3e38",
                "--min-p",
                "2",
                "hi",
            ],
            "--min-p",
        ),
        (&["bench", "-m", m, "-r", "0"], "--repetitions"),
        (&["bench", "-m", m, "-p", "1000000000"], "--n-prompt"),
        (&["bench", "-m", m, "-n", "18446744073709551615"], "--n-gen"),
        (
            &["perplexity", "-m", m, "-f", t, "--chunks", "0"],
            "--chunks",
        ),
        (
            &["perplexity", "-m", m, "-f", t, "-c", "99999999999"],
            "--ctx-size",
        ),
    ];
    for (args, flag) in cases {
        let out = minfer(args);
        assert_refused(&out, flag);
        assert!(out.stdout.is_empty(), "{args:?} printed output");
    }
}

#[test]
fn a_huge_n_predict_stops_cleanly_at_the_end_of_the_context() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
    let m = m.to_str().unwrap();
    for n in ["100", "18446744073709551615"] {
        // Greedy decoding of this tiny model meets no end-of-generation token within 16
        // positions, so the run can only end at the context's end.
        let out = minfer(&[
            "run", "-m", m, "-c", "16", "-n", n, "--temp", "0", "--seed", "1", "hi",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "-n {n}: {err}");
        assert!(
            err.contains("stopped at the end of the context (16 tokens"),
            "-n {n}: {err}"
        );
        assert!(!out.stdout.is_empty(), "-n {n}: no text");
    }
    // A prompt that fills the context leaves nothing to generate: a named error.
    assert_refused(
        &minfer(&[
            "run",
            "-m",
            m,
            "-c",
            "2",
            "-n",
            "5",
            "hello world, this is long",
        ]),
        "no room to generate",
    );
}

#[test]
fn bad_minfer_variables_are_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
    let m = m.to_str().unwrap();
    let cases = [
        ("MINFER_ISA", "bogus", vec!["info", "-m", m]),
        (
            "MINFER_PROFILE",
            "yes",
            vec!["run", "-m", m, "-n", "2", "hi"],
        ),
        ("MINFER_BATCH", "2", vec!["tokenize", "-m", m, "hi"]),
        (
            "MINFER_REPACK",
            "off",
            vec!["bench", "-m", m, "-p", "4", "-n", "0", "-r", "1"],
        ),
        ("MINFER_GRAPH_TRACE", "true", vec!["pull", "--list"]),
    ];
    for (var, value, args) in cases {
        let out = minfer_command(dir.path())
            .args(&args)
            .env(var, value)
            .output()
            .expect("run minfer");
        assert_refused(&out, &format!("{var}=\"{value}\""));
        assert_refused(&out, "accepted values are");
        assert!(
            out.stdout.is_empty(),
            "{var}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let out = minfer_command(dir.path())
        .args(["pull", "--list"])
        .env("MINFER_BACKENDS", "cpu,warp")
        .output()
        .expect("run minfer");
    assert_refused(&out, "unknown backend 'warp'");
    assert!(out.stdout.is_empty());
    // The accepted values still work.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["info", "-m", m])
        .env("MINFER_ISA", "scalar")
        .output()
        .expect("run minfer");
    assert_ran(&out);
}

#[test]
fn a_small_context_shifts_or_refuses_as_ctx_overflow_asks() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
    let m = m.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut a = vec![
            "run",
            "-m",
            m,
            "-c",
            "16",
            "-n",
            "40",
            "--temp",
            "0",
            "-t",
            "1",
            "hello there",
        ];
        a.extend_from_slice(extra);
        minfer(&a)
    };
    // shift: generation goes on past the end of the context, keeping the first tokens.
    let out = run(&["--ctx-overflow", "shift", "--keep", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("dropped") && err.contains("after the first 2"),
        "{err}"
    );
    assert!(number_before(&err, " tokens, ") > 0, "{err}");
    let generated = number_before(err.rsplit("generated ").next().unwrap_or(""), " tokens");
    assert!(
        generated > 16,
        "generated {generated} tokens in a context of 16: {err}"
    );
    // Without a policy the run stops at the context's end, as before.
    let plain = run(&[]);
    let perr = String::from_utf8_lossy(&plain.stderr);
    assert!(plain.status.success(), "{perr}");
    assert!(perr.contains("stopped at the end of the context"), "{perr}");
    // The shifted run's text starts as the plain one's: the shift only continues it.
    let (shifted, stopped) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&plain.stdout),
    );
    assert!(
        shifted.starts_with(stopped.trim_end_matches('\n')),
        "{shifted:?} does not continue {stopped:?}"
    );
    // refuse: a clear message and a failure, before any text.
    let out = run(&["--ctx-overflow", "refuse"]);
    assert_refused(&out, "--ctx-overflow refuse");
    assert_refused(&out, "context holds 16");
    assert!(out.stdout.is_empty());
    // refuse lets a run that fits go on.
    let fits = minfer(&[
        "run",
        "-m",
        m,
        "-c",
        "16",
        "-n",
        "4",
        "--ctx-overflow",
        "refuse",
        "hi",
    ]);
    assert_ran(&fits);
    assert_refused(&run(&["--ctx-overflow", "drop"]), "--ctx-overflow");
    // A shifted run's session holds what its KV holds, and restores.
    let s = dir.path().join("s.kv");
    let s = s.to_str().unwrap();
    let first = run(&["--ctx-overflow", "shift", "--session", s]);
    assert_ran(&first);
    let again = run(&["--ctx-overflow", "shift", "--session", s]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success() && err.contains("reusing"), "{err}");
    assert_eq!(
        again.stdout, first.stdout,
        "a restored shifted session differs"
    );
}
