//! Shared test helpers: tiny models on disk, and a runner that executes minfer's graphs
//! on the graph crate's scalar reference backend with dequantized weights.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use minfer_gguf::quant::dequantize_to_vec;
use minfer_gguf::GgufFile;
use minfer_graph::testing::{RefBackend, WeightStore};
use minfer_graph::{BackendScheduler, CParams, FusionPass, GraphAllocator, GraphCache};
use minfer_models::testing::{write_tiny_model, TinySpec};
use minfer_models::{load_model, params, ModelDef};

/// Writes `spec` into `dir` as `{stem}.gguf` and opens it.
pub fn write_and_open(dir: &Path, stem: &str, spec: &TinySpec) -> (PathBuf, GgufFile) {
    let path = dir.join(format!("{stem}.gguf"));
    write_tiny_model(&path, spec).expect("write tiny model");
    let file = GgufFile::open(&path).expect("open tiny model");
    (path, file)
}

/// Writes a tiny model into a temporary directory, opens it from disk and loads it.
pub fn tiny(spec: &TinySpec) -> Box<dyn ModelDef> {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, file) = write_and_open(dir.path(), spec.arch, spec);
    load_model(&file).expect("load tiny model")
}

/// Every tensor of `file`, dequantized to f32 in GGUF memory order.
pub fn weight_store(file: &GgufFile) -> Arc<WeightStore> {
    let mut store = WeightStore::new();
    for t in file.tensors() {
        let n = t.n_elements() as usize;
        let data = dequantize_to_vec(t.ggml_type, file.tensor_data(t), n).expect("dequantize");
        let in_dim = t.dims[0] as usize;
        store.insert(&t.name, in_dim, n / in_dim, data);
    }
    Arc::new(store)
}

/// One model's graphs executed on the reference CPU backend, with the reuse cache and
/// FusionPass exactly as a runtime would use them.
pub struct RefRunner {
    pub model: Box<dyn ModelDef>,
    pub cache: GraphCache,
    pub sched: BackendScheduler,
    pub cparams: CParams,
}

impl RefRunner {
    pub fn new(file: &GgufFile, n_ctx: usize) -> Self {
        let model = load_model(file).expect("load model");
        let backend = RefBackend::cpu().with_weights(weight_store(file));
        let alloc = GraphAllocator::new(vec![Box::new(backend)]).expect("allocator");
        RefRunner {
            model,
            cache: GraphCache::new(alloc),
            sched: BackendScheduler::new(),
            cparams: params::cpu_cparams(n_ctx),
        }
    }

    /// Runs `tokens` at positions `start..`, returning logits of the last `n_out` tokens.
    pub fn forward(&mut self, tokens: &[u32], start: usize, n_out: usize) -> Vec<f32> {
        let nt = tokens.len();
        let p = params::graph_params(nt, n_out, self.cparams.clone()).expect("params");
        if !self.cache.try_reuse(&p) {
            let g = self.model.build_graph(&p);
            self.cache
                .install(g, p, &mut self.sched, &FusionPass::new())
                .expect("install graph");
        }
        let (g, alloc) = self.cache.current().expect("cached graph");
        let pos: Vec<i32> = (start..start + nt).map(|i| i as i32).collect();
        alloc.fill_input_u32(g, "token_ids", tokens).unwrap();
        alloc.fill_input_i32(g, "positions", &pos).unwrap();
        if n_out < nt {
            alloc
                .fill_input_i32(g, "tail_ids", &params::tail_ids(nt, n_out))
                .unwrap();
        }
        self.sched.execute(g, alloc).expect("execute");
        let out = g.outputs[0];
        alloc.copy_to_cpu(out).expect("logits")
    }
}

/// Index of the largest value (first on ties).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}
