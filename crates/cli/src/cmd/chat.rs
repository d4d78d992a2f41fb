//! `minfer chat`: an interactive conversation in the terminal over the runtime's
//! conversation engine, with a line editor, slash commands and streamed answers. When
//! stdin is not a terminal it reads one user turn per line, so it can be scripted.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use minfer_runtime::{
    Conversation, ConversationError, ConversationOptions, FinishReason, GenerateOptions,
    OverflowPolicy,
};
use minfer_tokenizer::Tokenizer;
use rustyline::error::ReadlineError;

use super::common::ModelArgs;
use super::run::{flag_error, GenArgs};

/// Arguments of `minfer chat`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub gen: GenArgs,
    /// System message of the conversation.
    #[arg(long = "system")]
    pub system: Option<String>,
    /// When the conversation outgrows the context: `shift` drops the oldest half of what
    /// follows the kept tokens and continues; `refuse` stops with a message.
    #[arg(long = "ctx-overflow", default_value = "shift", value_parser = ["shift", "refuse"])]
    pub ctx_overflow: String,
    /// Leading tokens a context shift never drops (the system prompt is always kept).
    #[arg(long = "keep", default_value_t = 0)]
    pub keep: usize,
    /// Session file: the conversation saved in it is resumed when it exists, and the
    /// conversation is saved to it on exit.
    #[arg(long = "session")]
    pub session: Option<PathBuf>,
}

const HELP: &str = "\
commands:
  /help          this list
  /clear         forget the conversation (the system message stays)
  /system TEXT   set the system message (empty TEXT removes it)
  /save FILE     save the conversation and its KV cache to FILE
  /load FILE     restore a conversation saved with /save
  /stats         tokens in context and the speed of the last answer
  /bye           exit (also Ctrl-D, or Ctrl-C at the prompt)
Ctrl-C during an answer stops it; the partial answer stays in the conversation.
Ctrl-C while a long message is still being read drops that message (the up arrow
recalls it); the conversation stays as it was before it.
Start a line with \"\"\" to write several lines; end them with \"\"\".";

/// One line of user input, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Input {
    /// A message to the model.
    Turn(String),
    Help,
    Clear,
    /// `/system TEXT`; `None` removes the system message.
    System(Option<String>),
    Save(PathBuf),
    Load(PathBuf),
    Stats,
    Bye,
    /// A blank line: nothing to do.
    Empty,
    /// A slash command that is not one of the above, or one missing its argument.
    Bad(String),
}

/// Classifies one (possibly multi-line) input. Only a leading `/` word that names a
/// command is a command; any other text is a message.
fn parse_input(text: &str) -> Input {
    let t = text.trim();
    if t.is_empty() {
        return Input::Empty;
    }
    let Some(rest) = t.strip_prefix('/') else {
        return Input::Turn(text.trim_end_matches(['\r', '\n']).to_string());
    };
    let (cmd, arg) = match rest.split_once(char::is_whitespace) {
        Some((c, a)) => (c, a.trim()),
        None => (rest, ""),
    };
    let file = |arg: &str, what: Input| {
        if arg.is_empty() {
            Input::Bad(format!("/{cmd} needs a file name: /{cmd} FILE"))
        } else {
            what
        }
    };
    match cmd {
        "help" | "?" => Input::Help,
        "clear" => Input::Clear,
        "system" => Input::System((!arg.is_empty()).then(|| arg.to_string())),
        "save" => file(arg, Input::Save(PathBuf::from(arg))),
        "load" => file(arg, Input::Load(PathBuf::from(arg))),
        "stats" => Input::Stats,
        "bye" | "exit" | "quit" => Input::Bye,
        _ => Input::Bad(format!("unknown command /{cmd}: /help lists the commands")),
    }
}

