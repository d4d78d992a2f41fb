//! `minfer`: run GGUF language models locally.

mod cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Command-line interface of minfer.
#[derive(Parser)]
#[command(
    name = "minfer",
    version,
    about = "Fast local inference for GGUF models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a model's architecture, hyperparameters, tokenizer and tensor table.
    Info(cmd::info::Args),
    /// Download a catalog model or a GGUF URL into the model store, verified.
    Pull(cmd::pull::Args),
    /// Print the token ids of a text.
    Tokenize(cmd::tokenize::Args),
    /// Print the embedding of each text as JSON (pooled hidden states).
    Embed(cmd::embed::Args),
    /// Generate text from a prompt, streaming it to stdout.
    Run(cmd::run::Args),
    /// Talk with the model in the terminal (one turn per line when stdin is not a terminal).
    Chat(cmd::chat::Args),
    /// Measure perplexity over a text file, as llama-perplexity does.
    Perplexity(cmd::perplexity::Args),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(cmd::serve::Args),
    /// Write a GGUF with its weight matrices in another type, as llama-quantize does.
    Quantize(cmd::quantize::Args),
    /// Measure prompt and generation throughput, as llama-bench does.
    Bench(cmd::bench::Args),
    /// Draw the compute graph in the browser and watch every node's values, live or
    /// from a recorded trace.
    Viz(cmd::viz::Args),
}

fn main() -> ExitCode {
    quiet_headless_vulkan();
    let cli = Cli::parse_from(cmd::llama_flags::rewrite(std::env::args_os()));
    // A mistyped `MINFER_*` value is refused before any command runs, never ignored; the
    // backend fence's names are checked by the registry that owns them, probing only the
    // backends it names (a command that runs no model loads no GPU driver otherwise).
    // The settings the libraries take as options are resolved here, once.
    let env_ok = minfer_env::check_all()
        .map_err(anyhow::Error::from)
        .and_then(|()| cmd::common::EnvOptions::init())
        .and_then(|env| match &env.backends {
            Some(spec) => {
                Ok(minfer_runtime::backends::check_fence(spec, &env.backend_options).map(drop)?)
            }
            None => Ok(()),
        });
    if let Err(e) = env_ok {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Info(a) => cmd::info::run(a),
        Command::Pull(a) => cmd::pull::run(a),
        Command::Tokenize(a) => cmd::tokenize::run(a),
        Command::Embed(a) => cmd::embed::run(a),
        Command::Run(a) => cmd::run::run(a),
        Command::Chat(a) => cmd::chat::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Quantize(a) => cmd::quantize::run(a),
        Command::Viz(a) => cmd::viz::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, with the cause chain, so scripts can grep it.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Keeps Mesa's Vulkan device-selection layer from printing an error on every run of a
/// headless machine: with no `XDG_RUNTIME_DIR` it fails to reach a Wayland display while
/// the GPU backend is probed, and says so on stderr, although nothing is wrong. The layer
/// only reorders adapters, and the backend enumerates them all itself, so it is switched
/// off for this process when there is no session directory and the user has not chosen.
fn quiet_headless_vulkan() {
    let headless = std::env::var_os("XDG_RUNTIME_DIR").is_none_or(|d| d.is_empty());
    if headless && std::env::var_os("NODEVICE_SELECT").is_none() {
        // Called first thing in `main`, before any thread exists, so no other thread
        // can read the environment while it changes.
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}
