//! The per-node trace (`MINFER_TRACE`) and `minfer viz` as a user runs them: the real
//! binary writes trace files, checked against the schema and against the graph export;
//! the real page is driven in a headless Chromium (through playwright-core, see
//! `viz_browser.cjs`), which `scripts/test.sh` installs.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{http_with, start_viz};
use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model, TinySpec};
use serde_json::Value;

fn minfer(args: &[&str], trace: Option<&Path>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_minfer"));
    c.args(args)
        .env(
            "MINFER_HOME",
            std::env::temp_dir().join("minfer-viz-test-home"),
        )
        .env_remove("MINFER_BACKENDS")
        .env_remove("MINFER_TRACE");
    if let Some(t) = trace {
        c.env("MINFER_TRACE", t);
    }
    c.output().expect("run minfer")
}

fn tiny(dir: &Path) -> PathBuf {
    let p = dir.join("tiny-qwen2.gguf");
    write_tiny_model(&p, &TinySpec::qwen2(GgmlType::Q8_0, 7)).expect("write tiny model");
    p
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).expect("read json")).expect("parse json")
}

/// Runs `model` greedily with a trace and checks the file against the schema, the
/// graph exports of the same prompt, and the generated text; returns the document.
fn traced_run(model: &str, prompt: &str, n: usize, dir: &Path) -> Value {
    let path = dir.join("trace.json");
    let n_s = n.to_string();
    let common = ["-m", model, "--temp", "0", "-t", "2", "--backend", "cpu"];
    let mut args = vec!["run"];
    args.extend(common);
    args.extend(["-n", &n_s, "-p", prompt]);
    let out = minfer(&args, Some(&path));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc = read_json(&path);
    minfer_graph::trace::check_trace(&doc).expect("the trace follows the schema");
    assert_eq!(doc["prompt"], prompt);
    let phases = doc["phases"].as_array().unwrap();
    let kinds: Vec<&str> = phases.iter().map(|p| p["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["prefill", "decode"]);
    // The phase graphs are the `--dump-graph-json` exports of the same prompt: ids match.
    for (p, kind) in phases.iter().zip(["prefill", "decode"]) {
        let g = dir.join(format!("{kind}.json"));
        let mut dump = vec!["run"];
        dump.extend(common);
        dump.extend([
            "--dump-graph-json",
            g.to_str().unwrap(),
            "--dump-kind",
            kind,
            prompt,
        ]);
        let out = minfer(&dump, None);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(
            p["graph"],
            read_json(&g),
            "{kind} graph differs from its export"
        );
    }
    // One prefill step and one decode step per generated token but the last.
    let steps: Vec<&Value> = phases
        .iter()
        .flat_map(|p| p["steps"].as_array().unwrap())
        .collect();
    assert_eq!(
        phases
            .iter()
            .map(|p| p["steps"].as_array().unwrap().len())
            .collect::<Vec<_>>(),
        [1, n - 1]
    );
    let gen: String = steps.iter().map(|s| s["text"].as_str().unwrap()).collect();
    if gen.is_ascii() {
        // Token by token the text is the run's (pieces of a character are not whole).
        assert_eq!(gen.trim_end(), text(&out.stdout).trim_end());
    }
    for (p, phase) in phases.iter().enumerate() {
        let nodes = phase["graph"]["nodes"].as_array().unwrap();
        for s in phase["steps"].as_array().unwrap() {
            // Greedy: the step's token is its top logit.
            assert_eq!(s["token"], s["logits_top"][0]["id"], "phase {p}");
            let got: Vec<u64> = s["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["id"].as_u64().unwrap())
                .collect();
            // Every live node that executes or is filled is recorded, in build order;
            // KV views and stores are not.
            let want: Vec<u64> = nodes
                .iter()
                .filter(|n| {
                    !n["dead"].as_bool().unwrap()
                        && !["kvcache_load", "kvcache_store"].contains(&n["op"].as_str().unwrap())
                })
                .map(|n| n["id"].as_u64().unwrap())
                .collect();
            assert_eq!(got, want, "phase {p}: recorded nodes");
            for e in s["nodes"].as_array().unwrap() {
                let st = &e["stats"];
                let (lo, hi) = (st["min"].as_f64().unwrap(), st["max"].as_f64().unwrap());
                let node = &nodes[e["id"].as_u64().unwrap() as usize];
                let numel: u64 = node["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap())
                    .product();
                assert_eq!(e["n"].as_u64().unwrap(), numel, "{}", node["name"]);
                assert!(e["values"].as_array().unwrap().len() <= 256);
                for v in e["values"].as_array().unwrap() {
                    let v = v.as_f64().unwrap();
                    assert!(
                        lo <= v && v <= hi,
                        "{} value {v} outside [{lo}, {hi}]",
                        node["name"]
                    );
                }
                assert!(st["rms"].as_f64().unwrap() >= st["mean"].as_f64().unwrap().abs() - 1e-6);
            }
        }
    }
    doc
}

#[test]
fn trace_file_on_the_tiny_model_follows_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let doc = traced_run(m.to_str().unwrap(), "Hello world, hello", 4, dir.path());
    // Token ids are inputs: read back as integers, not as float bit patterns.
    let step = &doc["phases"][1]["steps"][0];
    let ids = step["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == 0)
        .unwrap();
    assert_eq!(ids["dtype"], "i32");
    assert_eq!(
        ids["values"][0].as_f64(),
        doc["phases"][0]["steps"][0]["token"].as_f64()
    );
}

#[test]
fn trace_file_on_the_default_model_follows_the_schema() {
    let model = minfer_hub::default_model_path();
    assert!(
        model.exists(),
        "run `minfer pull` first: {} is missing",
        model.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let doc = traced_run(model.to_str().unwrap(), "def fib(n):", 3, dir.path());
    let decode = &doc["phases"][1]["graph"]["nodes"];
    assert!(decode.as_array().unwrap().len() > 400, "the 24-layer graph");
}

#[test]
fn a_trace_that_cannot_be_recorded_faithfully_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    let t = dir.path().join("t.json");
    let out = minfer(
        &["run", "-m", m, "-n", "2", "--ctx-overflow", "shift", "Hi"],
        Some(&t),
    );
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("MINFER_TRACE") && err.contains("--ctx-overflow shift"),
        "{err}"
    );
    assert!(!t.exists(), "nothing was run or written");
}

/// The tokens taken from each step of a trace, phase after phase.
fn step_tokens(doc: &Value) -> Vec<Value> {
    doc["phases"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            p["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["token"].clone())
        })
        .collect()
}

#[test]
fn a_run_over_a_loaded_session_is_traced_from_the_steps_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    let sess = dir.path().join("s.bin");
    let traced = |name: &str| {
        let t = dir.path().join(name);
        let out = minfer(
            &[
                "run",
                "-m",
                m,
                "--temp",
                "0",
                "-t",
                "2",
                "--backend",
                "cpu",
                "-n",
                "3",
                "--session",
                sess.to_str().unwrap(),
                "-p",
                "Hello world, hello",
            ],
            Some(&t),
        );
        let err = text(&out.stderr);
        assert!(out.status.success(), "{err}");
        let doc = read_json(&t);
        minfer_graph::trace::check_trace(&doc).expect("the trace follows the schema");
        (doc, err)
    };
    let (fresh, _) = traced("fresh.json");
    let (resumed, err) = traced("resumed.json");
    assert!(
        err.contains("reusing"),
        "the second run loaded the session: {err}"
    );
    // The resumed run re-runs only the last prompt token, a one-token step, yet takes
    // the same greedy tokens from the same steps as the fresh run.
    let n_tokens = |d: &Value| d["phases"][0]["steps"].as_array().unwrap().len();
    assert_eq!(fresh["phases"][0]["kind"], "prefill");
    assert_eq!(resumed["phases"][0]["kind"], "decode");
    assert!(n_tokens(&resumed) >= 1);
    let (a, b) = (step_tokens(&fresh), step_tokens(&resumed));
    assert!(a.iter().all(|t| t.is_u64()), "{a:?}");
    assert_eq!(a, b, "the same tokens from the same steps");
}

#[test]
fn viz_refuses_a_bad_trace_file_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str); 4] = [
        ("not json {", "is not valid JSON"),
        (
            r#"{"format":"minfer-graph","version":1}"#,
            "not a minfer-trace file",
        ),
        (
            r#"{"format":"minfer-trace","version":9,"model":"m","prompt":"p","phases":[]}"#,
            "unsupported trace version 9",
        ),
        (
            r#"{"format":"minfer-trace","version":1,"model":"m","prompt":"p","phases":[{"kind":"decode","graph":{"format":"minfer-graph","nodes":[]},"steps":[{"token":1,"text":"","logits_top":[],"nodes":[{"id":3}]}]}]}"#,
            "id 3 is not a node",
        ),
    ];
    for (body, want) in cases {
        let p = dir.path().join("bad.json");
        std::fs::write(&p, body).unwrap();
        let out = minfer(
            &["viz", "--trace", p.to_str().unwrap(), "--port", "0"],
            None,
        );
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{body}: accepted");
        assert!(
            err.contains(want) && err.contains("bad.json"),
            "{want}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let missing = minfer(&["viz", "--trace", "/nonexistent/t.json"], None);
    assert!(text(&missing.stderr).contains("reading trace /nonexistent/t.json"));
}

fn status(resp: &str) -> u16 {
    resp.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[test]
fn viz_guards_its_host_origin_and_body_type_as_the_server_does() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let viz = start_viz(&[
        "-m",
        m.to_str().unwrap(),
        "--allowed-hosts",
        "box.lan",
        "--cors-origins",
        "http://app.local:3000",
    ]);
    let addr = viz.addr();
    let port = addr.rsplit(':').next().unwrap().to_string();
    let localhost = format!("localhost:{port}");
    // A DNS-rebinding page: a foreign Host (with its own origin) starts nothing and reads
    // nothing.
    let evil = [
        ("host", "evil.example:80"),
        ("origin", "http://evil.example"),
        ("content-type", "application/json"),
    ];
    let r = http_with(&addr, "POST /viz/run", &evil, r#"{"prompt":"hi","n":2}"#);
    assert_eq!(status(&r), 403, "{r}");
    assert!(
        r.contains("evil.example") && r.contains("--allowed-hosts"),
        "{r}"
    );
    for path in ["/viz/trace", "/viz/graph", "/viz/events", "/viz/info", "/"] {
        let r = http_with(
            &addr,
            &format!("GET {path}"),
            &[("host", "evil.example")],
            "",
        );
        assert_eq!(status(&r), 403, "{path}: {r}");
    }
    // A foreign origin under a good Host is refused unless listed.
    let r = http_with(
        &addr,
        "POST /viz/run",
        &[
            ("host", &addr),
            ("origin", "https://evil.example"),
            ("content-type", "application/json"),
        ],
        r#"{"prompt":"hi","n":2}"#,
    );
    assert_eq!(status(&r), 403, "{r}");
    assert!(r.contains("--cors-origins"), "{r}");
    let r = http_with(
        &addr,
        "GET /viz/info",
        &[("host", &addr), ("origin", "http://app.local:3000")],
        "",
    );
    assert_eq!(status(&r), 200, "{r}");
    assert!(
        r.to_ascii_lowercase()
            .contains("access-control-allow-origin: http://app.local:3000"),
        "{r}"
    );
    // The page's own names, and a listed one, are served; a text/plain POST (a CORS
    // simple request) is refused.
    for host in [addr.as_str(), localhost.as_str(), "box.lan:8000"] {
        let own = format!("http://{host}");
        let r = http_with(
            &addr,
            "GET /viz/info",
            &[("host", host), ("origin", &own)],
            "",
        );
        assert_eq!(status(&r), 200, "{host}: {r}");
    }
    let r = http_with(
        &addr,
        "POST /viz/run",
        &[("host", &addr), ("content-type", "text/plain")],
        r#"{"prompt":"hi","n":2}"#,
    );
    assert_eq!(status(&r), 415, "{r}");
}

fn artifacts() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/viz-artifacts");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the browser script against `url` in `mode` and returns what it measured.
fn browse(url: &str, mode: &str, shot: &Path) -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let modules = root.join("target/viz-npm/node_modules");
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        modules.join("playwright-core").exists() && Path::new(&chromium).exists(),
        "the browser test needs Chromium ({chromium}) and playwright-core under {}: \
         scripts/test.sh installs both",
        modules.display()
    );
    let out = Command::new("node")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/viz_browser.cjs"))
        .env("NODE_PATH", &modules)
        .env("VIZ_URL", url)
        .env("VIZ_MODE", mode)
        .env("VIZ_SHOT", shot)
        .env("CHROMIUM", &chromium)
        .output()
        .expect("run node");
    assert!(
        out.status.success(),
        "browser script failed\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let line = text(&out.stdout);
    serde_json::from_str(line.lines().last().unwrap_or_default()).expect("the script's JSON")
}

#[test]
fn the_page_shows_a_live_run_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let viz = start_viz(&["-m", m.to_str().unwrap()]);
    let shot = artifacts().join("viz-tiny.png");
    let r = browse(&viz.url, "full", &shot);
    eprintln!("browser: {r}");
    assert_eq!(r["errors"], serde_json::json!([]), "page errors");
    // The graph with the right node count, every node drawn (a small graph starts expanded).
    assert_eq!(r["shownNodes"], r["graphNodes"]);
    assert_eq!(r["dataIdBoxes"], r["graphNodes"]);
    // The run arrived as live events: a prefill and a decode phase, every step with nodes.
    assert!(
        r["runStatus"]
            .as_str()
            .unwrap()
            .starts_with("done: 4 tokens"),
        "{r}"
    );
    let phases = r["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2, "{r}");
    assert_eq!(
        (phases[0][0].as_str(), phases[0][1].as_u64()),
        (Some("prefill"), Some(1))
    );
    assert_eq!(
        (phases[1][0].as_str(), phases[1][1].as_u64()),
        (Some("decode"), Some(3))
    );
    let per_step: u64 = phases[1][2][0].as_u64().unwrap();
    assert!(per_step > 10);
    assert!(
        r["events"].as_u64().unwrap() >= 4 * per_step,
        "one event per node per step"
    );
    // Clicking a node shows its op, backend, sources and statistics for the step shown.
    for k in ["last", "first", "second"] {
        let s = &r[k];
        assert!(
            s["title"].as_str().unwrap().ends_with("attn_norm-0"),
            "{k}: {s}"
        );
        assert!(s["info"].as_str().unwrap().contains("rms_norm"), "{k}: {s}");
        assert!(s["info"].as_str().unwrap().contains("cpu"), "{k}: {s}");
        for stat in ["min", "max", "mean", "rms", "nan", "inf"] {
            assert!(s["cells"][stat].is_string(), "{k}: no {stat}: {s}");
        }
        assert_eq!(s["cells"]["nan"], "0");
        assert_eq!(s["bars"], 32, "{k}: the histogram");
    }
    assert_eq!(
        (r["last"]["phase"].as_u64(), r["last"]["step"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(
        (r["first"]["phase"].as_u64(), r["first"]["step"].as_u64()),
        (Some(0), Some(0))
    );
    // The next token: the decode graph's first step, with its own values.
    assert_eq!(
        (r["second"]["phase"].as_u64(), r["second"]["step"].as_u64()),
        (Some(1), Some(0))
    );
    assert_ne!(r["first"]["cells"], r["second"]["cells"]);
    assert!(shot.exists());
}

#[test]
fn the_default_model_graph_lays_out_in_seconds() {
    let model = minfer_hub::default_model_path();
    assert!(
        model.exists(),
        "run `minfer pull` first: {} is missing",
        model.display()
    );
    let viz = start_viz(&["-m", model.to_str().unwrap(), "-c", "512"]);
    let shot = artifacts().join("viz-default-model.png");
    let r = browse(&viz.url, "layout", &shot);
    eprintln!("browser: {r}");
    assert_eq!(r["errors"], serde_json::json!([]), "page errors");
    assert_eq!(r["shownNodes"], r["graphNodes"]);
    assert!(r["graphNodes"].as_u64().unwrap() > 400);
    // Collapsed, the 24 layers are one box each.
    assert!(r["initialBoxes"].as_u64().unwrap() < 40, "{r}");
    assert_eq!(r["expandedBoxes"], r["graphNodes"]);
    for k in [
        "initialLayoutMs",
        "expandedLayoutMs",
        "prefillLayoutMs",
        "expandClickMs",
    ] {
        assert!(r[k].as_f64().unwrap() < 3000.0, "{k}: {r}");
    }
    assert!(r["responsiveMs"].as_f64().unwrap() < 1000.0, "{r}");
    assert_eq!(r["prefillBoxes"], r["prefillNodes"]);
    assert!(
        r["prefillNodes"].as_u64().unwrap() > r["graphNodes"].as_u64().unwrap(),
        "{r}"
    );
}

/// One tensor in llama-eval-callback's format: header, the first and last three values of
/// each row (all of a short one), and the sum.
fn eval_callback_block(name: &str, op: &str, ne0: usize, rows: &[Vec<f64>]) -> String {
    let mut s = format!(
        "common_debug_cb_eval: {name:>24} = (f32) {op:>10}(x{{1, 1, 1, 1}}, }}) = {{{ne0}, {}, 1, 1}}\n    [\n        [\n",
        rows.len()
    );
    let f = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:12.4}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for r in rows {
        if ne0 > 6 {
            s += &format!("            [{}, ..., {}],\n", f(&r[..3]), f(&r[ne0 - 3..]));
        } else {
            s += &format!("            [{}],\n", f(r));
        }
    }
    let sum: f64 = rows.iter().flatten().sum();
    s + &format!("        ],\n    ]\n    sum = {sum:.6}\n")
}

#[test]
fn trace_diff_names_the_first_node_that_parts() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let path = dir.path().join("t.json");
    let out = minfer(
        &[
            "run",
            "-m",
            m.to_str().unwrap(),
            "--temp",
            "0",
            "-n",
            "1",
            "-p",
            "a",
        ],
        Some(&path),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc = read_json(&path);
    let graph = &doc["phases"][0]["graph"]["nodes"];
    let step = &doc["phases"][0]["steps"][0]["nodes"];
    // One token, so each node is traced whole. A llama.cpp dump of four nodes from the
    // trace's own values, `l_out-0` moved by a tenth of its RMS in one printed element:
    // the script must name it, and nothing else.
    let dump = |perturb: bool| {
        let mut s = String::new();
        for (name, op) in [
            ("attn_norm-0", "MUL"),
            ("ffn_out-0", "MUL_MAT"),
            ("l_out-0", "ADD"),
            ("attn_norm-1", "MUL"),
        ] {
            let node = graph
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["name"] == name)
                .unwrap();
            let e = step
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["id"] == node["id"])
                .unwrap();
            let ne0 = node["shape"][0].as_u64().unwrap() as usize;
            let mut vals: Vec<f64> = e["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            assert_eq!(e["stride"], 1, "small enough to be traced whole");
            if perturb && name == "l_out-0" {
                vals[1] += 0.1 * e["stats"]["rms"].as_f64().unwrap();
            }
            let rows: Vec<Vec<f64>> = vals.chunks(ne0).map(<[f64]>::to_vec).collect();
            s += &eval_callback_block(name, op, ne0, &rows);
        }
        s
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/trace_diff.py");
    let diff = |body: String| {
        let d = dir.path().join("dump.txt");
        std::fs::write(&d, body).unwrap();
        Command::new("python3")
            .arg(&script)
            .arg(&path)
            .arg(&d)
            .output()
            .unwrap()
    };
    let same = diff(dump(false));
    assert_eq!(
        same.status.code(),
        Some(0),
        "{}{}",
        text(&same.stdout),
        text(&same.stderr)
    );
    assert!(
        text(&same.stdout).contains("4 nodes matched"),
        "{}",
        text(&same.stdout)
    );
    let parted = diff(dump(true));
    let o = text(&parted.stdout);
    assert_eq!(parted.status.code(), Some(1), "{o}{}", text(&parted.stderr));
    assert!(
        o.contains("first node beyond the bound") && o.contains(" l_out-0 "),
        "{o}"
    );
    let bad = diff("not a dump".into());
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("no tensors found"));
}