/// What reading a line gave.
enum Read {
    Line(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D or the end of stdin.
    Eof,
}

/// Where user lines come from: the line editor on a terminal, plain stdin otherwise.
trait Lines {
    /// Reads one line, showing `prompt` where there is a terminal.
    fn read(&mut self, prompt: &str) -> anyhow::Result<Read>;
    /// Remembers a complete input for the history (no-op without an editor).
    fn remember(&mut self, _entry: &str) {}
}

struct Editor(rustyline::DefaultEditor);

impl Lines for Editor {
    fn read(&mut self, prompt: &str) -> anyhow::Result<Read> {
        match self.0.readline(prompt) {
            Ok(l) => Ok(Read::Line(l)),
            Err(ReadlineError::Interrupted) => Ok(Read::Interrupted),
            Err(ReadlineError::Eof) => Ok(Read::Eof),
            Err(e) => Err(e).context("reading the terminal"),
        }
    }

    fn remember(&mut self, entry: &str) {
        // A history that cannot take an entry only loses the recall of that entry.
        let _ = self.0.add_history_entry(entry);
    }
}

struct Piped<R>(R);

impl<R: BufRead> Lines for Piped<R> {
    fn read(&mut self, _prompt: &str) -> anyhow::Result<Read> {
        let mut line = String::new();
        match self.0.read_line(&mut line).context("reading stdin")? {
            0 => Ok(Read::Eof),
            _ => Ok(Read::Line(line.trim_end_matches(['\n', '\r']).to_string())),
        }
    }
}

/// Reads one input: a line, or with a leading `"""` every line up to a closing `"""`.
fn read_input(lines: &mut dyn Lines) -> anyhow::Result<Read> {
    let first = match lines.read(">>> ")? {
        Read::Line(l) => l,
        other => return Ok(other),
    };
    let Some(open) = first.trim_start().strip_prefix("\"\"\"") else {
        lines.remember(&first);
        return Ok(Read::Line(first));
    };
    let mut parts = Vec::new();
    let mut line = open.to_string();
    loop {
        if let Some(body) = line.trim_end().strip_suffix("\"\"\"") {
            parts.push(body.to_string());
            break;
        }
        parts.push(line);
        line = match lines.read("... ")? {
            Read::Line(l) => l,
            // An unfinished block is dropped, as the prompt's Ctrl-C drops a line.
            other => return Ok(other),
        };
    }
    let text = parts.join("\n").trim_matches('\n').to_string();
    lines.remember(&format!("\"\"\"{text}\"\"\""));
    Ok(Read::Line(text))
}

/// Saves the conversation and its KV rows to `path` (atomically).
fn save_session(conv: &mut Conversation, path: &Path) -> anyhow::Result<()> {
    conv.save(path)?;
    Ok(())
}

/// Restores a conversation saved with [`save_session`] into `conv`; a refusal leaves
/// `conv` unchanged.
fn load_session(conv: &mut Conversation, path: &Path) -> anyhow::Result<()> {
    conv.load(path)?;
    Ok(())
}

/// The terminal's own settings, taken before the line editor first switches it to raw
/// mode. They are put back before every answer: Ctrl-C must reach the process as SIGINT
/// while an answer streams, whatever mode the editor left behind.
struct TtyMode(Option<nix::sys::termios::Termios>);

impl TtyMode {
    fn capture() -> Self {
        TtyMode(nix::sys::termios::tcgetattr(std::io::stdin()).ok())
    }

