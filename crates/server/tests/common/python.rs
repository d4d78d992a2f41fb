//! A Python client script (`scripts/*.py`, the official client packages) against the
//! server on the real default model.

use std::process::Command;

use minfer_server::{start, Config};

/// Checks that the Python packages `imports` (comma-separated, as `import` takes them)
/// are importable, starts the server on the default model with `slots` slots and a
/// 2048-position context on an ephemeral port, runs `scripts/SCRIPT --base-url
/// http://ADDR/v1`, and asserts it exited cleanly printing `e2e ok`.
pub fn run_client_script(script: &str, imports: &str, slots: usize) {
    let probe = Command::new("python3")
        .args(["-c", &format!("import {imports}")])
        .output()
        .expect("python3 runs");
    assert!(
        probe.status.success(),
        "the Python packages {imports} are not importable (scripts/test.sh installs them \
         with pip): {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let mut c = Config::new(super::real_model());
    c.port = 0;
    c.slots = slots;
    c.ctx = Some(2048);
    let server = start(c).expect("starting the server");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(script);
    let out = Command::new("python3")
        .arg(path)
        .args(["--base-url", &format!("http://{}/v1", server.addr())])
        .output()
        .expect("running the e2e script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script} failed\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("e2e ok"), "{stdout}");
}
