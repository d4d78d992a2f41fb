//! The wgpu backend plugged into the engine through this build's table, on tiny models:
//! the fence keeps the CPU as the host, a node whose weight type the shaders do not
//! decode is placed on the CPU by capability, and the engine reports the adapter.
//! Needs an adapter (CI: Mesa's lavapipe); without one these tests fail, unless
//! `MINFER_WGPU_TESTS=skip` skips them explicitly.

#![cfg(feature = "wgpu")]

use std::sync::Arc;

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::{Backend, NodeMeta, Op, WeightType};
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::testing::rel_err;
use minfer_runtime::{Engine, EngineOptions, KvType};

fn file(spec: &TinySpec) -> Arc<GgufFile> {
    Arc::new(GgufFile::from_bytes(tiny_model_bytes(spec).expect("writer")).expect("reader"))
}

fn opts(backend: &str) -> EngineOptions {
    EngineOptions {
        n_threads: 2,
        n_ctx: Some(64),
        backend: Some(backend.to_string()),
        ..EngineOptions::default()
    }
}

/// Prefill of a short prompt, then two decode steps: every logits row.
fn logits(e: &mut Engine) -> Vec<f32> {
    let prompt = [3u32, 17, 5, 42, 9];
    let mut out = e.forward(&prompt, 0, prompt.len()).expect("prefill");
    out.extend(e.forward(&[11], 5, 1).expect("decode"));
    out.extend(e.forward(&[7], 6, 1).expect("decode"));
    out
}

#[test]
fn the_wgpu_fence_keeps_the_cpu_as_host_and_the_cpu_fence_excludes_wgpu() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let f = file(&TinySpec::qwen2(GgmlType::Q8_0, 75));
    let mut g = Engine::from_arc(Arc::clone(&f), &opts("wgpu")).expect("wgpu engine");
    let info = g.backend_info();
    let names: Vec<&str> = info.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["wgpu", "cpu"], "wgpu first, the CPU as host");
    assert!(info[0].gpu && !info[1].gpu);
    let adapter = info[0].device.as_ref().expect("the adapter is named");
    assert!(!adapter.name.is_empty() && !adapter.api.is_empty());
    assert!(info[1].device.is_none());
    assert!(g.backend_caps().gpu && g.params(1, 1).expect("params").cparams.gpu);
    // f32 KV and every tensor decoded: the decode QKV fusion runs here.
    assert!(g.params(1, 1).expect("params").cparams.fuse_qkv);
    // Inputs stay on the host, the rest runs on the device.
    let graph = g.preview_graph(1, 1).expect("graph");
    for n in &graph.nodes {
        let want = if matches!(n.op, Op::Input) {
            Backend::CPU
        } else {
            Backend::WGPU
        };
        assert_eq!(
            n.backend,
            Some(want),
            "#{} {} ({})",
            n.id,
            n.name,
            n.op.name()
        );
    }
    let mut c = Engine::from_arc(f, &opts("cpu")).expect("cpu engine");
    let names: Vec<String> = c.backend_info().into_iter().map(|b| b.name).collect();
    assert_eq!(names, ["cpu"]);
    assert!(!c.backend_caps().gpu);
    let err = rel_err(&logits(&mut g), &logits(&mut c));
    eprintln!("tiny Q8_0 model: wgpu against the CPU, relative error {err:.2e}");
    // Same Q8 activation levels on both; float order differs (amplified by roundings).
    assert!(err < 2e-2, "relative error {err:e}");
}

