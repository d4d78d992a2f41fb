//! Shared harness: random weights registered identically in a `CpuBackend` and the graph
//! crate's reference backend, a small Qwen2/Qwen3-style model graph, and a runner that
//! assigns, fuses, allocates, fills and executes graphs step by step.
#![allow(dead_code)]

use std::sync::Arc;

use minfer_cpu::CpuBackend;
use minfer_gguf::quant::{dequantize_to_vec, quantize_to_vec};
use minfer_gguf::{GgmlType, GgufFile, GgufWriter};
use minfer_graph::testing::{RefBackend, WeightStore};
use minfer_graph::*;

pub use minfer_testkit::Rng;

/// One weight with the values both backends see.
#[derive(Clone)]
pub struct TestWeight {
    pub name: String,
    /// GGUF dims `[in, out]` (`out == 1` for vectors).
    pub dims: [usize; 2],
    pub ty: GgmlType,
    /// Stored bytes for quantized weights (GGUF path), and the values they decode to.
    pub bytes: Vec<u8>,
    pub values: Vec<f32>,
}

impl TestWeight {
    /// A weight of `ty` from raw values; `values` becomes what the stored form decodes to.
    pub fn new(name: &str, dims: [usize; 2], ty: GgmlType, raw: Vec<f32>) -> Self {
        let bytes = quantize_to_vec(ty, &raw).expect("quantize test weight");
        let values = dequantize_to_vec(ty, &bytes, raw.len()).expect("dequantize test weight");
        TestWeight {
            name: name.to_string(),
            dims,
            ty,
            bytes,
            values,
        }
    }

    pub fn wref(&self) -> WeightRef {
        WeightRef::new(self.name.clone(), WeightType(self.ty.id()), self.dims)
    }
}

/// The reference backend's view of the weights (decoded f32).
pub fn ref_store(ws: &[TestWeight]) -> Arc<WeightStore> {
    let mut s = WeightStore::new();
    for w in ws {
        s.insert(&w.name, w.dims[0], w.dims[1], w.values.clone());
    }
    Arc::new(s)
}

/// A CPU backend with every weight registered as owned f32 (decoded values).
pub fn cpu_f32(ws: &[TestWeight], n_threads: usize) -> CpuBackend {
    let mut cpu = CpuBackend::new(n_threads);
    for w in ws {
        let dims: &[usize] = if w.dims[1] == 1 {
            &w.dims[..1]
        } else {
            &w.dims
        };
        assert!(cpu.register_f32(&w.name, dims, w.values.clone()).unwrap());
    }
    cpu
}

/// The weights serialized as a GGUF image in their stored types.
pub fn gguf_file(ws: &[TestWeight]) -> Arc<GgufFile> {
    let mut wr = GgufWriter::new();
    for w in ws {
        let dims: Vec<u64> = if w.dims[1] == 1 {
            vec![w.dims[0] as u64]
        } else {
            vec![w.dims[0] as u64, w.dims[1] as u64]
        };
        wr.add_tensor_bytes(&w.name, &dims, w.ty, w.bytes.clone())
            .unwrap();
    }
    Arc::new(GgufFile::from_bytes(wr.to_bytes().unwrap()).unwrap())
}

/// A CPU backend with the weights registered zero-copy from a GGUF image.
pub fn cpu_gguf(ws: &[TestWeight], n_threads: usize) -> CpuBackend {
    let mut cpu = CpuBackend::new(n_threads);
    assert_eq!(cpu.register_gguf(gguf_file(ws), "").unwrap(), ws.len());
    cpu
}

/// Host data for one input.
pub enum Fill {
    I32(Vec<i32>),
    F32(Vec<f32>),
}

/// Owns an allocator and scheduler across steps (the KV regions persist between them).
pub struct Runner {
    pub alloc: GraphAllocator,
    sched: BackendScheduler,
    pub fuse: bool,
}

impl Runner {
    pub fn new(backends: Vec<Box<dyn BackendImpl>>) -> Self {
        Runner {
            alloc: GraphAllocator::new(backends).unwrap(),
            sched: BackendScheduler::new(),
            fuse: true,
        }
    }

    pub fn cpu(b: CpuBackend) -> Self {
        Self::new(vec![Box::new(b)])
    }

    pub fn reference(ws: &[TestWeight]) -> Self {
        Self::new(vec![Box::new(
            RefBackend::cpu().with_weights(ref_store(ws)),
        )])
    }

    /// Runs `g` with `inputs`; returns the outputs' values in `g.outputs` order.
    pub fn step(
        &mut self,
        mut g: ComputeGraph,
        inputs: &[(&str, Fill)],
    ) -> Result<Vec<Vec<f32>>, GraphError> {
        self.sched.assign_backends(&mut g, &self.alloc);
        if self.fuse {
            FusionPass::new().run(&mut g, &self.alloc);
        }
        self.alloc.alloc_graph(&g)?;
        for (name, data) in inputs {
            match data {
                Fill::I32(v) => self.alloc.fill_input_i32(&g, name, v)?,
                Fill::F32(v) => self.alloc.fill_input(&g, name, v)?,
            }
        }
        self.sched.execute(&g, &mut self.alloc)?;
        Ok(g.outputs
            .iter()
            .map(|&o| self.alloc.copy_to_cpu(o).expect("output buffer"))
            .collect())
    }
}