    fn restore(&self) {
        use nix::sys::termios::{tcsetattr, LocalFlags, SetArg};
        if let Some(t) = &self.0 {
            let mut t = t.clone();
            t.local_flags |= LocalFlags::ISIG;
            // A terminal that refuses only loses Ctrl-C during answers.
            let _ = tcsetattr(std::io::stdin(), SetArg::TCSADRAIN, &t);
        }
    }
}

/// One line of `/stats`.
fn stats_line(conv: &Conversation) -> String {
    let n_ctx = conv.engine().n_ctx();
    let mut s = format!(
        "context: {} of {n_ctx} tokens",
        conv.history().len().min(n_ctx)
    );
    match conv.last_stats() {
        None => s.push_str(" | no answer yet"),
        Some(t) => {
            s.push_str(&format!(
                " | last turn: {} reused, {} prefilled at {:.1} t/s, {} generated at {:.1} t/s",
                t.reused,
                t.prefilled,
                t.prefill_tps(),
                t.gen_tokens,
                t.decode_tps()
            ));
            if t.rewound {
                s.push_str(" | the template rewrote earlier tokens: re-prefilled from the first that differs");
            }
            if t.shifted > 0 {
                s.push_str(&format!(" | context shift dropped {} tokens", t.shifted));
            }
        }
    }
    if let Some(sp) = conv.speculator() {
        let st = sp.stats();
        s.push_str(&format!(
            " | speculative ({}): {} of {} drafted tokens accepted",
            sp.source_name(),
            st.accepted,
            st.drafted
        ));
    }
    s
}

/// Runs `minfer chat`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let sampling = args.gen.sampling();
    sampling.validate().map_err(flag_error)?;
    let overflow: OverflowPolicy = args
        .ctx_overflow
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    let engine = args.model.load()?;
    let opts = ConversationOptions {
        overflow,
        n_keep: args.keep,
    };
    let tok = Tokenizer::from_gguf(engine.file())?;
    let spec = args.gen.spec.speculator(&args.model, &engine, &tok)?;
    let mut conv = Conversation::new(engine, opts)?;
    conv.set_speculator(spec);
    if conv.is_fallback_template() {
        eprintln!("note: the model has no chat template; using ChatML");
    }
    conv.set_system(args.system.clone().filter(|s| !s.is_empty()));
    if let Some(path) = args.session.as_deref().filter(|p| p.exists()) {
        // A refused file is an error, not a silent fresh start: it is left as it is.
        load_session(&mut conv, path)?;
        if args.system.is_some() && conv.system() != args.system.as_deref() {
            eprintln!(
                "note: the system message of {} replaces --system",
                path.display()
            );
        }
        eprintln!(
            "resumed {}: {} messages, {} tokens in context",
            path.display(),
            conv.messages().len(),
            conv.history().len()
        );
    }
    let gen = GenerateOptions {
        max_tokens: args.gen.n_predict,
        stop: args.gen.stop.clone(),
        sampling,
        constraint: None,
    };

    // Ctrl-C while an answer streams stops that answer; at the prompt of piped input it
    // exits as usual (a terminal's prompt gets Ctrl-C as a key from the line editor).
    let stop = Arc::new(AtomicBool::new(false));
    let at_prompt = Arc::new(AtomicBool::new(true));
    signal_hook::flag::register_conditional_shutdown(
        signal_hook::consts::SIGINT,
        130,
        Arc::clone(&at_prompt),
    )
    .context("installing the Ctrl-C handler")?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&stop))
        .context("installing the Ctrl-C handler")?;

    let interactive = std::io::stdin().is_terminal();
    let tty = TtyMode::capture();
    let mut lines: Box<dyn Lines> = if interactive {
        eprintln!("minfer chat: /help for commands, /bye or Ctrl-D to exit");
        Box::new(Editor(
            rustyline::DefaultEditor::new().context("starting the line editor")?,
        ))
    } else {
        Box::new(Piped(std::io::stdin().lock()))
    };

    loop {
        at_prompt.store(true, Ordering::SeqCst);
        let text = match read_input(lines.as_mut())? {
            Read::Line(l) => l,
            Read::Interrupted | Read::Eof => break,
        };
        match parse_input(&text) {
            Input::Empty => {}
            Input::Help => println!("{HELP}"),
            Input::Bye => break,
            Input::Clear => {
                conv.clear();
                eprintln!("cleared the conversation");
            }
            Input::System(s) => {
                let set = s.is_some();
                conv.set_system(s);
                eprintln!(
                    "{}",
                    if set {
                        "set the system message"
                    } else {
                        "removed the system message"
                    }
                );
            }
            Input::Stats => println!("{}", stats_line(&conv)),
            Input::Save(p) => match save_session(&mut conv, &p) {
                Ok(()) => eprintln!("saved {}", p.display()),
                Err(e) => eprintln!("error: {e:#}"),
            },
            Input::Load(p) => match load_session(&mut conv, &p) {
                Ok(()) => eprintln!("loaded {}", p.display()),
                Err(e) => eprintln!("error: {e:#}"),
            },
            Input::Bad(msg) => eprintln!("error: {msg}"),
            Input::Turn(msg) => {
                tty.restore();
                if !answer(&mut conv, &msg, &gen, &stop, &at_prompt)? {
                    break;
                }
            }
        }
    }
    if let Some(path) = &args.session {
        save_session(&mut conv, path)?;
        eprintln!("saved {}", path.display());
    }
    Ok(())
}