#[test]
fn a_weight_type_the_shaders_do_not_decode_runs_on_the_cpu_by_capability() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    // Q5_K weights: the CPU decodes them, no wgpu shader does.
    let f = file(&TinySpec::qwen3_kquant(GgmlType::Q5K, 57));
    let mut g = Engine::from_arc(Arc::clone(&f), &opts("wgpu")).expect("wgpu engine");
    let graph = g.preview_graph(1, 1).expect("graph");
    let (mut q5k_on_cpu, mut on_wgpu) = (0, 0);
    for n in &graph.nodes {
        let q5k = match &n.meta {
            NodeMeta::MatMul(m) => m.wtype == WeightType::Q5_K,
            NodeMeta::Embed(m) => m.wtype == WeightType::Q5_K,
            _ => false,
        };
        if q5k {
            assert_eq!(n.backend, Some(Backend::CPU), "#{} {}", n.id, n.name);
            q5k_on_cpu += 1;
        } else if n.backend == Some(Backend::WGPU) {
            on_wgpu += 1;
        }
    }
    assert!(q5k_on_cpu > 0 && on_wgpu > 0, "{q5k_on_cpu} / {on_wgpu}");
    // Q5_K attention weights: no fused QKV node would run here, so none is built.
    assert!(!g.params(1, 1).expect("params").cparams.fuse_qkv);
    let mut c = Engine::from_arc(f, &opts("cpu")).expect("cpu engine");
    let err = rel_err(&logits(&mut g), &logits(&mut c));
    eprintln!("tiny Q5_K model split across wgpu and the CPU: relative error {err:.2e}");
    assert!(err < 2e-2, "relative error {err:e}");
}

#[test]
fn gemma_models_run_their_terms_on_wgpu() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    // Gemma's terms have shaders: the embedding scale, GELU and GeGLU (Gemma 3), the
    // final-logit soft-cap and the soft-capped attention (Gemma 2) run on the device,
    // like the windowed attention, except where a layer's KV is a ring (no shader maps
    // rows onto one: those layers' attention and KV stay on the CPU).
    for spec in [
        TinySpec::gemma3(GgmlType::F32, 8),
        TinySpec::gemma2(GgmlType::F32, 5),
    ] {
        let f = file(&spec);
        let mut g = Engine::from_arc(Arc::clone(&f), &opts("wgpu")).expect("wgpu engine");
        for (nt, n_out) in [(4, 1), (1, 1)] {
            let graph = g.preview_graph(nt, n_out).expect("graph");
            // Per kind: the scale, GeGLU, the logit cap, capped attention on the device.
            let mut placed = [0usize; 4];
            for n in graph.nodes.iter().filter(|n| !graph.is_dead(n.id)) {
                let ringed = matches!(&n.meta, NodeMeta::Attn(m) if m.ring.is_some());
                let capped = matches!(&n.meta, NodeMeta::Attn(m) if m.softcap.is_some());
                let kind = match n.op {
                    Op::Scale(_) => Some(0),
                    Op::GeGLU | Op::Gelu => Some(1),
                    Op::SoftCap(_) => Some(2),
                    Op::Attn { .. } if capped && !ringed => Some(3),
                    _ => None,
                };
                if kind.is_some() || matches!(n.op, Op::MatMul { .. }) {
                    assert_eq!(n.backend, Some(Backend::WGPU), "#{} {}", n.id, n.name);
                }
                if let Some(k) = kind {
                    placed[k] += 1;
                }
            }
            let gemma2 = usize::from(spec.arch == "gemma2");
            assert!(
                placed[0] == 1 && placed[1] > 0 && placed[2] == gemma2 && placed[3] >= gemma2,
                "{} nt={nt}: scale, GeGLU, logit cap, capped attention: {placed:?}",
                spec.arch
            );
        }
        assert_matches_the_cpu(&mut g, f, spec.arch);
    }
}

/// The wgpu engine `g`'s logits are within 1e-3 (relative) of a CPU engine's on `f`.
fn assert_matches_the_cpu(g: &mut Engine, f: Arc<GgufFile>, arch: &str) {
    let mut c = Engine::from_arc(f, &opts("cpu")).expect("cpu engine");
    let err = rel_err(&logits(g), &logits(&mut c));
    eprintln!("tiny {arch}: wgpu and the CPU against the CPU, relative error {err:.2e}");
    assert!(err < 1e-3, "{arch}: relative error {err:e}");
}

