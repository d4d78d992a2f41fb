//! The models a server offers and the ones it holds loaded: each served model is a file
//! with an id (its alias, or its file stem) and the names a request's `model` may select
//! it by; at most `max_loaded` are loaded at once, each with its own inference worker,
//! loaded on first use and dropped least recently used first. A model still serving a
//! request when it is dropped finishes that request, then its worker ends.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use minfer_runtime::{EngineOptions, MultiEngine};
use minfer_tokenizer::{ChatTemplate, Tokenizer};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::worker::{self, WorkerHandle};

/// One model to serve: its file and, optionally, the id to report for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// The GGUF file.
    pub path: PathBuf,
    /// The id `/v1/models` and answers report (`--alias`); the file stem without one.
    pub alias: Option<String>,
    /// Other names a request's `model` may select it by (its catalog name and aliases).
    pub names: Vec<String>,
}

impl ModelSpec {
    /// A model known by its file stem only.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        ModelSpec {
            path: path.into(),
            alias: None,
            names: Vec::new(),
        }
    }
}

/// A loaded model: its worker and what the HTTP side needs to prepare its requests.
pub struct Model {
    /// The id answers report.
    pub id: String,
    /// The queue into its inference worker.
    pub worker: WorkerHandle,
    /// Its tokenizer.
    pub tok: Arc<Tokenizer>,
    /// Its chat template.
    pub template: ChatTemplate,
    /// Positions per slot.
    pub slot_ctx: usize,
    /// Slots (concurrent sequences).
    pub n_slots: usize,
    /// Most tokens one answer may generate (`--n-predict`); `None`: the slot's context.
    pub n_predict: Option<usize>,
    /// `enable_thinking` of a chat whose request does not set it (`--reasoning-budget`).
    pub thinking: bool,
    /// OpenAI's `system_fingerprint` for its answers.
    pub fingerprint: String,
    /// Its GGUF file (llama-server's `/props` reports it).
    pub path: PathBuf,
    /// Its fill-in-the-middle tokens, or why `/infill` cannot run on it.
    pub fim: Result<crate::api::llama::Fim, String>,
    /// The model as ollama's listing routes describe it.
    pub facts: crate::api::ollama::ModelFacts,
    /// How it pools embeddings unless the server's `--pooling` says otherwise.
    pub pooling: minfer_runtime::embed::Pooling,
    /// Scores per text of its classifier head (a cross-encoder reranker), if it has one.
    pub rank_width: Option<usize>,
    /// Whether it is an encoder (embeddings only, no logits).
    pub encoder: bool,
    /// Its vocabulary for constrained decoding, built by the first request that needs it.
    pub grammar: std::sync::OnceLock<Result<Arc<minfer_runtime::GrammarVocab>, String>>,
}

impl Model {
    /// The most tokens an answer generates when its request asks for `requested`
    /// (`None`: no limit): capped by `--n-predict`; `None` leaves only the context.
    pub fn answer_limit(&self, requested: Option<usize>) -> Option<usize> {
        match (requested, self.n_predict) {
            (Some(r), Some(cap)) => Some(r.min(cap)),
            (r, cap) => r.or(cap),
        }
    }

    /// The vocabulary grammars compile against (built once, on first use).
    pub fn grammar_vocab(&self) -> Result<Arc<minfer_runtime::GrammarVocab>, String> {
        self.grammar
            .get_or_init(|| minfer_runtime::GrammarVocab::new(&self.tok).map_err(|e| e.to_string()))
            .clone()
    }
}

/// How every model is loaded.
#[derive(Clone)]
pub struct LoadOptions {
    /// Engine options (threads, context, backend, KV formats).
    pub engine: EngineOptions,
    /// Slots per model.
    pub slots: usize,
    /// Requests that may wait for a slot of one model.
    pub queue: usize,
    /// Most tokens one answer may generate (`--n-predict`); `None`: the slot's context.
    pub n_predict: Option<usize>,
    /// A chat template's source that replaces every model's own; `None`: each model's.
    pub chat_template: Option<String>,
    /// `enable_thinking` of a chat whose request does not set it.
    pub thinking: bool,
    /// The server's counters, shared by every model's worker.
    pub metrics: Arc<Metrics>,
    /// Busy slots over every model's worker (what the `busy_slots` gauge shows).
    pub busy: Arc<std::sync::atomic::AtomicUsize>,
    /// Speculative decoding in every slot, and its draft source.
    pub speculation: worker::Speculation,
    /// The prompt cache every model's slots share (`--cache-ram`); `None`: off.
    pub prompt_cache: Option<crate::prompt_cache::SharedPromptCache>,
}

struct Entry {
    id: String,
    /// Lower-case names a request may select this model by.
    names: Vec<String>,
    path: PathBuf,
}

