//! The official `openai` Python client against the server with the real default model.

mod common;

use std::process::Command;

use minfer_server::{start, Config};

fn script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/e2e_openai.py")
}

#[test]
fn openai_python_client_chats_and_completes() {
    let probe = Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .expect("python3 runs");
    assert!(
        probe.status.success(),
        "the openai Python package is not importable (.ci/run installs it with \
         `python3 -m pip install openai`): {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let mut c = Config::new(common::real_model());
    c.port = 0;
    c.slots = 2;
    c.ctx = Some(2048);
    let server = start(c).expect("starting the server");
    let out = Command::new("python3")
        .arg(script())
        .args(["--base-url", &format!("http://{}/v1", server.addr())])
        .output()
        .expect("running the e2e script");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "e2e script failed\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("e2e ok"), "{stdout}");
}
