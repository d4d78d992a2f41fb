//! Shared by the wgpu integration tests: the device, a CPU reference, weights in a
//! real in-memory GGUF file, and a runner that executes one node on a backend.

#![allow(dead_code)]

use std::sync::Arc;

use minfer_cpu::CpuBackend;
use minfer_gguf::quant::quantize_to_vec;
use minfer_gguf::{GgmlType, GgufFile, GgufWriter};
use minfer_graph::{
    Backend, BackendImpl, BackendScheduler, BufRef, CNode, CParams, DType, FusionPass,
    GraphAllocator, GraphParams, GraphType, NodeMeta, Op,
};
use minfer_models::{
    ModelDef, INPUT_CELLS, INPUT_POSITIONS, INPUT_SPAN, INPUT_TAIL_IDS, INPUT_TOKEN_IDS,
};
use minfer_wgpu::WgpuBackend;

/// The wgpu backend on any adapter, CPU emulation included (tests name it explicitly).
///
/// No adapter is a failure, never a silent skip: CI installs lavapipe. Only the
/// explicit opt-out (`MINFER_WGPU_TESTS=skip`) returns `None`, and it says so.
pub fn gpu() -> Option<WgpuBackend> {
    minfer_wgpu::testing::gpu()
}

/// Integers stored as f32 bit patterns, as index inputs are.
pub fn ints(v: &[i32]) -> Vec<f32> {
    v.iter().map(|&i| f32::from_bits(i as u32)).collect()
}

/// One weight of a test file: name, type, GGUF dims and f32 values to quantize.
pub struct W {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
    pub values: Vec<f32>,
}

/// A real GGUF image holding `weights`, quantized by the project's own quantizers.
pub fn gguf(weights: &[W]) -> Arc<GgufFile> {
    let mut w = GgufWriter::new();
    for x in weights {
        let bytes = quantize_to_vec(x.ty, &x.values).expect("quantize test weight");
        w.add_tensor_bytes(&x.name, &x.dims, x.ty, bytes)
            .expect("add test tensor");
    }
    Arc::new(GgufFile::from_bytes(w.to_bytes().expect("serialize")).expect("parse"))
}

/// Both backends with the same weights registered.
pub fn pair(weights: &[W]) -> Option<(WgpuBackend, CpuBackend)> {
    let mut g = gpu()?;
    let file = gguf(weights);
    let mut c = CpuBackend::new(2);
    c.register_gguf(Arc::clone(&file), "").expect("cpu weights");
    g.register_gguf(&file, "").expect("wgpu weights");
    Some((g, c))
}

/// A node with sources `0..n_src` (the runner binds them positionally).
pub fn node(op: Op, n_src: usize, out_shape: [usize; 4], meta: NodeMeta) -> CNode {
    CNode {
        id: n_src,
        name: format!("test.{}", op.name()),
        op,
        src: (0..n_src).collect(),
        out_shape,
        out_dtype: DType::F32,
        backend: None,
        meta,
    }
}

/// A source of a single-node run.
pub enum Src {
    /// Host values written into a fresh buffer.
    Data(Vec<f32>),
    /// The KV view placeholder (attention's second source).
    KvView,
    /// The output buffer itself (an in-place node).
    Output(Vec<f32>),
}

/// What a single-node run leaves behind.
#[derive(Debug)]
pub struct Ran {
    pub out: Vec<f32>,
    pub kv: Option<(Vec<f32>, Vec<f32>)>,
}

