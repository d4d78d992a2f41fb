//! `minfer run`, `bench`, `serve` and `info` with the wgpu backend, as a user runs them:
//! the real binary, on a tiny model (run, serve) and on the default model (bench). The
//! adapter is whatever the machine has (CI: Mesa's lavapipe, a CPU emulation, which
//! only `--backend wgpu` uses). Without an adapter these tests fail, unless
//! `MINFER_WGPU_TESTS=skip` skips them explicitly.

#![cfg(feature = "wgpu")]

use crate::common;

use std::process::Output;

use common::{http, minfer_command, start_server, test_home, tiny_qwen2};

fn minfer(args: &[&str], env: &[(&str, &str)]) -> Output {
    minfer_command(&test_home("wgpu"))
        .args(args)
        .env_remove("MINFER_WGPU_API")
        .envs(env.iter().copied())
        .output()
        .expect("run minfer")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// minfer's own lines on stderr (a driver may print lines of its own).
fn own_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("minfer:") || l.starts_with("error:"))
        .collect()
}

#[test]
fn run_with_backend_wgpu_generates_what_the_cpu_generates_and_traces_its_splits() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
    let m = m.to_str().unwrap();
    let args = |b: &'static str| {
        [
            "run",
            "-m",
            m,
            "-p",
            "Hello",
            "-n",
            "12",
            "--temp",
            "0",
            "--backend",
            b,
        ]
    };
    let gpu = minfer(&args("wgpu"), &[("MINFER_GRAPH_TRACE", "1")]);
    let (so, se) = (text(&gpu.stdout), text(&gpu.stderr));
    assert!(gpu.status.success(), "{se}");
    assert!(!se.contains("panicked"), "{se}");
    // The trace shows the splits: the inputs on the host, the rest on the device.
    assert!(se.contains("splits") && se.contains("wgpu nodes"), "{se}");
    assert!(se.contains("cpu nodes"), "{se}");
    let cpu = minfer(&args("cpu"), &[]);
    assert!(cpu.status.success(), "{}", text(&cpu.stderr));
    assert!(!so.trim().is_empty());
    assert_eq!(
        so,
        text(&cpu.stdout),
        "greedy text differs between wgpu and the CPU"
    );
}

#[test]
fn the_default_selection_leaves_an_emulated_adapter_out_in_one_line() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
    // Quiet by default: a CPU user would read the line on every run.
    let quiet = minfer(
        &["run", "-m", m.to_str().unwrap(), "-p", "Hi", "-n", "2"],
        &[],
    );
    let qe = text(&quiet.stderr);
    assert!(quiet.status.success(), "{qe}");
    assert!(!qe.lines().any(|l| l.starts_with("minfer:")), "{qe}");
    let out = minfer(
        &[
            "run",
            "-m",
            m.to_str().unwrap(),
            "-p",
            "Hi",
            "-n",
            "2",
            "-v",
        ],
        &[],
    );
    let se = text(&out.stderr);
    assert!(out.status.success(), "{se}");
    let info = minfer(&["info", "-m", m.to_str().unwrap(), "--json"], &[]);
    let j: serde_json::Value = serde_json::from_slice(&info.stdout).expect("info --json");
    let wgpu = j["backends"]
        .as_array()
        .and_then(|a| a.iter().find(|b| b["name"] == "wgpu"))
        .expect("info lists wgpu")
        .clone();
    assert_eq!(wgpu["usable"], true, "{wgpu}");
    let emulated = wgpu["detail"]["emulated"] == true;
    // minfer's notices only: Mesa's Vulkan layer may print an `error:` line of its own
    // when probed without a display (XDG_RUNTIME_DIR unset), which minfer cannot word.
    let notices: Vec<&str> = se.lines().filter(|l| l.starts_with("minfer:")).collect();
    if emulated {
        assert_eq!(notices.len(), 1, "{se}");
        assert!(
            notices[0].starts_with("minfer: backend 'wgpu' not used (")
                && notices[0].contains("CPU emulation")
                && notices[0].ends_with("running on the CPU"),
            "{se}"
        );
        assert_eq!(wgpu["default"], false);
    } else {
        assert!(notices.is_empty(), "{se}");
        assert_eq!(wgpu["default"], true);
    }
}

