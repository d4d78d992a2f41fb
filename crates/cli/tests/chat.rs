//! `minfer chat` as a user runs it: scripted through a pipe on a tiny model (one turn per
//! line), with both context overflow policies under a small `-c`; sessions saved and
//! resumed on the default model (`/save` + `/load`, `--session`), continuing exactly as
//! a chat that never stopped; and interactively in a real terminal (tmux) on the default
//! model, with Ctrl-C in the middle of an answer and in the middle of a long prompt.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{minfer_command, number_before, run_piped, test_home, tiny_qwen2};

fn home() -> PathBuf {
    test_home("chat")
}

/// Runs `minfer ARGS` with `input` on a pipe as stdin.
fn chat_piped(args: &[&str], input: &str) -> Output {
    run_piped(minfer_command(&home()).args(args), input)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn piped_chat_answers_each_line_as_run_answers_the_same_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_qwen2(dir.path());
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
    let m = tiny_qwen2(dir.path());
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

fn default_model() -> String {
    minfer_hub::testing::default_model()
        .to_string_lossy()
        .into_owned()
}

/// The number before ` reused` on the last `/stats` line of `stdout`.
fn last_reused(stdout: &str) -> usize {
    let line = stdout
        .lines()
        .rfind(|l| l.starts_with("context: "))
        .unwrap_or_else(|| panic!("no /stats line in {stdout}"));
    number_before(line, " reused")
}

#[test]
fn a_saved_chat_resumes_exactly_as_one_that_never_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let model = default_model();
    let base = [
        "chat",
        "-m",
        &model,
        "--temp",
        "0",
        "-n",
        "8",
        "-t",
        "2",
        "-c",
        "512",
        "--system",
        "Be terse.",
    ];
    let turns = ["Name a colour.", "Name a fruit.", "Name a planet."];
    // Never stopping: three turns, one answer a line.
    let straight = chat_piped(&base, &format!("{}\n", turns.join("\n")));
    assert!(straight.status.success(), "{}", text(&straight.stderr));
    let straight = text(&straight.stdout);
    let answers: Vec<&str> = straight.lines().collect();
    assert_eq!(answers.len(), 3, "{straight}");

    // `/save` after two turns, then `/load` in a new process and the third turn.
    let saved = dir.path().join("two.kv");
    let saved = saved.to_str().unwrap();
    let first = chat_piped(
        &base,
        &format!("{}\n{}\n/stats\n/save {saved}\n", turns[0], turns[1]),
    );
    let (so, se) = (text(&first.stdout), text(&first.stderr));
    assert!(first.status.success() && se.contains("saved"), "{se}");
    let held = number_before(&so, " of 512 tokens");
    // A different system message first: /load replaces it with the saved one.
    let mut other = base.to_vec();
    *other.last_mut().unwrap() = "Talk a lot.";
    let second = chat_piped(&other, &format!("/load {saved}\n{}\n/stats\n", turns[2]));
    let (so, se) = (text(&second.stdout), text(&second.stderr));
    assert!(second.status.success() && se.contains("loaded"), "{se}");
    assert_eq!(so.lines().next(), Some(answers[2]), "/load: {so}");
    assert_eq!(
        last_reused(&so),
        held,
        "all {held} held tokens were reused: {so}"
    );

    // `--session`: saved on exit, resumed at start.
    let session = dir.path().join("chat.kv");
    let session = session.to_str().unwrap();
    let mut with = base.to_vec();
    with.extend(["--session", session]);
    let one = chat_piped(&with, &format!("{}\n{}\n", turns[0], turns[1]));
    assert!(one.status.success(), "{}", text(&one.stderr));
    assert_eq!(text(&one.stdout).lines().collect::<Vec<_>>(), answers[..2]);
    let two = chat_piped(&with, &format!("{}\n/stats\n", turns[2]));
    let (so, se) = (text(&two.stdout), text(&two.stderr));
    assert!(two.status.success() && se.contains("resumed"), "{se}");
    assert_eq!(so.lines().next(), Some(answers[2]), "--session: {so}");
    assert_eq!(last_reused(&so), held, "{so}");

    // A damaged session is refused at start, and left as it was.
    let mut bytes = std::fs::read(session).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    std::fs::write(session, &bytes).unwrap();
    let bad = chat_piped(&with, "Hello\n");
    let se = text(&bad.stderr);
    assert!(!bad.status.success() && se.contains("damaged"), "{se}");
    assert!(!se.contains("panicked"), "{se}");
    assert_eq!(
        std::fs::read(session).unwrap(),
        bytes,
        "the file was modified"
    );
    // A `run --session` file holds no conversation: /load says so and the chat goes on.
    let plain = dir.path().join("plain.kv");
    let plain = plain.to_str().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["run", "-m", &model, "-n", "2", "-t", "2", "-c", "512"])
        .args(["--session", plain, "Hello"])
        .env("MINFER_HOME", home())
        .output()
        .expect("run");
    assert!(run.status.success(), "{}", text(&run.stderr));
    let out = chat_piped(&base, &format!("/load {plain}\nHi\n"));
    let se = text(&out.stderr);
    assert!(
        out.status.success() && se.contains("no conversation"),
        "{se}"
    );
    assert_eq!(text(&out.stdout).lines().count(), 1, "the chat went on");
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
    let model = default_model();
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("one.kv");
    let saved = saved.to_str().unwrap();
    let tmux = Tmux {
        socket: format!("minfer-chat-{}", std::process::id()),
    };
    let home_env = format!("MINFER_HOME={}", home().display());
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
        "-c",
        dir.path().to_str().unwrap(),
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
        "8192",
    ]);
    assert!(started.status.success(), "{}", text(&started.stderr));
    tmux.wait("the prompt", |p| prompts(p) == 1);

    // Turn one: a short answer that ends by itself; saved as it stands.
    tmux.keys(&["Say only the word hello.", "Enter"]);
    let p = tmux.wait("the first answer", |p| prompts(p) == 2);
    assert!(p.to_lowercase().contains("hello"), "{p}");
    tmux.keys(&["/stats", "Enter"]);
    let p = tmux.wait("the stats", |p| stats_shown(p) == 1 && prompts(p) == 3);
    let after_one = number_before(&p, " of 8192 tokens");
    tmux.keys(&[&format!("/save {saved}"), "Enter"]);
    tmux.wait("the save", |p| p.contains("saved ") && prompts(p) == 4);

    // Turn two: a long answer, stopped with Ctrl-C once it streams.
    tmux.keys(&["Write a long story about a dragon and a knight.", "Enter"]);
    tmux.wait("the long answer to stream", |p| {
        // Only once the whole message is shown can what follows it be the answer.
        p.split_once("knight.")
            .is_some_and(|(_, answer)| answer.trim().len() > 40)
    });
    tmux.keys(&["C-c"]);
    tmux.wait("the stopped answer", |p| {
        p.contains("[stopped]") && prompts(p) == 5
    });
    tmux.keys(&["/stats", "Enter"]);
    let p = tmux.wait("the stats", |p| stats_shown(p) == 2 && prompts(p) == 6);
    let held = number_before(
        p.rsplit("context: ").next().unwrap_or(""),
        " of 8192 tokens",
    );

    // Turn three goes on from the conversation, the partial answer included.
    tmux.keys(&["Give the story a title.", "Enter"]);
    tmux.wait("the third answer", |p| prompts(p) == 7);
    tmux.keys(&["/stats", "Enter"]);
    let p = tmux.wait("the stats", |p| stats_shown(p) == 3 && prompts(p) == 8);
    let third = p.rsplit("context: ").next().unwrap_or("");
    let (reused, after_three) = (
        number_before(third, " reused"),
        number_before(third, " of 8192 tokens"),
    );
    assert!(
        reused + 4 >= held,
        "turn three reused {reused} of the {held} tokens held after the stopped answer"
    );

    // A long pasted document: Ctrl-C while it is read stops the prefill between chunks
    // and drops the message; the next turn answers.
    let document = format!(
        "Summarise this document: {}",
        "The quick brown fox jumps over the lazy dog near the river bank. ".repeat(300)
    );
    let doc = dir.path().join("document.txt");
    std::fs::write(&doc, &document).unwrap();
    // tmux takes a buffer this long from a file, not as an argument.
    assert!(tmux
        .cmd(&["load-buffer", doc.to_str().unwrap()])
        .status
        .success());
    assert!(tmux
        .cmd(&["paste-buffer", "-p", "-t", "chat"])
        .status
        .success());
    tmux.wait("the pasted document", |p| {
        p.contains("river bank. The quick")
    });
    tmux.keys(&["Enter"]);
    std::thread::sleep(Duration::from_millis(1500));
    let t0 = Instant::now();
    tmux.keys(&["C-c"]);
    let p = tmux.wait("the interrupted prefill", |p| {
        p.contains("[interrupted") && at_prompt(p)
    });
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "the prefill stopped only after {:?}",
        t0.elapsed()
    );
    let before = prompts(&p);
    tmux.keys(&["Say only the word yes.", "Enter"]);
    let p = tmux.wait("the answer after the interruption", |p| {
        prompts(p) == before + 1
    });
    let answer = p.rsplit("Say only the word yes.").next().unwrap_or("");
    assert!(answer.to_lowercase().contains("yes"), "{p}");
    tmux.keys(&["/stats", "Enter"]);
    let p = tmux.wait("the stats", |p| stats_shown(p) == 4 && at_prompt(p));
    let last = p.rsplit("context: ").next().unwrap_or("");
    let in_context = number_before(last, " of 8192 tokens");
    // The turn and its answer, not the document of some 4000 tokens.
    assert!(
        in_context < after_three + 100,
        "the dropped document is still in the context: {in_context} tokens"
    );

    tmux.keys(&["/clear", "Enter"]);
    tmux.wait("the clear", |p| p.contains("cleared the conversation"));
    // /load brings back the conversation saved after turn one, whose next turn prefills
    // only its own tokens.
    tmux.keys(&[&format!("/load {saved}"), "Enter"]);
    tmux.wait("the load", |p| p.contains("loaded ") && at_prompt(p));
    tmux.keys(&["/stats", "Enter"]);
    let p = tmux.wait("the stats", |p| stats_shown(p) == 5 && at_prompt(p));
    let loaded = number_before(
        p.rsplit("context: ").next().unwrap_or(""),
        " of 8192 tokens",
    );
    assert_eq!(loaded, after_one, "{p}");
    tmux.keys(&["Say only the word goodbye.", "Enter"]);
    let p = tmux.wait("the answer after the load", |p| {
        p.rsplit("goodbye.")
            .next()
            .is_some_and(|a| !a.trim().is_empty())
            && at_prompt(p)
    });
    assert!(!p.contains("error:"), "{p}");
    tmux.keys(&["/stats", "Enter"]);
    let p = tmux.wait("the stats", |p| stats_shown(p) == 6 && at_prompt(p));
    let reused = number_before(p.rsplit("context: ").next().unwrap_or(""), " reused");
    assert_eq!(reused, after_one, "the loaded tokens were reused: {p}");
    // Ctrl-C at the prompt exits, with success.
    tmux.keys(&["C-c"]);
    let p = tmux.wait("chat to exit on Ctrl-C at the prompt", |p| {
        p.contains("chat exited with status")
    });
    assert!(p.contains("chat exited with status 0"), "{p}");
    assert!(!p.contains("panicked"), "{p}");
}

/// `/stats` lines shown so far.
fn stats_shown(p: &str) -> usize {
    p.lines().filter(|l| l.starts_with("context: ")).count()
}

/// Whether the editor waits at an empty prompt (the last line shown).
fn at_prompt(p: &str) -> bool {
    p.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(str::trim_end)
        == Some(">>>")
}