/// Every served model, and the loaded ones in least-recently-used order.
pub struct Models {
    entries: Vec<Entry>,
    /// (entry index, model), most recently used last.
    loaded: Mutex<Vec<(usize, Arc<Model>)>>,
    /// Held while a model loads, so that two requests never load the same model twice.
    loading: Mutex<()>,
    max_loaded: usize,
    opts: LoadOptions,
    /// Worker threads of every model loaded so far, joined when the server stops.
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

/// A file's stem, the id of a model without an alias.
fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "minfer".into())
}

/// A `model` field as names are compared: trimmed, lower case, without ollama's
/// `:latest` tag.
fn normalise(name: &str) -> String {
    let n = name.trim().to_ascii_lowercase();
    n.strip_suffix(":latest").map(str::to_string).unwrap_or(n)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The lists stay consistent at every await-free step: keep using them after a panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Models {
    /// The served models (the first is the default), refusing two with one id.
    pub fn new(
        specs: &[ModelSpec],
        max_loaded: usize,
        opts: LoadOptions,
        threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    ) -> Result<Self, String> {
        if specs.is_empty() {
            return Err("no model to serve".into());
        }
        let mut entries: Vec<Entry> = Vec::with_capacity(specs.len());
        for s in specs {
            let id = s.alias.clone().unwrap_or_else(|| stem(&s.path));
            if id.trim().is_empty() {
                return Err(format!("the alias of {} is empty", s.path.display()));
            }
            if let Some(other) = entries.iter().find(|e| normalise(&e.id) == normalise(&id)) {
                return Err(format!(
                    "two models are named `{id}` ({} and {}): give each its own --alias",
                    other.path.display(),
                    s.path.display()
                ));
            }
            let mut names = vec![normalise(&id), normalise(&stem(&s.path))];
            names.extend(s.names.iter().map(|n| normalise(n)));
            entries.push(Entry {
                id,
                names,
                path: s.path.clone(),
            });
        }
        Ok(Models {
            entries,
            loaded: Mutex::new(Vec::new()),
            loading: Mutex::new(()),
            max_loaded,
            opts,
            threads,
        })
    }

    /// Ids of every served model, default first.
    pub fn ids(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.id.as_str()).collect()
    }

    /// The file of the served model with this id.
    pub fn path(&self, id: &str) -> Option<&Path> {
        self.entries
            .iter()
            .find(|e| e.id == id)
            .map(|e| e.path.as_path())
    }

    /// The id of the served model that `name` names exactly (its id, file stem or a
    /// catalog name, with or without `:latest`), never loading it. Unlike a request's
    /// `model`, a single model does not answer to every name here: ollama's clients
    /// expect an unknown name to be refused.
    pub fn find(&self, name: &str) -> Option<&str> {
        let want = normalise(name);
        self.entries
            .iter()
            .find(|e| e.names.contains(&want))
            .map(|e| e.id.as_str())
    }

    /// The loaded model of this id, if it is loaded (never loads).
    pub fn loaded(&self, id: &str) -> Option<Arc<Model>> {
        lock(&self.loaded)
            .iter()
            .find(|(_, m)| m.id == id)
            .map(|(_, m)| Arc::clone(m))
    }

    /// The entry a request's `model` selects: the default without one; with a single
    /// model, that model whatever the name (as llama-server does, so clients that send a
    /// fixed name keep working); otherwise the model with that id, file stem or catalog
    /// name, or OpenAI's `model_not_found`.
    fn select(&self, name: Option<&str>) -> Result<usize, ApiError> {
        let Some(name) = name else {
            return Ok(0);
        };
        if self.entries.len() == 1 {
            return Ok(0);
        }
        let want = normalise(name);
        self.entries
            .iter()
            .position(|e| e.names.contains(&want))
            .ok_or_else(|| ApiError::model_not_found(name, &self.ids().join(", ")))
    }

    /// The model a request's `model` selects, loading it first if it is not loaded
    /// (which blocks for the load: call it off the async threads). A load failure is an
    /// error to this request only.
    pub fn get(&self, name: Option<&str>) -> Result<Arc<Model>, ApiError> {
        let idx = self.select(name)?;
        if let Some(m) = self.touch(idx) {
            return Ok(m);
        }
        let _one_load = lock(&self.loading);
        // Another request may have loaded it while this one waited.
        if let Some(m) = self.touch(idx) {
            return Ok(m);
        }
        let e = &self.entries[idx];
        let model = Arc::new(
            self.load(e)
                .map_err(|msg| ApiError::internal(format!("loading model `{}`: {msg}", e.id)))?,
        );
        let mut loaded = lock(&self.loaded);
        loaded.push((idx, Arc::clone(&model)));
        while loaded.len() > self.max_loaded {
            // Dropped here; a request still using it keeps it until it ends.
            loaded.remove(0);
        }
        Ok(model)
    }

    /// The loaded model of entry `idx`, marked most recently used.
    fn touch(&self, idx: usize) -> Option<Arc<Model>> {
        let mut loaded = lock(&self.loaded);
        let at = loaded.iter().position(|(i, _)| *i == idx)?;
        let hit = loaded.remove(at);
        let m = Arc::clone(&hit.1);
        loaded.push(hit);
        Some(m)
    }

    fn load(&self, e: &Entry) -> Result<Model, String> {
        let (path, engine, slots) = (e.path.clone(), self.opts.engine.clone(), self.opts.slots);
        let load = move || MultiEngine::load(&path, &engine, slots);
        let (worker, loaded, thread) = worker::spawn(
            load,
            self.opts.queue,
            Arc::clone(&self.opts.metrics),
            Arc::clone(&self.opts.busy),
            self.opts.speculation.clone(),
            self.opts.prompt_cache.clone(),
        )?;
        lock(&self.threads).push(thread);
        let template = match &self.opts.chat_template {
            Some(src) => ChatTemplate::for_tokenizer(src, &loaded.tokenizer),
            None => ChatTemplate::from_tokenizer(&loaded.tokenizer),
        }
        .map_err(|err| format!("chat template: {err}"))?;
        // The engine keeps its own mapping on the worker thread; this one is read once
        // for the metadata the native APIs report, and dropped.
        let gguf = minfer_gguf::GgufFile::open(&e.path)
            .map_err(|err| format!("reading {}: {err}", e.path.display()))?;
        let fim = crate::api::llama::Fim::find(&gguf, &loaded.tokenizer);
        let facts = crate::api::ollama::ModelFacts::new(&e.path, &gguf);
        drop(gguf);
        Ok(Model {
            id: e.id.clone(),
            worker,
            tok: loaded.tokenizer,
            template,
            slot_ctx: loaded.slot_ctx,
            n_slots: slots,
            n_predict: self.opts.n_predict,
            thinking: self.opts.thinking,
            fingerprint: crate::api::openai::fingerprint(&loaded.digest),
            path: e.path.clone(),
            fim,
            facts,
            pooling: loaded.pooling,
            rank_width: loaded.rank_width,
            encoder: loaded.encoder,
            grammar: std::sync::OnceLock::new(),
        })
    }
}

