//! The per-node trace with the wgpu backend, as a user runs it: `MINFER_TRACE` with
//! `minfer run --backend wgpu` writes a trace of the mixed CPU+wgpu graphs that records
//! every live non-KV node and agrees with the CPU's trace of the same prompt, and
//! `minfer viz --backend wgpu` streams a live run's nodes. The adapter is whatever the
//! machine has (CI: Mesa's lavapipe); without one these tests fail, unless
//! `MINFER_WGPU_TESTS=skip` skips them explicitly.

#![cfg(feature = "wgpu")]

use crate::common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use common::{http, minfer_command, start_viz, test_home};
use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model, TinySpec};
use serde_json::Value;

/// Statistics bound between the two backends' traces, relative to the node's scale
/// (its largest magnitude, at least 1): they differ by float rounding only, which a
/// quantized matmul's Q8 activation levels can grow (the logits bound of the wgpu
/// model tests).
const STATS_BOUND: f64 = 3e-2;

fn minfer(args: &[&str], trace: &Path) -> Output {
    minfer_command(&test_home("trace-wgpu"))
        .args(args)
        .env_remove("MINFER_WGPU_API")
        .env("MINFER_TRACE", trace)
        .output()
        .expect("run minfer")
}

fn tiny(dir: &Path) -> PathBuf {
    let p = dir.join("tiny-qwen2.gguf");
    write_tiny_model(&p, &TinySpec::qwen2(GgmlType::Q8_0, 7)).expect("write tiny model");
    p
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A greedy traced run on `backend`, checked against the schema.
fn traced(model: &str, backend: &str, dir: &Path) -> Value {
    let path = dir.join(format!("trace-{backend}.json"));
    let out = minfer(
        &[
            "run",
            "-m",
            model,
            "--temp",
            "0",
            "-t",
            "2",
            "-n",
            "4",
            "--backend",
            backend,
            "-p",
            "Hello world",
        ],
        &path,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&std::fs::read(&path).expect("the trace file"))
        .expect("the trace is JSON");
    minfer_graph::trace::check_trace(&doc).expect("the trace follows the schema");
    doc
}

/// Node entries of every step of `phase` by name (through the phase's graph).
fn by_name(phase: &Value) -> Vec<HashMap<String, Value>> {
    let names: Vec<&str> = phase["graph"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    phase["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    (
                        names[e["id"].as_u64().unwrap() as usize].to_string(),
                        e.clone(),
                    )
                })
                .collect()
        })
        .collect()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// The largest difference between two entries of one node, relative to its scale.
fn entry_err(g: &Value, c: &Value) -> f64 {
    let (gs, cs) = (&g["stats"], &c["stats"]);
    let scale = f(&cs["min"]).abs().max(f(&cs["max"]).abs()).max(1.0);
    let mut e = ["min", "max", "mean", "rms"]
        .iter()
        .map(|k| (f(&gs[k]) - f(&cs[k])).abs())
        .fold(0f64, f64::max);
    for (a, b) in g["values"]
        .as_array()
        .unwrap()
        .iter()
        .zip(c["values"].as_array().unwrap())
    {
        e = e.max((f(a) - f(b)).abs());
    }
    e / scale
}

