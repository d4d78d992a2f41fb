//! `minfer run`: generate text from a prompt, streaming only the generated text to stdout.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use minfer_runtime::sampling::MAX_PENALTY_WINDOW;
use minfer_runtime::session;
use minfer_runtime::shift::generate_shifting_with;
use minfer_runtime::speculative::{DEFAULT_DRAFT_MAX, DRAFT_MAX_LIMIT};
use minfer_runtime::{
    CompiledGrammar, DraftModel, DraftSource, Engine, FinishReason, GenerateOptions, Grammar,
    GrammarVocab, KvHistory, NgramLookup, OverflowPolicy, SamplerError, SamplingParams, Speculator,
};
use minfer_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

use super::common::{usize_in, ModelArgs};

/// Arguments of `minfer run`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt (or use -p / -f).
    pub prompt_arg: Option<String>,
    /// The prompt.
    #[arg(short = 'p', long = "prompt", conflicts_with = "prompt_arg")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file", conflicts_with_all = ["prompt_arg", "prompt"])]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub gen: GenArgs,
    /// Render the prompt through the model's chat template as a user message.
    #[arg(long = "chat")]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long = "system", requires = "chat")]
    pub system: Option<String>,
    /// Write the graph of this run as DOT to FILE and exit.
    #[arg(long = "dump-graph")]
    pub dump_graph: Option<PathBuf>,
    /// Write the graph of this run as JSON to FILE and exit.
    #[arg(long = "dump-graph-json")]
    pub dump_graph_json: Option<PathBuf>,
    /// Which graph to dump: prefill or decode.
    #[arg(long = "dump-kind", default_value = "prefill", value_parser = ["prefill", "decode"])]
    pub dump_kind: String,
    /// KV session file: restored when it exists (its longest common prefix with the
    /// prompt is not prefilled again) and saved after the run.
    #[arg(long = "session")]
    pub session: Option<PathBuf>,
    /// When the prompt plus -n outgrows the context: `shift` keeps the first --keep
    /// tokens, drops the oldest half of the rest and goes on generating; `refuse` exits
    /// with an error before generating. Without it generation stops at the context's end.
    #[arg(long = "ctx-overflow", value_parser = ["shift", "refuse"])]
    pub ctx_overflow: Option<String>,
    /// Leading tokens a context shift never drops.
    #[arg(long = "keep", default_value_t = 0)]
    pub keep: usize,
    /// Constrain the output to the GBNF grammar in FILE (llama.cpp's format).
    #[arg(long = "grammar", conflicts_with = "json_schema")]
    pub grammar: Option<PathBuf>,
    /// Constrain the output to JSON valid for the JSON schema in FILE.
    #[arg(long = "json-schema")]
    pub json_schema: Option<PathBuf>,
}

/// Generation and sampling flags, shared by `minfer run` and `minfer chat`.
#[derive(clap::Args, Debug, Clone)]
pub struct GenArgs {
    /// Tokens to generate (any value: generation stops cleanly when the context is full).
    #[arg(short = 'n', long = "n-predict", default_value_t = 256)]
    pub n_predict: usize,
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Top-k; 0 disables (any value: one above the vocabulary keeps every token).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Top-p in (0, 1].
    #[arg(long = "top-p", default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Min-p in [0, 1].
    #[arg(long = "min-p", default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Repetition penalty; 1 disables.
    #[arg(
        long = "repeat-penalty",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over, 0..=65536.
    #[arg(
        long = "repeat-last-n",
        default_value_t = 64,
        value_parser = usize_in(0..=MAX_PENALTY_WINDOW as u64)
    )]
    pub repeat_last_n: usize,
    /// Presence penalty.
    #[arg(
        long = "presence-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,
    /// Frequency penalty.
    #[arg(
        long = "frequency-penalty",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,
    /// Seed of the sampler (default: random).
    #[arg(long = "seed")]
    pub seed: Option<u64>,
    /// Stop before this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// Speculative decoding flags, shared by `minfer run`, `chat` and `bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding with this draft model (a GGUF path, catalog name or URL),
    /// which must share the target's vocabulary.
    #[arg(
        long = "draft",
        visible_alias = "model-draft",
        conflicts_with = "lookup"
    )]
    pub draft: Option<String>,
    /// Speculative decoding with n-gram lookup: drafts copied from the prompt and the
    /// output so far, costing no forward pass.
    #[arg(long = "lookup")]
    pub lookup: bool,
    /// Most tokens drafted per step, 1..=16 (the depth adapts below it, down to none).
    #[arg(
        long = "draft-max",
        default_value_t = DEFAULT_DRAFT_MAX,
        value_parser = usize_in(1..=DRAFT_MAX_LIMIT as u64)
    )]
    pub draft_max: usize,
}