/// `MINFER_WGPU_API=metal` on Linux: no driver answers, as on a machine without a GPU.
#[cfg(target_os = "linux")]
#[test]
fn without_an_adapter_the_default_runs_on_the_cpu_and_backend_wgpu_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
    let m = m.to_str().unwrap();
    let no_gpu = [("MINFER_WGPU_API", "metal")];
    let reason = "no GPU adapter found (no Metal driver answered)";
    let out = minfer(&["run", "-m", m, "-p", "Hi", "-n", "2"], &no_gpu);
    let se = text(&out.stderr);
    assert!(out.status.success(), "{se}");
    assert!(own_lines(&se).is_empty(), "quiet by default: {se}");
    let out = minfer(&["run", "-m", m, "-p", "Hi", "-n", "2", "-v"], &no_gpu);
    let se = text(&out.stderr);
    assert!(out.status.success(), "{se}");
    assert_eq!(
        own_lines(&se),
        [format!("minfer: backend 'wgpu' not used ({reason}); running on the CPU").as_str()],
        "{se}"
    );
    for cmd in [
        vec!["run", "-m", m, "-p", "Hi", "-n", "2", "--backend", "wgpu"],
        vec!["bench", "-m", m, "-p", "4", "-n", "2", "--backend", "wgpu"],
        vec!["serve", "-m", m, "--port", "0", "--backend", "wgpu"],
    ] {
        let out = minfer(&cmd, &no_gpu);
        let se = text(&out.stderr);
        assert!(!out.status.success(), "{cmd:?}: {se}");
        assert!(!se.contains("panicked"), "{se}");
        assert_eq!(
            own_lines(&se),
            [format!("error: backend 'wgpu' is not usable on this machine: {reason}").as_str()],
            "{cmd:?}: {se}"
        );
    }
    let out = minfer(&["info", "-m", m], &no_gpu);
    let so = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(so.contains(&format!("wgpu   not usable: {reason}")), "{so}");
}

#[test]
fn bench_with_backend_wgpu_reports_the_backends_that_ran() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let model = minfer_hub::testing::default_model();
    let out = minfer(
        &[
            "bench",
            "-m",
            model.to_str().unwrap(),
            "--backend",
            "wgpu",
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
        ],
        &[],
    );
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{se}");
    for test in ["pp8", "tg4"] {
        let row = so
            .lines()
            .find(|l| l.contains(&format!("| {test} |")))
            .unwrap_or_else(|| panic!("no {test} row: {so}"));
        assert!(row.contains("| wgpu,cpu |"), "{row}");
        let ts: f64 = row
            .rsplit('|')
            .nth(1)
            .and_then(|c| c.split('±').next())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no t/s in {row}"));
        assert!(ts > 0.0, "{row}");
    }
    eprintln!("{so}");
}

fn json_body(resp: &str) -> serde_json::Value {
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let body = resp.split("\r\n\r\n").nth(1).expect("a body");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn serve_with_backend_wgpu_answers_and_names_the_adapter_on_health() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
    let (server, addr) = start_server(
        std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
            .args(["serve", "-m", m.to_str().unwrap(), "--backend", "wgpu"])
            .args(["--host", "127.0.0.1", "--port", "0", "--slots", "2"])
            .env_remove("MINFER_BACKENDS"),
    );
    let health = json_body(&http(&addr, "GET /health", ""));
    assert_eq!(health["status"], "ok", "{health}");
    let names: Vec<&str> = health["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .filter_map(|b| b["name"].as_str())
        .collect();
    assert_eq!(names, ["wgpu", "cpu"], "{health}");
    assert!(
        health["adapter"]["name"]
            .as_str()
            .is_some_and(|n| !n.is_empty()),
        "{health}"
    );
    let body = r#"{"prompt":"Hello","max_tokens":6,"temperature":0}"#;
    let done = json_body(&http(&addr, "POST /v1/completions", body));
    assert_eq!(done["usage"]["completion_tokens"], 6, "{done}");
    drop(server);
}
