//! The per-node trace with wgpu in use: a tiny model's prefill and decode steps on a mixed
//! CPU+wgpu graph record every live non-KV node, with statistics that agree with the
//! CPU-only trace of the same tokens within float rounding, and tracing costs no device
//! wait beyond the one each split already has.

mod common;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use minfer_cpu::CpuBackend;
use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::trace::{is_captured, NodeTrace};
use minfer_graph::{
    Backend, BackendImpl, BackendScheduler, CParams, ComputeGraph, FusionPass, GraphAllocator,
    GraphParams, GraphType,
};
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_models::{INPUT_POSITIONS, INPUT_TAIL_IDS, INPUT_TOKEN_IDS};

/// Statistics bound, relative to the node's scale (its largest magnitude, at least 1):
/// the backends round differently (summation order; a Q8 activation level crossed by
/// that difference grows it), as the logits bound of the model tests allows.
const STATS_BOUND: f64 = 3e-2;

/// One traced step: the graph, its captures, the device waits with the trace on and
/// off, and the waits the splits account for.
struct Traced {
    graph: ComputeGraph,
    nodes: Vec<NodeTrace>,
    waits_on: usize,
    waits_off: usize,
    waits_expected: usize,
}

/// Prefill of `prompt` then teacher-forced decode of `decode`, each step run once with
/// the trace off and once with it on (the second stores the same KV rows again), on the
/// CPU alone or with wgpu beside it; `on_cpu` pins op kinds to the CPU for more splits.
fn traced(
    file: &Arc<GgufFile>,
    with_gpu: bool,
    on_cpu: &[&str],
    prompt: &[u32],
    decode: &[u32],
) -> Option<Vec<Traced>> {
    let model = minfer_models::load_model(file).expect("model");
    let mut cpu = CpuBackend::new(2);
    cpu.register_gguf(Arc::clone(file), "")
        .expect("cpu weights");
    let mut backends: Vec<Box<dyn BackendImpl>> = vec![Box::new(cpu)];
    let mut waits = Arc::default();
    if with_gpu {
        let mut g = common::gpu()?;
        g.register_gguf(file, "").expect("wgpu weights");
        waits = g.waits();
        backends.push(Box::new(g));
    }
    let mut alloc = GraphAllocator::new(backends).expect("allocator");
    let fusion = FusionPass::new();
    let mut out = Vec::new();
    let mut pos0 = 0usize;
    for toks in std::iter::once(prompt).chain(decode.chunks(1)) {
        let nt = toks.len();
        let params = GraphParams {
            n_tokens: nt,
            n_out: 1,
            gtype: if nt > 1 {
                GraphType::Prefill
            } else {
                GraphType::Decode
            },
            cparams: CParams {
                n_ctx: 64,
                flash_attn: false,
                gpu: with_gpu,
                fuse_qkv: false,
                fuse_ffn: false,
                explicit_span: false,
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
        if nt > 1 {
            alloc
                .fill_input_u32(&graph, INPUT_TAIL_IDS, &[nt as u32 - 1])
                .expect("tail");
        }
        let w0 = waits.load(Ordering::SeqCst);
        sched.execute(&graph, &mut alloc).expect("execute");
        let waits_off = waits.load(Ordering::SeqCst) - w0;
        sched.set_trace(Some(256));
        let w0 = waits.load(Ordering::SeqCst);
        sched.execute(&graph, &mut alloc).expect("traced execute");
        let waits_on = waits.load(Ordering::SeqCst) - w0;
        // Each wgpu split waits once at its end, and each value a CPU split reads from
        // the device is one readback.
        let splits = sched.split_graph(&graph);
        let on_wgpu = |x: usize| graph.nodes[x].backend == Some(Backend::WGPU);
        let mut read_back: Vec<usize> = splits
            .iter()
            .filter(|s| s.backend != Backend::WGPU)
            .flat_map(|s| s.inputs.iter().copied().filter(|&x| on_wgpu(x)))
            .collect();
        read_back.sort_unstable();
        read_back.dedup();
        let wgpu_splits = splits.iter().filter(|s| s.backend == Backend::WGPU).count();
        out.push(Traced {
            nodes: sched.take_trace(),
            graph,
            waits_on,
            waits_off,
            waits_expected: wgpu_splits + read_back.len(),
        });
        pos0 += nt;
    }
    Some(out)
}

/// The largest difference between two captures of one node, relative to its scale.
fn stats_err(g: &NodeTrace, c: &NodeTrace) -> f64 {
    let scale = f64::from(c.stats.min.abs().max(c.stats.max.abs())).max(1.0);
    let d = [
        f64::from(g.stats.min - c.stats.min),
        f64::from(g.stats.max - c.stats.max),
        g.stats.mean - c.stats.mean,
        g.stats.rms - c.stats.rms,
    ]
    .into_iter()
    .chain(
        g.values
            .iter()
            .zip(&c.values)
            .map(|(a, b)| f64::from(a - b)),
    )
    .fold(0f64, |m, x| m.max(x.abs()));
    d / scale
}

fn check(on_cpu: &[&str]) {
    let spec = TinySpec::qwen2(GgmlType::Q8_0, 7);
    let file = Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap());
    let prompt = [1u32, 17, 300, 42, 5, 99, 7];
    let decode = [11u32, 250];
    let Some(gpu) = traced(&file, true, on_cpu, &prompt, &decode) else {
        return;
    };
    let cpu = traced(&file, false, &[], &prompt, &decode).expect("cpu run");
    let mut worst = 0f64;
    for (i, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
        let what = format!("step {i} cpu-pinned={on_cpu:?}");
        // Every live node but the KV views and stores, in build order.
        let live: Vec<usize> = g
            .graph
            .nodes
            .iter()
            .filter(|n| !g.graph.is_dead(n.id) && is_captured(n))
            .map(|n| n.id)
            .collect();
        let ids: Vec<usize> = g.nodes.iter().map(|n| n.id).collect();
        assert_eq!(ids, live, "{what}: every live non-KV node, in order");
        let backends: Vec<Backend> = ids
            .iter()
            .filter_map(|&id| g.graph.nodes[id].backend)
            .collect();
        assert!(
            backends.contains(&Backend::WGPU) && backends.contains(&Backend::CPU),
            "{what}: nodes of both backends recorded"
        );
        assert_eq!(
            g.waits_on, g.waits_off,
            "{what}: the trace adds no device wait"
        );
        assert_eq!(
            g.waits_on, g.waits_expected,
            "{what}: one wait per wgpu split plus one per value read back"
        );
        assert!(c.waits_on == 0 && c.waits_off == 0);
        let by_name: HashMap<&str, &NodeTrace> = c
            .nodes
            .iter()
            .map(|n| (c.graph.nodes[n.id].name.as_str(), n))
            .collect();
        let mut matched = 0;
        for gn in &g.nodes {
            let name = g.graph.nodes[gn.id].name.as_str();
            let Some(cn) = by_name.get(name) else {
                continue;
            };
            assert_eq!(
                (gn.n, gn.stride, gn.dtype, gn.values.len()),
                (cn.n, cn.stride, cn.dtype, cn.values.len()),
                "{what}: {name}"
            );
            assert_eq!(
                (gn.stats.nan, gn.stats.inf),
                (cn.stats.nan, cn.stats.inf),
                "{what}: {name}"
            );
            let e = stats_err(gn, cn);
            assert!(
                e <= STATS_BOUND,
                "{what}: {name} statistics differ by {e:e} (bound {STATS_BOUND:e}): wgpu {:?} cpu {:?}",
                gn.stats,
                cn.stats
            );
            worst = worst.max(e);
            matched += 1;
        }
        assert_eq!(
            matched,
            c.nodes.len(),
            "{what}: every CPU node has its twin"
        );
        eprintln!(
            "{what}: {} nodes, {} device waits, worst statistics error {worst:.2e}",
            ids.len(),
            g.waits_on
        );
    }
}

#[test]
fn a_mixed_cpu_and_wgpu_graph_traces_every_node_as_the_cpu_does() {
    check(&[]);
}

#[test]
fn more_splits_trace_the_same_with_no_extra_wait() {
    check(&["rms_norm", "swiglu"]);
}