impl SpecArgs {
    /// The speculator these flags select for `target` (`None` without --draft or
    /// --lookup); a draft model loads with the target's threads, backends and context.
    pub fn speculator(
        &self,
        model: &ModelArgs,
        target: &Engine,
        tok: &Tokenizer,
    ) -> anyhow::Result<Option<Speculator>> {
        let source: Box<dyn DraftSource> = if let Some(name) = &self.draft {
            let path =
                minfer_hub::resolve_model(Some(name), &super::common::EnvOptions::get().hub, true)?;
            let mut opts = model.engine_options();
            opts.n_ctx = Some(target.n_ctx());
            let engine = Engine::load(&path, &opts)
                .with_context(|| format!("loading the draft model {}", path.display()))?;
            Box::new(
                DraftModel::new(engine, tok, target.n_ctx())
                    .with_context(|| format!("--draft {}", path.display()))?,
            )
        } else if self.lookup {
            Box::new(NgramLookup::new())
        } else {
            return Ok(None);
        };
        Ok(Some(Speculator::new(source, self.draft_max)?))
    }
}

/// One line on stderr with a speculator's counters.
pub fn print_spec_stats(spec: &Speculator) {
    let s = spec.stats();
    eprintln!(
        "speculative ({}): {} drafted, {} accepted ({:.1}%), {} verify and {} plain steps",
        spec.source_name(),
        s.drafted,
        s.accepted,
        100.0 * s.acceptance(),
        s.verify_steps,
        s.plain_steps
    );
}

impl GenArgs {
    /// The sampler parameters these flags select (a random seed unless --seed).
    pub fn sampling(&self) -> SamplingParams {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.repeat_last_n,
            seed,
            logit_bias: Vec::new(),
        }
    }
}

impl Args {
    fn prompt_text(&self) -> anyhow::Result<String> {
        if let Some(p) = self.prompt.as_ref().or(self.prompt_arg.as_ref()) {
            return Ok(p.clone());
        }
        if let Some(f) = &self.file {
            let bytes =
                std::fs::read(f).with_context(|| format!("reading prompt file {}", f.display()))?;
            return String::from_utf8(bytes)
                .map_err(|e| anyhow::anyhow!("prompt file {} is not UTF-8: {e}", f.display()));
        }
        bail!("no prompt: give one as an argument, with -p PROMPT or with -f FILE")
    }
}