/// Every `.gguf` file under `dir` (its subdirectories included), sorted by path.
pub fn gguf_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let rd = std::fs::read_dir(&d).map_err(|e| format!("reading {}: {e}", d.display()))?;
        for ent in rd {
            let p = ent
                .map_err(|e| format!("reading {}: {e}", d.display()))?
                .path();
            if p.is_dir() {
                todo.push(p);
            } else if p
                .extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(format!("{} holds no .gguf file", dir.display()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models(specs: &[(&str, Option<&str>)]) -> Result<Models, String> {
        let specs: Vec<ModelSpec> = specs
            .iter()
            .map(|(p, a)| ModelSpec {
                path: PathBuf::from(p),
                alias: a.map(str::to_string),
                names: if p.contains("qwen") {
                    vec!["qwen2.5-coder:0.5b".into()]
                } else {
                    Vec::new()
                },
            })
            .collect();
        let opts = LoadOptions {
            engine: EngineOptions::default(),
            slots: 1,
            queue: 1,
            n_predict: None,
            chat_template: None,
            thinking: true,
            metrics: Arc::new(Metrics::default()),
            busy: Arc::default(),
            speculation: worker::Speculation::Off,
            prompt_cache: None,
        };
        Models::new(&specs, 1, opts, Arc::default())
    }

    #[test]
    fn requests_select_by_alias_stem_or_catalog_name() {
        let m = models(&[
            ("/m/a.gguf", Some("coder")),
            ("/m/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", None),
            ("/m/b.gguf", None),
        ])
        .unwrap();
        assert_eq!(
            m.ids(),
            ["coder", "qwen2.5-coder-0.5b-instruct-q4_k_m", "b"]
        );
        assert_eq!(m.select(None).unwrap(), 0);
        assert_eq!(m.select(Some("a")).unwrap(), 0);
        assert_eq!(m.select(Some("CODER")).unwrap(), 0);
        assert_eq!(m.select(Some("qwen2.5-coder:0.5b")).unwrap(), 1);
        assert_eq!(m.select(Some("b:latest")).unwrap(), 2);
        let e = m.select(Some("gpt-4o")).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (404, Some("model_not_found")));
        assert!(e.message.contains("coder, qwen2.5"), "{}", e.message);
        // One model answers to any name, as llama-server does.
        let one = models(&[("/m/a.gguf", None)]).unwrap();
        assert_eq!(one.select(Some("gpt-4o")).unwrap(), 0);
    }

    #[test]
    fn two_models_with_one_id_are_refused() {
        let e = models(&[("/x/a.gguf", None), ("/y/a.gguf", None)])
            .err()
            .unwrap();
        assert!(e.contains("`a`") && e.contains("--alias"), "{e}");
        assert!(models(&[("/x/a.gguf", None), ("/y/a.gguf", Some("other"))]).is_ok());
        assert!(models(&[]).is_err());
    }
}