#[test]
fn a_wgpu_trace_records_every_node_and_agrees_with_the_cpu_trace() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    let gpu = traced(m, "wgpu", dir.path());
    let cpu = traced(m, "cpu", dir.path());
    let (gp, cp) = (
        gpu["phases"].as_array().unwrap(),
        cpu["phases"].as_array().unwrap(),
    );
    let kinds = |p: &[Value]| p.iter().map(|x| x["kind"].clone()).collect::<Vec<_>>();
    assert_eq!(kinds(gp), kinds(cp));
    let mut backends = std::collections::BTreeSet::new();
    let (mut worst, mut compared) = (0f64, 0usize);
    for (g, c) in gp.iter().zip(cp) {
        let nodes = g["graph"]["nodes"].as_array().unwrap();
        // Every live node but the KV views and stores has an entry in every step.
        let live: Vec<u64> = nodes
            .iter()
            .filter(|n| {
                n["dead"] != true
                    && !["kvcache_load", "kvcache_store"].contains(&n["op"].as_str().unwrap())
            })
            .map(|n| n["id"].as_u64().unwrap())
            .collect();
        for s in g["steps"].as_array().unwrap() {
            let ids: Vec<u64> = s["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["id"].as_u64().unwrap())
                .collect();
            assert_eq!(ids, live, "{} step: every live non-KV node", g["kind"]);
            for &id in &ids {
                backends.insert(nodes[id as usize]["backend"].as_str().unwrap().to_string());
            }
        }
        // Nodes of one name in both graphs (the decode graphs differ where wgpu fuses
        // q, k and v) agree within float rounding.
        for (gs, cs) in by_name(g).iter().zip(by_name(c)) {
            for (name, ge) in gs {
                let Some(ce) = cs.get(name) else { continue };
                for k in ["n", "stride", "dtype"] {
                    assert_eq!(ge[k], ce[k], "{name}: {k}");
                }
                for k in ["nan", "inf"] {
                    assert_eq!(ge["stats"][k], ce["stats"][k], "{name}: {k}");
                }
                let e = entry_err(ge, ce);
                assert!(
                    e <= STATS_BOUND,
                    "{name}: {e:e} above {STATS_BOUND:e}\nwgpu {ge}\ncpu {ce}"
                );
                worst = worst.max(e);
                compared += 1;
            }
        }
    }
    assert_eq!(
        backends.into_iter().collect::<Vec<_>>(),
        ["cpu", "wgpu"],
        "the mixed graph's nodes of both backends are recorded"
    );
    // The prefill graphs are the same on both backends, so at least their nodes compare.
    let prefill = cp[0]["steps"][0]["nodes"].as_array().unwrap().len();
    assert!(
        compared >= prefill,
        "{compared} entries compared, prefill has {prefill}"
    );
    eprintln!("{compared} node entries compared, worst statistics error {worst:.2e}");
}

#[test]
fn viz_with_wgpu_streams_every_node_of_a_live_run() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let viz = start_viz(&["-m", m.to_str().unwrap(), "--backend", "wgpu"]);
    let addr = viz.addr();
    let mut sse = TcpStream::connect(&addr).expect("connect");
    sse.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    write!(
        sse,
        "GET /viz/events HTTP/1.0\r\nHost: {}\r\naccept: text/event-stream\r\n\r\n",
        addr
    )
    .expect("subscribe");
    let mut events = BufReader::new(sse).lines();
    // The subscription is live once its response head has arrived.
    for line in events.by_ref() {
        if line.expect("event stream").is_empty() {
            break;
        }
    }
    let r = http(&addr, "POST /viz/run", r#"{"prompt":"Hello","n":3}"#);
    assert!(r.starts_with("HTTP/1.1 202"), "{r}");
    let (mut graph, mut kind, mut nodes, mut steps) = (Value::Null, String::new(), 0, 0);
    let mut on_wgpu = 0;
    for line in events {
        let line = line.expect("event stream");
        if let Some(k) = line.strip_prefix("event: ") {
            kind = k.to_string();
        } else if let Some(data) = line.strip_prefix("data: ") {
            let v: Value = serde_json::from_str(data).expect("event data is JSON");
            match kind.as_str() {
                "phase" => graph = v["graph"].clone(),
                "node" => {
                    nodes += 1;
                    let id = v["id"].as_u64().unwrap() as usize;
                    if graph["nodes"][id]["backend"] == "wgpu" {
                        on_wgpu += 1;
                        assert!(v["stats"]["rms"].is_number(), "{v}");
                    }
                }
                "step" => steps += 1,
                "done" => {
                    assert!(v.get("error").is_none(), "the run failed: {v}");
                    break;
                }
                _ => {}
            }
        }
    }
    assert!(steps >= 3, "{steps} steps");
    assert!(
        on_wgpu > 0 && on_wgpu < nodes,
        "{on_wgpu} of {nodes} node events on wgpu"
    );
    let doc = http(&addr, "GET /viz/trace", "");
    let body = doc.split("\r\n\r\n").nth(1).expect("a body");
    let doc: Value = serde_json::from_str(body).expect("the run's trace");
    minfer_graph::trace::check_trace(&doc).expect("the live run's trace follows the schema");
}