/// The grammar of `--grammar` or `--json-schema`, compiled against the model's vocabulary.
fn constraint(args: &Args, tok: &Tokenizer) -> anyhow::Result<Option<CompiledGrammar>> {
    let (path, flag) = match (&args.grammar, &args.json_schema) {
        (Some(p), _) => (p, "--grammar"),
        (None, Some(p)) => (p, "--json-schema"),
        (None, None) => return Ok(None),
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {flag} file {}", path.display()))?;
    let grammar = if args.grammar.is_some() {
        Grammar::Gbnf(text)
    } else {
        Grammar::JsonSchema(
            serde_json::from_str(&text)
                .with_context(|| format!("{flag} file {} is not valid JSON", path.display()))?,
        )
    };
    let vocab = GrammarVocab::new(tok)?;
    let g = CompiledGrammar::new(&vocab, &grammar)
        .with_context(|| format!("{flag} file {}", path.display()))?;
    Ok(Some(g))
}

/// Renders the prompt (optionally through the chat template) and tokenizes it.
fn prompt_tokens(args: &Args, tok: &Tokenizer, text: &str) -> anyhow::Result<Vec<u32>> {
    if args.chat {
        let tpl = ChatTemplate::from_tokenizer(tok)?;
        if tpl.is_fallback() {
            eprintln!("note: the model has no chat template; using ChatML");
        }
        let mut msgs = Vec::new();
        if let Some(s) = &args.system {
            msgs.push(ChatMessage::new("system", s.as_str()));
        }
        msgs.push(ChatMessage::new("user", text));
        // The prompt and system text are message content: their special-token text
        // stays text, and only the template's markers are control tokens.
        let rendered = tpl.render_spans(&msgs, true)?;
        Ok(rendered.encode(tok, &msgs, true)?)
    } else {
        // As llama.cpp's completion tool: special-token text in a prompt is parsed.
        Ok(tok.encode(text, true, true))
    }
}

/// A sampling refusal in terms of the flag that set the parameter.
pub fn flag_error(e: SamplerError) -> anyhow::Error {
    let SamplerError::OutOfRange { name, value, range } = e;
    let flag = if name == "temperature" {
        "temp (temperature)"
    } else {
        name
    };
    anyhow::anyhow!("invalid value {value} for --{flag}: must be {range}")
}

/// Runs `minfer run`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let sampling = args.gen.sampling();
    sampling.validate().map_err(flag_error)?;
    let overflow: Option<OverflowPolicy> = args
        .ctx_overflow
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    let dumping = args.dump_graph.is_some() || args.dump_graph_json.is_some();
    let text = if dumping {
        args.prompt_text().unwrap_or_default()
    } else {
        args.prompt_text()?
    };
    let mut engine = args.model.load()?;
    let tok = Tokenizer::from_gguf(engine.file())?;
    let prompt = prompt_tokens(&args, &tok, &text)?;
    let grammar = if dumping {
        None
    } else {
        constraint(&args, &tok)?
    };

    if dumping {
        let nt = if args.dump_kind == "decode" {
            1
        } else {
            prompt.len().clamp(2, 512)
        };
        let graph = engine.preview_graph(nt, 1)?;
        let name = engine
            .file()
            .get_str("general.name")
            .unwrap_or(engine.arch());
        if let Some(p) = &args.dump_graph {
            std::fs::write(p, graph.to_dot())
                .with_context(|| format!("writing {}", p.display()))?;
            eprintln!("wrote {} ({} nodes)", p.display(), graph.nodes.len());
        }
        if let Some(p) = &args.dump_graph_json {
            let json = graph.export_json(name, &args.dump_kind);
            std::fs::write(p, json).with_context(|| format!("writing {}", p.display()))?;
            eprintln!("wrote {} ({} nodes)", p.display(), graph.nodes.len());
        }
        return Ok(());
    }

    // `-n` beyond the room the context leaves is not an error: generation stops cleanly
    // where the context ends, as a length limit, and says so.
    let n_ctx = engine.n_ctx();
    let room = n_ctx.saturating_sub(prompt.len());
    if room == 0 {
        bail!(
            "the prompt is {} tokens and the context holds {n_ctx}: no room to generate (raise -c)",
            prompt.len()
        );
    }
    if overflow == Some(OverflowPolicy::Refuse) && args.gen.n_predict > room {
        bail!(
            "the prompt is {} tokens and -n asks for {} more, but the context holds {n_ctx} \
             (--ctx-overflow refuse): raise -c, lower -n, or use --ctx-overflow shift",
            prompt.len(),
            args.gen.n_predict
        );
    }
    let shift = overflow == Some(OverflowPolicy::Shift);
    let trace = super::trace::start(&mut engine, shift)?;
    let capped = !shift && args.gen.n_predict > room;
    let mut kv = KvHistory::new();
    if let Some(path) = args.session.as_deref().filter(|p| p.exists()) {
        // A refused file is an error, not a silent fresh start: it is left as it is.
        kv = KvHistory::from_tokens(session::load(&mut engine, path)?);
        // The shared reuse rule: at least the last prompt token runs again, for the
        // first logits, and only from where the engine can go on (a recurrent model's
        // state goes on from its end, or from a state checkpoint).
        let reuse = kv
            .clone()
            .reuse_from(&prompt, |k| engine.resume_point(k))
            .kept;
        eprintln!(
            "session {}: reusing {reuse} of {} prompt tokens ({} stored)",
            path.display(),
            prompt.len(),
            kv.len(),
        );
    }
    let opts = GenerateOptions {
        // Under `shift` the context never ends the run; otherwise it ends where the
        // context does, as a length limit.
        max_tokens: if shift {
            args.gen.n_predict
        } else {
            args.gen.n_predict.min(room)
        },
        stop: args.gen.stop.clone(),
        sampling,
        constraint: grammar,
    };
    let mut spec = args.gen.spec.speculator(&args.model, &engine, &tok)?;
    let mut out = std::io::stdout().lock();
    let mut write_err = None;
    let run = generate_shifting_with(
        &mut engine,
        &tok,
        &mut kv,
        &prompt,
        args.keep,
        &opts,
        spec.as_mut(),
        |piece| {
            if let Err(e) = out.write_all(piece.as_bytes()).and_then(|_| out.flush()) {
                write_err = Some(e);
                return false;
            }
            true
        },
    );
    if let Some((path, rec)) = &trace {
        // Written whether or not the run succeeded: a failed step's trace explains it.
        let tokens = run
            .as_ref()
            .map(|r| r.stats.tokens.as_slice())
            .unwrap_or(&[]);
        // The prompt tokens prefilled: a session's reused prefix runs no step.
        let prefilled = run.as_ref().map_or(prompt.len(), |r| r.stats.prompt_tokens);
        let chunks = prefilled.div_ceil(engine.n_batch().max(1));
        let steps = rec.take();
        let sampled = super::trace::sampled_tokens(steps.len(), chunks.saturating_sub(1), tokens);
        let doc = super::trace::document(engine.model_name(), &text, &steps, &sampled, &tok);
        super::trace::write(path, &doc)?;
    }
    let run = run?;
    let stats = run.stats;
    if let Some(e) = write_err {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            return Err(e).context("writing to stdout");
        }
    }
    let _ = writeln!(out);
    if let Some(path) = &args.session {
        // The KV holds the prompt and every generated token fed back (the last sampled
        // one never is), after any shifts.
        session::save(&mut engine, kv.tokens(), path)?;
    }
    if run.shifted > 0 {
        eprintln!(
            "note: the context was full: dropped {} tokens after the first {} (--ctx-overflow shift)",
            run.shifted,
            args.keep.min(prompt.len())
        );
    }
    if capped && stats.finish == FinishReason::Length {
        eprintln!(
            "note: stopped at the end of the context ({n_ctx} tokens: {} prompt, {} generated); raise -c for more",
            stats.prompt_tokens, stats.gen_tokens
        );
    }
    let rate = |n: usize, d: std::time::Duration| {
        if d.as_secs_f64() > 0.0 {
            n as f64 / d.as_secs_f64()
        } else {
            0.0
        }
    };
    if let Some(spec) = &spec {
        print_spec_stats(spec);
    }
    eprintln!(
        "load {:.2} s | prompt {} tokens, {:.1} t/s | generated {} tokens, {:.1} t/s",
        engine.load_time().as_secs_f64(),
        stats.prompt_tokens,
        rate(stats.prompt_tokens, stats.prompt_time),
        stats.gen_tokens,
        rate(stats.gen_tokens, stats.gen_time),
    );
    Ok(())
}