/// Executes `node` once on `b`: sources written, KV regions (when given) filled, then
/// the output (or, for a KV store, the regions) read back.
pub fn run(
    b: &mut dyn BackendImpl,
    node: &CNode,
    srcs: &[Src],
    kv: Option<(&[f32], &[f32])>,
) -> Result<Ran, minfer_graph::BackendError> {
    let me = b.id();
    let kv_ids = match kv {
        Some((k, v)) => {
            let (ki, vi) = (b.alloc_fresh(k.len()), b.alloc_fresh(v.len()));
            b.write_host(ki, k)?;
            b.write_host(vi, v)?;
            Some((ki, vi))
        }
        None => None,
    };
    let n = node.n_elements();
    let mut out = None;
    let mut in_bufs = Vec::new();
    for s in srcs {
        let id = match s {
            Src::Data(d) => {
                let id = b.alloc_buffer(d.len());
                b.write_host(id, d)?;
                id
            }
            Src::KvView => kv_ids.map(|p| p.0).ok_or("KV view without regions")?,
            Src::Output(d) => {
                let id = b.alloc_buffer(d.len());
                b.write_host(id, d)?;
                out = Some(id);
                id
            }
        };
        in_bufs.push(BufRef { backend: me, id });
    }
    let is_store = matches!(node.op, Op::KvcacheStore { .. });
    let out = match (is_store, out) {
        (true, _) => kv_ids.map(|p| p.0).ok_or("KV store without regions")?,
        (false, Some(o)) => o,
        (false, None) => b.alloc_buffer(n),
    };
    b.execute_node(
        node,
        &in_bufs,
        BufRef {
            backend: me,
            id: out,
        },
        kv_ids,
    )?;
    b.synchronize();
    let mut o = b.copy_to_host(out).ok_or("output readback failed")?;
    o.truncate(n);
    let kv = match kv_ids {
        Some((k, v)) => Some((
            b.copy_to_host(k).ok_or("K readback failed")?,
            b.copy_to_host(v).ok_or("V readback failed")?,
        )),
        None => None,
    };
    Ok(Ran { out: o, kv })
}

/// Max absolute difference relative to the reference's scale (at least 1).
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let mut e = 0.0f32;
    for (a, b) in got.iter().zip(want) {
        assert!(a.is_finite(), "non-finite output {a} (reference {b})");
        e = e.max((a - b).abs());
    }
    e / scale
}

/// Runs `node` on both backends and checks the wgpu output against the CPU's within
/// `bound` (max abs error relative to the output scale). Returns the measured error.
pub fn check(
    g: &mut WgpuBackend,
    c: &mut CpuBackend,
    node: &CNode,
    srcs: &[Src],
    kv: Option<(&[f32], &[f32])>,
    bound: f32,
    what: &str,
) -> f32 {
    let want = run(c, node, srcs, kv).unwrap_or_else(|e| panic!("{what}: cpu: {e}"));
    let got = run(g, node, srcs, kv).unwrap_or_else(|e| panic!("{what}: wgpu: {e}"));
    let mut err = rel_err(&got.out, &want.out);
    if let (Some((gk, gv)), Some((ck, cv))) = (&got.kv, &want.kv) {
        err = err.max(rel_err(gk, ck)).max(rel_err(gv, cv));
    }
    assert!(
        err <= bound,
        "{what}: error {err:e} above the bound {bound:e}"
    );
    eprintln!("{what}: error {err:.2e} (bound {bound:.0e})");
    err
}

/// Logits of one step and the split count of its graph.
pub struct Step {
    pub logits: Vec<f32>,
    pub splits: usize,
    /// Wall time of the step: graph build, assignment, allocation, execution, readback.
    pub time: std::time::Duration,
    /// Decode QKV fusion nodes (`fused_qkv`, `fused_qkv_norm`) the graph ran on wgpu.
    pub fused_qkv: usize,
}

/// Runs prefill of `prompt` (logits of its last `prompt_rows` tokens) then decode of
/// `decode` one token at a time (teacher forced), each step a fresh graph over the
/// allocator's persistent KV, on the CPU alone or with wgpu beside it. `on_cpu` names
/// op kinds pinned to the CPU before assignment, to force extra splits.
#[allow(clippy::too_many_arguments)]
pub fn run_model(
    model: &dyn ModelDef,
    file: &std::sync::Arc<GgufFile>,
    with_gpu: bool,
    explicit_span: bool,
    on_cpu: &[&str],
    prompt: &[u32],
    prompt_rows: usize,
    decode: &[u32],
) -> Option<Vec<Step>> {
    run_model_fused(
        model,
        file,
        with_gpu,
        explicit_span,
        on_cpu,
        prompt,
        prompt_rows,
        decode,
        false,
    )
}