/// Largest absolute difference, and the largest absolute reference value.
pub fn max_diff(got: &[f32], want: &[f32]) -> (f32, f32) {
    assert_eq!(got.len(), want.len(), "length");
    let d = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(
            0.0f32,
            |a, b| if b.is_nan() { f32::INFINITY } else { a.max(b) },
        );
    let m = want.iter().fold(0.0f32, |a, b| a.max(b.abs()));
    (d, m)
}

/// Asserts `max|got - want| <= tol * max(1, max|want|)`.
pub fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    let (d, m) = max_diff(got, want);
    assert!(
        d <= tol * m.max(1.0),
        "{what}: max diff {d} vs max |ref| {m} (tol {tol})"
    );
}

/// Model geometry of the test transformer.
#[derive(Clone, Copy, Debug)]
pub struct Cfg {
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv: usize,
    pub hd: usize,
    pub n_ff: usize,
    pub vocab: usize,
    pub n_layer: usize,
    pub n_ctx: usize,
    pub eps: f32,
    /// Qwen3: per-head q/k norms and no q/k/v biases.
    pub qwen3: bool,
}

impl Cfg {
    pub fn small(qwen3: bool) -> Self {
        Cfg {
            n_embd: 256,
            n_head: 4,
            n_kv: 2,
            hd: 64,
            n_ff: 512,
            vocab: 300,
            n_layer: 2,
            n_ctx: 32,
            eps: 1e-6,
            qwen3,
        }
    }
}

/// Random weights; `matrix_ty` picks each matrix's stored type by name.
pub fn make_weights(cfg: &Cfg, seed: u64, matrix_ty: &dyn Fn(&str) -> GgmlType) -> Vec<TestWeight> {
    let mut r = Rng::new(seed);
    let mut ws = Vec::new();
    let (e, nqt, nkt) = (cfg.n_embd, cfg.n_head * cfg.hd, cfg.n_kv * cfg.hd);
    let mat = |ws: &mut Vec<TestWeight>, r: &mut Rng, name: String, i: usize, o: usize| {
        let scale = 1.0 / (i as f32).sqrt() * 1.7;
        ws.push(TestWeight::new(
            &name,
            [i, o],
            matrix_ty(&name),
            r.vec(i * o, scale),
        ));
    };
    let norm = |ws: &mut Vec<TestWeight>, r: &mut Rng, name: String, n: usize| {
        let v = (0..n).map(|_| 1.0 + 0.2 * r.f32()).collect();
        ws.push(TestWeight::new(&name, [n, 1], GgmlType::F32, v));
    };
    mat(&mut ws, &mut r, "token_embd.weight".into(), e, cfg.vocab);
    for l in 0..cfg.n_layer {
        let b = format!("blk.{l}");
        norm(&mut ws, &mut r, format!("{b}.attn_norm.weight"), e);
        for (n, o) in [("attn_q", nqt), ("attn_k", nkt), ("attn_v", nkt)] {
            mat(&mut ws, &mut r, format!("{b}.{n}.weight"), e, o);
            if !cfg.qwen3 {
                let v = r.vec(o, 0.5);
                ws.push(TestWeight::new(
                    &format!("{b}.{n}.bias"),
                    [o, 1],
                    GgmlType::F32,
                    v,
                ));
            }
        }
        if cfg.qwen3 {
            norm(&mut ws, &mut r, format!("{b}.attn_q_norm.weight"), cfg.hd);
            norm(&mut ws, &mut r, format!("{b}.attn_k_norm.weight"), cfg.hd);
        }
        mat(&mut ws, &mut r, format!("{b}.attn_output.weight"), nqt, e);
        norm(&mut ws, &mut r, format!("{b}.ffn_norm.weight"), e);
        mat(&mut ws, &mut r, format!("{b}.ffn_gate.weight"), e, cfg.n_ff);
        mat(&mut ws, &mut r, format!("{b}.ffn_up.weight"), e, cfg.n_ff);
        mat(&mut ws, &mut r, format!("{b}.ffn_down.weight"), cfg.n_ff, e);
    }
    norm(&mut ws, &mut r, "output_norm.weight".into(), e);
    mat(&mut ws, &mut r, "output.weight".into(), e, cfg.vocab);
    ws
}

fn find(ws: &[TestWeight], name: &str) -> WeightRef {
    ws.iter()
        .find(|w| w.name == name)
        .unwrap_or_else(|| panic!("test weight {name}"))
        .wref()
}

