//! `minfer chat` as a user runs it: scripted through a pipe on a tiny model (one turn per
//! line), with both context overflow policies under a small `-c`, and interactively in a
//! real terminal (tmux) on the default model, with Ctrl-C in the middle of an answer.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model, TinySpec};

fn home() -> PathBuf {
    std::env::temp_dir().join("minfer-chat-test-home")
}

fn tiny(dir: &Path) -> PathBuf {
    let p = dir.join("tiny-qwen2.gguf");
    write_tiny_model(&p, &TinySpec::qwen2(GgmlType::Q8_0, 7)).expect("write tiny model");
    p
}

/// Runs `minfer ARGS` with `input` on a pipe as stdin.
fn chat_piped(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(args)
        .env("MINFER_HOME", home())
        .env_remove("MINFER_BACKENDS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run minfer");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("wait")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn piped_chat_answers_each_line_as_run_answers_the_same_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    let base = ["chat", "-m", m, "--temp", "0", "-n", "8", "-t", "1"];
    let out = chat_piped(&base, "Hello\n/stats\nHow are you\n/help\n/frob\n");
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{se}");
    assert!(!se.contains("panicked"), "{se}");
    assert!(se.contains("unknown command /frob"), "{se}");
    let lines: Vec<&str> = so.lines().collect();
    assert!(
        lines[1].starts_with("context: ") && lines[1].contains("prefilled"),
        "{so}"
    );
    assert!(
        so.contains("/save FILE"),
        "the help lists the commands: {so}"
    );
    // The first answer is what `minfer run --chat` gives for the same message.
    let run = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args([
            "run", "--chat", "-m", m, "--temp", "0", "-n", "8", "-t", "1",
        ])
        .arg("Hello")
        .env("MINFER_HOME", home())
        .output()
        .expect("run");
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(lines[0], text(&run.stdout).trim_end_matches('\n'));
    // The second turn reuses the first one's KV.
    let again = chat_piped(&base, "Hello\nHow are you\n/stats\n");
    let stats = text(&again.stdout);
    let line = stats.lines().last().unwrap_or_default().to_string();
    let reused: usize = line
        .split(" reused")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no reused count in {line}"));
    assert!(reused > 10, "{line}");
}

#[test]
fn a_small_context_shifts_or_refuses_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny(dir.path());
    let m = m.to_str().unwrap();
    let turns = "one two three four\nfive six seven eight\nnine ten eleven\ntwelve\nthirteen\n";
    let args = |policy: &'static str| {
        [
            "chat",
            "-m",
            m,
            "--temp",
            "0",
            "-n",
            "12",
            "-t",
            "1",
            "-c",
            "48",
            "--ctx-overflow",
            policy,
        ]
    };
    let shift = chat_piped(&args("shift"), turns);
    let se = text(&shift.stderr);
    assert!(shift.status.success(), "{se}");
    assert!(se.contains("dropped") && !se.contains("error"), "{se}");
    assert_eq!(text(&shift.stdout).lines().count(), 5, "one answer a turn");

    let refuse = chat_piped(&args("refuse"), turns);
    let se = text(&refuse.stderr);
    assert!(refuse.status.success(), "a refusal is not a crash: {se}");
    assert!(!se.contains("panicked"), "{se}");
    assert!(
        se.contains("error: the conversation needs") && se.contains("context holds 48"),
        "{se}"
    );

    let bad = chat_piped(&args("drop"), "");
    assert!(!bad.status.success());
    assert!(text(&bad.stderr).contains("--ctx-overflow"));
}

