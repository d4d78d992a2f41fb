//! Structured output and tool calls through the official `openai` Python client against
//! the server with the real default model (scripts/e2e_structured.py): JSON schemas of
//! increasing difficulty validated with `jsonschema`, streaming and not, greedy
//! determinism, llama-server's `grammar` and `json_schema` fields, a schema that does not
//! compile, and tool calls (required, named, streamed, and a round trip with a `tool`
//! message).

mod common;

use std::process::Command;

use minfer_server::{start, Config};

fn script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/e2e_structured.py")
}

#[test]
fn openai_python_client_gets_valid_structured_output_and_tool_calls() {
    let probe = Command::new("python3")
        .args(["-c", "import openai, jsonschema"])
        .output()
        .expect("python3 runs");
    assert!(
        probe.status.success(),
        "the openai and jsonschema Python packages are not importable (scripts/test.sh \
         installs them with pip): {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let mut c = Config::new(common::real_model());
    c.port = 0;
    c.slots = 1;
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