/// Streams the answer to `msg`; a refused turn is reported and the chat goes on. Returns
/// `false` when nobody reads the answers any more (stdout closed).
fn answer(
    conv: &mut Conversation,
    msg: &str,
    gen: &GenerateOptions,
    stop: &AtomicBool,
    at_prompt: &AtomicBool,
) -> anyhow::Result<bool> {
    stop.store(false, Ordering::SeqCst);
    at_prompt.store(false, Ordering::SeqCst);
    let mut out = std::io::stdout().lock();
    let mut write_err = None;
    let interrupted = || stop.load(Ordering::SeqCst);
    let r = conv.turn_interruptible(msg, gen, interrupted, |piece| {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        if let Err(e) = out.write_all(piece.as_bytes()).and_then(|()| out.flush()) {
            write_err = Some(e);
            return false;
        }
        true
    });
    at_prompt.store(true, Ordering::SeqCst);
    if let Some(e) = write_err {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            // End quietly, as `minfer run` does.
            return Ok(false);
        }
        return Err(e).context("writing to stdout");
    }
    let stats = match r {
        Ok(s) => s,
        Err(ConversationError::Interrupted { .. }) => {
            eprintln!("[interrupted: the message was dropped; the up arrow recalls it]");
            return Ok(true);
        }
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(true);
        }
    };
    let _ = writeln!(out);
    let _ = out.flush();
    if stats.finish == FinishReason::Cancelled {
        eprintln!("[stopped]");
    }
    if stats.shifted > 0 {
        eprintln!(
            "note: the context was full: dropped the {} oldest tokens after the kept ones (--ctx-overflow shift)",
            stats.shifted
        );
    }
    if stats.context_full {
        eprintln!(
            "note: the answer stopped at the end of the context of {} tokens (--ctx-overflow refuse): /clear or raise -c",
            conv.engine().n_ctx()
        );
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slash_commands_parse_and_other_text_is_a_message() {
        assert_eq!(parse_input("/help"), Input::Help);
        assert_eq!(parse_input("  /clear "), Input::Clear);
        assert_eq!(parse_input("/bye"), Input::Bye);
        assert_eq!(parse_input("/stats"), Input::Stats);
        assert_eq!(
            parse_input("/system be brief"),
            Input::System(Some("be brief".into()))
        );
        assert_eq!(parse_input("/system"), Input::System(None));
        assert_eq!(
            parse_input("/save a b.bin"),
            Input::Save(PathBuf::from("a b.bin"))
        );
        assert_eq!(parse_input("/load x"), Input::Load(PathBuf::from("x")));
        assert!(matches!(parse_input("/save"), Input::Bad(m) if m.contains("FILE")));
        assert!(matches!(parse_input("/frob"), Input::Bad(m) if m.contains("/frob")));
        assert_eq!(parse_input("   "), Input::Empty);
        assert_eq!(parse_input("hi there"), Input::Turn("hi there".into()));
    }

    #[test]
    fn triple_quotes_join_lines_into_one_input() {
        let text = "\"\"\"first\nsecond\n  third\"\"\"\nafter\n\"\"\"one line\"\"\"\n";
        let mut lines = Piped(text.as_bytes());
        let mut next = || match read_input(&mut lines).unwrap() {
            Read::Line(l) => Some(l),
            _ => None,
        };
        assert_eq!(next().as_deref(), Some("first\nsecond\n  third"));
        assert_eq!(next().as_deref(), Some("after"));
        assert_eq!(next().as_deref(), Some("one line"));
        assert_eq!(next(), None);
    }
}