/// A tmux server of its own, killed when the test ends.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("run tmux (scripts/test.sh installs it)")
    }

    fn keys(&self, keys: &[&str]) {
        let mut a = vec!["send-keys", "-t", "chat"];
        a.extend_from_slice(keys);
        assert!(self.cmd(&a).status.success());
    }

    fn pane(&self) -> String {
        text(
            &self
                .cmd(&["capture-pane", "-p", "-J", "-S", "-", "-t", "chat"])
                .stdout,
        )
    }

    /// Waits until `ok` holds for the pane's text.
    fn wait(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            let p = self.pane();
            if ok(&p) {
                return p;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "timed out waiting for {what}; the terminal shows:\n{p}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

/// Prompts shown so far (capture-pane trims the empty prompt's trailing space).
fn prompts(p: &str) -> usize {
    p.lines()
        .filter(|l| l.starts_with(">>> ") || l.trim_end() == ">>>")
        .count()
}

#[test]
fn chat_in_a_terminal_streams_stops_on_ctrl_c_and_keeps_the_conversation() {
    let model = minfer_hub::default_model_path();
    assert!(
        model.exists(),
        "the default model is missing: run `minfer pull`"
    );
    let tmux = Tmux {
        socket: format!("minfer-chat-{}", std::process::id()),
    };
    let home_env = format!("MINFER_HOME={}", home().display());
    let model = model.to_string_lossy().into_owned();
    // bash stays alive through the Ctrl-C its child handles (it waits for the child and
    // goes on when the child did not die of the signal), then reports the exit status.
    let script = r#""$0" "$@"; echo "chat exited with status $?"; sleep 600"#;
    let started = tmux.cmd(&[
        "new-session",
        "-d",
        "-s",
        "chat",
        "-x",
        "160",
        "-y",
        "50",
        "-e",
        &home_env,
        "bash",
        "-c",
        script,
        env!("CARGO_BIN_EXE_minfer"),
        "chat",
        "-m",
        &model,
        "--temp",
        "0",
        "-n",
        "400",
        "-t",
        "2",
        "-c",
        "2048",
    ]);
    assert!(started.status.success(), "{}", text(&started.stderr));
    tmux.wait("the prompt", |p| prompts(p) == 1);

    // Turn one: a short answer that ends by itself.
    tmux.keys(&["Say only the word hello.", "Enter"]);
    let p = tmux.wait("the first answer", |p| prompts(p) == 2);
    assert!(p.to_lowercase().contains("hello"), "{p}");

    // Turn two: a long answer, stopped with Ctrl-C once it streams.
    tmux.keys(&["Write a long story about a dragon and a knight.", "Enter"]);
    tmux.wait("the long answer to stream", |p| {
        // Only once the whole message is shown can what follows it be the answer.
        p.split_once("knight.")
            .is_some_and(|(_, answer)| answer.trim().len() > 40)
    });
    tmux.keys(&["C-c"]);
    tmux.wait("the stopped answer", |p| {
        p.contains("[stopped]") && prompts(p) == 3
    });
    tmux.keys(&["/stats", "Enter"]);
    let p = tmux.wait("the stats", |p| {
        p.matches("context: ").count() == 1 && prompts(p) == 4
    });
    let held = number_before(&p, " of 2048 tokens");

    // Turn three goes on from the conversation, the partial answer included.
    tmux.keys(&["Give the story a title.", "Enter"]);
    tmux.wait("the third answer", |p| prompts(p) == 5);
    tmux.keys(&["/stats", "Enter"]);
    let p = tmux.wait("the stats", |p| {
        p.matches("context: ").count() == 2 && prompts(p) == 6
    });
    let reused = number_before(p.rsplit("context: ").next().unwrap_or(""), " reused");
    assert!(
        reused + 4 >= held,
        "turn three reused {reused} of the {held} tokens held after the stopped answer"
    );

    tmux.keys(&["/clear", "Enter"]);
    tmux.wait("the clear", |p| p.contains("cleared the conversation"));
    // Sessions answer with what they did or why not; either way the chat goes on.
    tmux.keys(&["/save s.bin", "Enter"]);
    tmux.wait("the save", |p| {
        p.contains("saved s.bin") || p.contains("/save s.bin:")
    });
    tmux.keys(&["/load s.bin", "Enter"]);
    tmux.wait("the load", |p| {
        (p.contains("loaded s.bin") || p.contains("/load s.bin:")) && at_prompt(p)
    });
    // Ctrl-C at the prompt exits, with success.
    tmux.keys(&["C-c"]);
    let p = tmux.wait("chat to exit on Ctrl-C at the prompt", |p| {
        p.contains("chat exited with status")
    });
    assert!(p.contains("chat exited with status 0"), "{p}");
    assert!(!p.contains("panicked"), "{p}");
}

/// Whether the editor waits at an empty prompt (the last line shown).
fn at_prompt(p: &str) -> bool {
    p.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(str::trim_end)
        == Some(">>>")
}

/// The number that ends right before `marker` in `text`.
fn number_before(text: &str, marker: &str) -> usize {
    text.split(marker)
        .next()
        .and_then(|s| s.rsplit(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number before `{marker}` in:\n{text}"))
}