#[test]
fn moe_models_route_experts_on_the_cpu_and_gate_the_shared_expert_on_wgpu() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    // No shader routes experts: the router's softmax and top-k, the expert products and
    // their weighted sum run on the CPU as splits. Qwen2-MoE's shared-expert gate has a
    // shader, and so does everything else of both models.
    for spec in [
        TinySpec::qwen3moe(GgmlType::F32, 21),
        TinySpec::qwen2moe(GgmlType::F32, 22),
    ] {
        let f = file(&spec);
        let mut g = Engine::from_arc(Arc::clone(&f), &opts("wgpu")).expect("wgpu engine");
        let graph = g.preview_graph(4, 1).expect("graph");
        let mut gates = 0;
        for n in graph.nodes.iter().filter(|n| !graph.is_dead(n.id)) {
            let routing = matches!(
                n.op,
                Op::Softmax { .. }
                    | Op::TopK { .. }
                    | Op::MulMatId
                    | Op::MulMatIdSwiGLU
                    | Op::MoeSum { .. }
            );
            if routing {
                assert_eq!(n.backend, Some(Backend::CPU), "#{} {}", n.id, n.name);
            }
            if matches!(n.op, Op::MulSigmoid | Op::MatMul { .. }) {
                assert_eq!(n.backend, Some(Backend::WGPU), "#{} {}", n.id, n.name);
                gates += usize::from(n.op == Op::MulSigmoid);
            }
        }
        assert_eq!(gates > 0, spec.arch == "qwen2moe", "{}: {gates}", spec.arch);
        assert_matches_the_cpu(&mut g, f, spec.arch);
    }
}

#[test]
fn a_packed_kv_format_keeps_the_kv_and_attention_on_the_cpu() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let f = file(&TinySpec::qwen2(GgmlType::Q8_0, 75));
    let packed = EngineOptions {
        cache_type_k: KvType::F16,
        ..opts("wgpu")
    };
    let mut g = Engine::from_arc(Arc::clone(&f), &packed).expect("wgpu engine");
    let graph = g.preview_graph(1, 1).expect("graph");
    for n in &graph.nodes {
        if matches!(
            n.op,
            Op::KvcacheStore { .. } | Op::KvcacheLoad { .. } | Op::Attn { .. }
        ) {
            assert_eq!(n.backend, Some(Backend::CPU), "#{} {}", n.id, n.name);
        }
    }
    assert!(graph.nodes.iter().any(|n| n.backend == Some(Backend::WGPU)));
    // A fused QKV node would store into the KV the backend does not hold.
    assert!(!g.params(1, 1).expect("params").cparams.fuse_qkv);
    let mut c = Engine::from_arc(
        f,
        &EngineOptions {
            cache_type_k: KvType::F16,
            ..opts("cpu")
        },
    )
    .expect("cpu engine");
    let err = rel_err(&logits(&mut g), &logits(&mut c));
    assert!(err < 2e-2, "relative error {err:e}");
}

/// Pool buffers of the capped wgpu backend, in f32s: below a 40-row logits output of
/// the tiny vocabulary (40 x 512), above every other buffer of that prefill (its
/// widest is the FFN's 40 x 256).
const CAP: usize = 40 * 512 - 1;

/// The wgpu backend holding no buffer above [`CAP`] f32s, as a device whose limit is
/// smaller than one many-row output.
fn capped_wgpu(
    cfg: &minfer_graph::BackendConfig,
) -> Result<Box<dyn minfer_graph::BackendImpl>, String> {
    let mut b = minfer_wgpu::WgpuBackend::probe(true).map_err(|e| e.reason)?;
    b.set_kv_types(cfg.kv_types);
    b.cap_buffer_elems(CAP);
    Ok(Box::new(b))
}

const CAPPED_WGPU: minfer_graph::BackendFactory = minfer_graph::BackendFactory {
    create: capped_wgpu,
    ..minfer_wgpu::FACTORY
};