/// [`run_model`] with the decode QKV fusion flag (`CParams::fuse_qkv`) as given.
#[allow(clippy::too_many_arguments)]
pub fn run_model_fused(
    model: &dyn ModelDef,
    file: &std::sync::Arc<GgufFile>,
    with_gpu: bool,
    explicit_span: bool,
    on_cpu: &[&str],
    prompt: &[u32],
    prompt_rows: usize,
    decode: &[u32],
    fuse_qkv: bool,
) -> Option<Vec<Step>> {
    let mut cpu = CpuBackend::new(2);
    cpu.register_gguf(std::sync::Arc::clone(file), "")
        .expect("cpu weights");
    let mut backends: Vec<Box<dyn BackendImpl>> = vec![Box::new(cpu)];
    if with_gpu {
        let mut g = gpu()?;
        g.register_gguf(file, "").expect("wgpu weights");
        backends.push(Box::new(g));
    }
    let mut alloc = GraphAllocator::new(backends).expect("allocator");
    let fusion = FusionPass::new();
    let n_ctx = (prompt.len() + decode.len()).next_power_of_two().max(64);
    let mut steps = Vec::new();
    let mut pos0 = 0usize;
    let chunks: Vec<&[u32]> = std::iter::once(prompt).chain(decode.chunks(1)).collect();
    for toks in chunks {
        let nt = toks.len();
        let t0 = std::time::Instant::now();
        let n_out = if pos0 == 0 {
            prompt_rows.clamp(1, nt)
        } else {
            1
        };
        let params = GraphParams {
            n_tokens: nt,
            n_out,
            gtype: if nt > 1 {
                GraphType::Prefill
            } else {
                GraphType::Decode
            },
            cparams: CParams {
                n_ctx,
                flash_attn: false,
                gpu: with_gpu,
                fuse_qkv,
                fuse_ffn: false,
                explicit_span,
                ring: None,
                embeddings: false,
                rank: false,
                state_slots: 1,
                delta_chunk: 0,
            },
            weights_version: 1,
        };
        let mut graph = model.build_graph(&params);
        for n in &mut graph.nodes {
            if on_cpu.contains(&n.op.name()) {
                n.backend = Some(Backend::CPU);
            }
        }
        let mut sched = BackendScheduler::new();
        sched.assign_backends(&mut graph, &alloc);
        fusion.run(&mut graph, &alloc);
        alloc.alloc_graph(&graph).expect("alloc");
        let positions: Vec<u32> = (pos0..pos0 + nt).map(|p| p as u32).collect();
        alloc
            .fill_input_u32(&graph, INPUT_TOKEN_IDS, toks)
            .expect("tokens");
        alloc
            .fill_input_u32(&graph, INPUT_POSITIONS, &positions)
            .expect("positions");
        if n_out < nt {
            let tail: Vec<u32> = ((nt - n_out) as u32..nt as u32).collect();
            alloc
                .fill_input_u32(&graph, INPUT_TAIL_IDS, &tail)
                .expect("tail");
        }
        if explicit_span {
            let spans: Vec<u32> = positions.iter().flat_map(|&p| [0, p + 1]).collect();
            alloc
                .fill_input_u32(&graph, INPUT_SPAN, &spans)
                .expect("span");
            alloc
                .fill_input_u32(&graph, INPUT_CELLS, &positions)
                .expect("cells");
        }
        sched.execute(&graph, &mut alloc).expect("execute");
        let mut logits = Vec::new();
        assert!(
            alloc.read_into(graph.outputs[0], &mut logits),
            "logits readable"
        );
        let splits = sched.split_graph(&graph).len();
        if with_gpu && on_cpu.is_empty() {
            let on_gpu = graph
                .nodes
                .iter()
                .filter(|n| n.backend == Some(Backend::WGPU))
                .count();
            assert!(
                on_gpu > graph.nodes.len() / 2,
                "most nodes run on wgpu ({on_gpu})"
            );
        }
        let fused_qkv = graph
            .nodes
            .iter()
            .filter(|n| {
                n.backend == Some(Backend::WGPU)
                    && matches!(n.op, Op::FusedQKV { .. } | Op::FusedQkvNorm { .. })
            })
            .count();
        steps.push(Step {
            logits,
            splits,
            time: t0.elapsed(),
            fused_qkv,
        });
        pos0 += nt;
    }
    Some(steps)
}