/// The forward graph for `nt` tokens: embedding, `n_layer` blocks, final norm, the last
/// row (`tail` input), logits. Inputs: `tokens`, `positions`, `cells`, `tail` (I32).
pub fn model_graph(cfg: &Cfg, ws: &[TestWeight], nt: usize) -> ComputeGraph {
    let mut b = GraphBuilder::new();
    let ids = b.input("tokens", [nt, 1, 1, 1], DType::I32);
    let pos = b.input("positions", [nt, 1, 1, 1], DType::I32);
    let cells = b.input("cells", [nt, 1, 1, 1], DType::I32);
    let tail = b.input("tail", [1, 1, 1, 1], DType::I32);
    let w = |n: &str| find(ws, n);
    let mut x = b.embedding(ids, &w("token_embd.weight"));
    let nkt = cfg.n_kv * cfg.hd;
    for l in 0..cfg.n_layer {
        let p = |s: &str| format!("blk.{l}.{s}");
        let bias = |s: &str| (!cfg.qwen3).then(|| w(&p(&format!("{s}.bias"))));
        let h = b.rms_norm(x, Some(&w(&p("attn_norm.weight"))), cfg.eps);
        let mut q = b.matmul(h, &w(&p("attn_q.weight")), bias("attn_q").as_ref());
        let mut k = b.matmul(h, &w(&p("attn_k.weight")), bias("attn_k").as_ref());
        let v = b.matmul(h, &w(&p("attn_v.weight")), bias("attn_v").as_ref());
        if cfg.qwen3 {
            let (qn, kn) = (w(&p("attn_q_norm.weight")), w(&p("attn_k_norm.weight")));
            q = b.qk_norm(q, Some(&qn), cfg.hd, cfg.n_head, cfg.eps);
            k = b.qk_norm(k, Some(&kn), cfg.hd, cfg.n_kv, cfg.eps);
        }
        let rope = |n_head| RoPEMeta {
            n_dims: cfg.hd,
            freq_base: 1_000_000.0,
            freq_scale: 1.0,
            n_head,
            hd: cfg.hd,
            style: RopeStyle::NonInterleaved,
            freq_factors: None,
            yarn: None,
        };
        let q = b.rope(q, pos, RopeStyle::NonInterleaved, rope(cfg.n_head));
        let k = b.rope(k, pos, RopeStyle::NonInterleaved, rope(cfg.n_kv));
        b.kvcache_store(l, k, v, cells, cfg.n_ctx, None);
        let kv = b.kvcache_load(l, nkt, cfg.n_ctx, cfg.n_kv, None);
        let meta = AttnMeta {
            layer: l,
            n_head: cfg.n_head,
            n_head_kv: cfg.n_kv,
            hd: cfg.hd,
            scale: 1.0 / (cfg.hd as f32).sqrt(),
            n_ctx: cfg.n_ctx,
            window: None,
            softcap: None,
            ring: None,
            sinks: None,
            causal: true,
        };
        let a = b.attn(q, kv, pos, None, AttnMode::Gqa, meta);
        let o = b.matmul(a, &w(&p("attn_output.weight")), None);
        x = b.add(x, o);
        let h = b.rms_norm(x, Some(&w(&p("ffn_norm.weight"))), cfg.eps);
        let g = b.matmul(h, &w(&p("ffn_gate.weight")), None);
        let u = b.matmul(h, &w(&p("ffn_up.weight")), None);
        let s = b.silu(g);
        let f = b.mul(s, u);
        let d = b.matmul(f, &w(&p("ffn_down.weight")), None);
        x = b.add(x, d);
    }
    let xn = b.rms_norm(x, Some(&w("output_norm.weight")), cfg.eps);
    let last = b.get_rows(xn, tail, [cfg.n_embd, 1, 1, 1]);
    let logits = b.matmul(last, &w("output.weight"), None);
    b.output(logits);
    b.build()
}

/// Inputs of one step: `tokens` at positions (and cells) `start..start + tokens.len()`.
pub fn step_inputs(tokens: &[i32], start: i32) -> Vec<(&'static str, Fill)> {
    let nt = tokens.len() as i32;
    let pos: Vec<i32> = (start..start + nt).collect();
    vec![
        ("tokens", Fill::I32(tokens.to_vec())),
        ("positions", Fill::I32(pos.clone())),
        ("cells", Fill::I32(pos)),
        ("tail", Fill::I32(vec![nt - 1])),
    ]
}

/// Logits of every step, and each layer's final (K, V) regions.
pub type ModelRun = (Vec<Vec<f32>>, Vec<(Vec<f32>, Vec<f32>)>);

/// Prefill `prompt`, then decode `extra` one token at a time; logits of every step and the
/// final KV regions of every layer.
pub fn run_model(
    runner: &mut Runner,
    cfg: &Cfg,
    ws: &[TestWeight],
    prompt: &[i32],
    extra: &[i32],
) -> ModelRun {
    let mut logits = Vec::new();
    let g = model_graph(cfg, ws, prompt.len());
    logits.push(runner.step(g, &step_inputs(prompt, 0)).unwrap().remove(0));
    for (i, &t) in extra.iter().enumerate() {
        let g = model_graph(cfg, ws, 1);
        let start = (prompt.len() + i) as i32;
        logits.push(runner.step(g, &step_inputs(&[t], start)).unwrap().remove(0));
    }
    let kv = (0..cfg.n_layer)
        .map(|l| runner.alloc.copy_kv_to_cpu(l).expect("kv region"))
        .collect();
    (logits, kv)
}