#[test]
fn an_output_past_the_device_buffer_limit_runs_on_the_cpu_from_allocation() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let f = file(&TinySpec::qwen2(GgmlType::Q8_0, 75));
    let factories = [minfer_cpu::FACTORY, CAPPED_WGPU];
    let mut g = Engine::with_factories(Arc::clone(&f), &opts("wgpu"), &factories).expect("wgpu");
    let info = g.backend_info();
    let dev = info[0].device.as_ref().expect("the adapter is named");
    // The adapter's own limits are requested and reported.
    let binding = dev.max_binding_bytes.expect("binding limit");
    assert!(binding >= 128 << 20 && dev.max_buffer_bytes >= Some(binding));
    let prompt: Vec<u32> = (0..40).map(|i| 3 + (i * 37) % 500).collect();
    // Every row out (as n_probs over a prompt): the head's 40 x 512 output exceeds the
    // cap, so it and nothing else leaves the device, at placement.
    let graph = g.preview_graph(prompt.len(), prompt.len()).expect("graph");
    let largest = |n: &minfer_graph::CNode| {
        n.src
            .iter()
            .map(|&s| graph.nodes[s].n_elements())
            .chain([n.n_elements()])
            .max()
            .unwrap_or(0)
    };
    let head = graph.outputs[0];
    assert!(graph.nodes[head].n_elements() > CAP);
    assert_eq!(graph.nodes[head].backend, Some(Backend::CPU));
    for n in graph.nodes.iter().filter(|n| !matches!(n.op, Op::Input)) {
        let want = if largest(n) > CAP {
            Backend::CPU
        } else {
            Backend::WGPU
        };
        assert_eq!(
            n.backend,
            Some(want),
            "#{} {} ({})",
            n.id,
            n.name,
            n.op.name()
        );
    }
    // One row out fits: the head stays on the device.
    let one = g.preview_graph(prompt.len(), 1).expect("graph");
    assert_eq!(one.nodes[one.outputs[0]].backend, Some(Backend::WGPU));
    let mut c = Engine::from_arc(f, &opts("cpu")).expect("cpu engine");
    let got = g.forward(&prompt, 0, prompt.len()).expect("wgpu prefill");
    let want = c.forward(&prompt, 0, prompt.len()).expect("cpu prefill");
    let err = rel_err(&got, &want);
    eprintln!("tiny Q8_0 model, head over the buffer cap on the CPU: relative error {err:.2e}");
    assert!(err < 2e-2, "relative error {err:e}");
}

/// Greedy decode of `n` steps from `logits` at `pos`: every logits row's bits.
fn greedy_bits(e: &mut Engine, mut logits: Vec<f32>, mut pos: usize, n: usize) -> Vec<Vec<u32>> {
    let mut rows = Vec::new();
    for _ in 0..n {
        rows.push(logits.iter().map(|x| x.to_bits()).collect());
        let t = minfer_runtime::sampling::argmax(&logits);
        logits = e.forward(&[t], pos, 1).expect("decode");
        pos += 1;
    }
    rows
}

#[test]
fn a_session_saved_with_the_kv_on_wgpu_continues_bit_for_bit_after_loading() {
    if !minfer_wgpu::testing::adapter_or_skip() {
        return;
    }
    let f = file(&TinySpec::qwen2(GgmlType::Q8_0, 75));
    let prompt = [3u32, 17, 5, 42, 9];
    let (kept, more) = (3, 4);
    let engine = || Engine::from_arc(Arc::clone(&f), &opts("wgpu")).expect("wgpu engine");
    // Prefill, `kept` decode steps: the history the KV holds, and the next logits.
    let run_to = |e: &mut Engine| {
        let mut hist = prompt.to_vec();
        let mut logits = e.prefill(&hist, 0).expect("prefill");
        for _ in 0..kept {
            let t = minfer_runtime::sampling::argmax(&logits);
            logits = e.forward(&[t], hist.len(), 1).expect("decode");
            hist.push(t);
        }
        (hist, logits)
    };
    let mut straight = engine();
    let graph = straight.preview_graph(1, 1).expect("graph");
    assert!(
        graph
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::KvcacheStore { .. }))
            .all(|n| n.backend == Some(Backend::WGPU)),
        "the KV regions live on the device"
    );
    let (_, logits) = run_to(&mut straight);
    let want = greedy_bits(&mut straight, logits, prompt.len() + kept, more);

    let dir = std::env::temp_dir().join(format!("minfer-wgpu-session-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("s.kv");
    let mut first = engine();
    let (hist, _) = run_to(&mut first);
    minfer_runtime::session::save(&mut first, &hist, &path).expect("save with the KV on wgpu");
    drop(first);
    let mut second = engine();
    let restored = minfer_runtime::session::load(&mut second, &path);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(restored.expect("load onto wgpu"), hist);
    // The last stored token's logits come from running it again at its position.
    let last = *hist.last().expect("history");
    let logits = second
        .forward(&[last], hist.len() - 1, 1)
        .expect("rerun the last token");
    let got = greedy_bits(&mut second, logits, hist.len(), more);
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the restored session's continuation differs");
}
