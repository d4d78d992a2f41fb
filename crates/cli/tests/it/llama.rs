//! Every user-facing subcommand on a `llama`-architecture file: a tiny random-weight Llama 3
//! model (normal rope with `rope_freqs.weight`, Q8_0, `llama-bpe` vocabulary) written by
//! the project's writer, driven through the real binary — `info`, `run`, `chat`, `bench`,
//! and `serve` answered over real HTTP.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{http, minfer_command, run_piped, start_server, test_home};
use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model, TinySpec};

fn home() -> PathBuf {
    test_home("llama")
}

fn tiny_llama(dir: &Path) -> PathBuf {
    let p = dir.join("tiny-llama3.gguf");
    let spec = TinySpec {
        rope_freqs: true,
        ..TinySpec::llama(GgmlType::Q8_0, 75)
    };
    write_tiny_model(&p, &spec).expect("write tiny model");
    p
}

fn minfer(args: &[&str], stdin: &str) -> Output {
    run_piped(minfer_command(&home()).args(args), stdin)
}

fn ok(out: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn info_run_chat_bench_and_serve_work_on_a_llama_file() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_llama(dir.path());
    let m = m.to_str().unwrap();

    let info: serde_json::Value =
        serde_json::from_str(&ok(&minfer(&["info", "-m", m, "--json"], ""), "info"))
            .expect("info --json prints JSON");
    assert_eq!(info["architecture"], "llama");
    assert_eq!(info["hparams"]["attention.head_count_kv"], 2);
    assert_eq!(info["tokenizer"]["pre"], "llama-bpe");

    let run = ok(
        &minfer(
            &["run", "-m", m, "--temp", "0", "-n", "8", "-t", "2", "Hello"],
            "",
        ),
        "run",
    );
    assert!(!run.is_empty());

    let chat = ok(
        &minfer(
            &["chat", "-m", m, "--temp", "0", "-n", "6", "-t", "2"],
            "Hello\nAgain\n",
        ),
        "chat",
    );
    assert!(chat.lines().count() >= 2, "{chat}");

    let bench = ok(
        &minfer(
            &[
                "bench", "-m", m, "-p", "16", "-n", "8", "-r", "1", "-t", "2", "-o", "json",
            ],
            "",
        ),
        "bench",
    );
    let rows: serde_json::Value = serde_json::from_str(&bench).expect("bench -o json");
    let rows = rows.as_array().expect("one row per test");
    assert_eq!(rows.len(), 2, "{bench}");
    assert!(
        rows.iter().all(|r| r["avg_ts"].as_f64() > Some(0.0)),
        "{bench}"
    );

    let (server, addr) = start_server(minfer_command(&home()).args([
        "serve",
        "-m",
        m,
        "-t",
        "2",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]));
    let body = r#"{"model":"tiny","prompt":"Hello","max_tokens":6,"temperature":0}"#;
    let resp = http(&addr, "POST /v1/completions", body);
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let json = resp.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(json).expect("JSON body");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    drop(server);

    // A llama-server command line starts it as it is: single-dash long options, the
    // switches of what minfer always does, and a chat template from a file.
    let tpl = dir.path().join("t.jinja");
    std::fs::write(
        &tpl,
        "{% for m in messages %}<<{{ m.role }}:{{ m.content }}>>{% endfor %}\
         {% if add_generation_prompt %}<<assistant:{% endif %}",
    )
    .unwrap();
    let (server, addr) = start_server(minfer_command(&home()).args([
        "serve",
        "-m",
        m,
        "-a",
        "tiny-alias",
        "-np",
        "2",
        "-c",
        "512",
        "-ctk",
        "f16",
        "-ctv=f16",
        "-fa",
        "on",
        "-ngl",
        "0",
        "-b",
        "512",
        "-ub",
        "512",
        "-cb",
        "--jinja",
        "--embeddings",
        "--metrics",
        "--chat-template-file",
        tpl.to_str().unwrap(),
        "-t",
        "2",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]));
    let body = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let resp = http(&addr, "POST /apply-template", body);
    assert!(
        resp.contains(r#""prompt":"<<user:hi>><<assistant:""#),
        "{resp}"
    );
    let props = http(&addr, "GET /props", "");
    assert!(props.contains(r#""total_slots":2"#), "{props}");
    assert!(props.contains(r#""model_alias":"tiny-alias""#), "{props}");
    assert!(
        props.contains("<<assistant:"),
        "the template in use: {props}"
    );
    drop(server);
    // A name that is no template minfer knows is refused at start-up.
    let out = minfer(&["serve", "-m", m, "--chat-template", "vicuna"], "");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("vicuna"));
}
