//! The per-node trace on the command line: recording an engine's traced steps and
//! assembling them into the `minfer-trace` document (`MINFER_TRACE` for `minfer run`,
//! and the page of `minfer viz`).

use std::sync::{Arc, Mutex};

use minfer_graph::trace::{DEFAULT_MAX_VALUES, TRACE_FORMAT, TRACE_VERSION};
use minfer_runtime::{Engine, TracedStep};
use minfer_tokenizer::Tokenizer;
use serde_json::{json, Value};

/// Refuses a trace on an engine that runs nodes on a backend whose outputs the trace
/// cannot read (neither host-visible nor staged by the backend), before anything runs.
pub fn check_backends(engine: &Engine) -> anyhow::Result<()> {
    let others = engine.untraceable_backends();
    if !others.is_empty() {
        anyhow::bail!(
            "the per-node trace cannot read node outputs on the {} backend (it stages no \
             trace copies): trace with --backend cpu or --backend wgpu",
            others.join(", ")
        );
    }
    Ok(())
}

/// Starts the `MINFER_TRACE` recording of `minfer run` when the variable is set:
/// returns the file to write and the recorder. A run that may shift its context
/// (`shifting`) is refused: a shift re-runs the kept tokens in chunks the trace cannot
/// tell from decode steps, so its tokens would be attributed to the wrong steps. A run
/// over a loaded session is traced: its steps are those of the prompt part it runs.
pub fn start(
    engine: &mut Engine,
    shifting: bool,
) -> anyhow::Result<Option<(std::path::PathBuf, Recorder)>> {
    let Some(path) = minfer_env::TRACE.get() else {
        return Ok(None);
    };
    if shifting {
        anyhow::bail!(
            "MINFER_TRACE is not combined with --ctx-overflow shift: a shift re-runs kept \
             tokens, which the trace cannot tell from decode steps"
        );
    }
    check_backends(engine)?;
    let rec = Recorder::default();
    rec.attach(engine);
    Ok(Some((path.into(), rec)))
}

/// Writes `doc` to `path` (through a temporary file beside it, so a reader never sees a
/// half-written trace).
pub fn write(path: &std::path::Path, doc: &Value) -> anyhow::Result<()> {
    use anyhow::Context;
    let text = serde_json::to_string(doc).context("encoding the trace")?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".part");
    std::fs::write(&tmp, text).with_context(|| format!("writing the trace {}", path.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing the trace {}", path.display()))?;
    eprintln!("trace written to {}", path.display());
    Ok(())
}

/// Collects an engine's traced steps (the engine's sink pushes, the command reads).
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<Vec<TracedStep>>>);

impl Recorder {
    /// Turns the trace on in `engine`, recording into this recorder.
    pub fn attach(&self, engine: &mut Engine) {
        let steps = self.0.clone();
        engine.set_trace(
            Some(Box::new(move |s| {
                if let Ok(mut v) = steps.lock() {
                    v.push(s);
                }
            })),
            DEFAULT_MAX_VALUES,
        );
    }

    /// The steps recorded so far, leaving the recorder empty.
    pub fn take(&self) -> Vec<TracedStep> {
        self.0
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

/// The text of one token for the page (lossy where the token is part of a character).
pub fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode_bytes(&[id], true)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// One step's entry of the document: `token` is the token sampled from the step's
/// logits, or `None` for a step no token was taken from.
pub fn step_json(step: &TracedStep, token: Option<u32>, tok: &Tokenizer) -> Value {
    json!({
        "token": token,
        "text": token.map(|t| token_text(tok, t)).unwrap_or_default(),
        "logits_top": step.logits_top.iter().map(|&(id, logit)| json!({
            "id": id,
            "logit": serde_json::Number::from_f64(f64::from(logit)).map_or(Value::Null, Value::Number),
            "text": token_text(tok, id),
        })).collect::<Vec<_>>(),
        "nodes": step.nodes.iter().map(|n| n.to_json()).collect::<Vec<_>>(),
    })
}

/// The token taken from each of `n_steps` steps' logits, when `tokens[i]` came from step
/// `first_sampled + i` (earlier steps are prefill chunks whose logits nobody samples;
/// a last step that sampled end-of-generation has none either).
pub fn sampled_tokens(n_steps: usize, first_sampled: usize, tokens: &[u32]) -> Vec<Option<u32>> {
    (0..n_steps)
        .map(|i| {
            i.checked_sub(first_sampled)
                .and_then(|k| tokens.get(k).copied())
        })
        .collect()
}

/// The `minfer-trace` document of a run: a new phase at every change of graph, each
/// with its graph's export; `step_tokens[i]` is the token taken from step `i`.
pub fn document(
    model: &str,
    prompt: &str,
    steps: &[TracedStep],
    step_tokens: &[Option<u32>],
    tok: &Tokenizer,
) -> Value {
    let mut phases: Vec<Value> = Vec::new();
    let mut last_uid = None;
    for (i, s) in steps.iter().enumerate() {
        if last_uid != Some(s.graph_uid) || s.graph.is_some() {
            last_uid = Some(s.graph_uid);
            phases.push(json!({
                "kind": s.kind,
                "graph": s.graph.clone().unwrap_or(Value::Null),
                "steps": [],
            }));
        }
        let token = step_tokens.get(i).copied().flatten();
        if let Some(Value::Array(v)) = phases.last_mut().and_then(|p| p.get_mut("steps")) {
            v.push(step_json(s, token, tok));
        }
    }
    json!({
        "format": TRACE_FORMAT,
        "version": TRACE_VERSION,
        "model": model,
        "prompt": prompt,
        "phases": phases,
    })
}
