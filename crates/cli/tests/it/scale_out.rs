//! Scale-out behind the SMG router: two `minfer serve` workers on the tiny Qwen2 and the
//! router, started by scripts/scale_out.py's recipe and driven by scripts/e2e_scale_out.py
//! with the official `openai` client (prefix affinity, spreading, a worker killed under
//! load, the worker restarted).

use crate::common;

use std::process::Command;
use std::time::Instant;

use common::{test_home, tiny_qwen2};

#[test]
fn smg_routes_across_minfer_workers_and_survives_a_killed_worker() {
    for module in ["smg", "openai"] {
        let probe = Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .output()
            .expect("python3 runs");
        assert!(
            probe.status.success(),
            "the {module} Python package is not importable (scripts/test.sh installs it with \
             `python3 -m pip install {module}`): {}",
            String::from_utf8_lossy(&probe.stderr)
        );
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let model = tiny_qwen2(dir.path());
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/e2e_scale_out.py");
    let start = Instant::now();
    let out = Command::new("python3")
        .arg(script)
        .args(["--minfer", env!("CARGO_BIN_EXE_minfer"), "--"])
        .args(["-m", model.to_str().expect("UTF-8 temp path")])
        .args(["--slots", "2", "-c", "512", "-t", "1", "--backend", "cpu"])
        .env("MINFER_HOME", test_home("scale-out"))
        .env_remove("MINFER_BACKENDS")
        .output()
        .expect("run scripts/e2e_scale_out.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("e2e ok"),
        "e2e_scale_out.py failed after {:?}\nstdout: {stdout}\nstderr: {}",
        start.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );
    // What each part took, shown with --nocapture.
    println!("{stdout}");
}
