//! Whole tiny-model graphs with every op the wgpu backend claims placed on it and the
//! rest on the CPU, against the all-CPU run: prefill, then decode steps over the KV
//! the prefill left on the device, in the causal and the explicit-span forms.

mod common;

use common::run_model;
use minfer_gguf::{GgmlType, GgufFile};
use minfer_models::testing::{tiny_model_bytes, TinySpec};

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
        .0
}

/// Logits bound: max abs error relative to the logits' scale. Both backends round
/// quantized matmuls' activations to the same Q8 levels; float summation order differs,
/// and a difference that moves an activation across a rounding boundary grows.
const LOGITS_BOUND: f32 = 3e-2;

fn compare(spec: &TinySpec, explicit_span: bool, on_cpu: &[&str], min_splits: usize) {
    let bytes = tiny_model_bytes(spec).expect("tiny model");
    let file = std::sync::Arc::new(GgufFile::from_bytes(bytes).expect("parse"));
    let model = minfer_models::load_model(&file).expect("model");
    let prompt = [1u32, 17, 300, 42, 5, 99, 7];
    let decode = [11u32, 250, 3];
    let Some(gpu) = run_model(
        &*model,
        &file,
        true,
        explicit_span,
        on_cpu,
        &prompt,
        1,
        &decode,
    ) else {
        return;
    };
    let cpu = run_model(
        &*model,
        &file,
        false,
        explicit_span,
        &[],
        &prompt,
        1,
        &decode,
    )
    .expect("cpu run");
    let mut top1_checked = 0;
    for (i, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
        let what = format!(
            "{} {} step {i} span={explicit_span} cpu-pinned={on_cpu:?}",
            spec.arch, spec.wtype
        );
        let e = common::rel_err(&g.logits, &c.logits);
        eprintln!("{what}: {} splits, logits error {e:.2e}", g.splits);
        assert!(
            e <= LOGITS_BOUND,
            "{what}: logits error {e:e} above {LOGITS_BOUND:e}"
        );
        // Top-1 must agree wherever the CPU's lead over its runner-up exceeds what the
        // two backends may differ by (twice the bound, in logits units).
        let scale = c.logits.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let top = argmax(&c.logits);
        let runner_up = c
            .logits
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != top)
            .fold(f32::NEG_INFINITY, |m, (_, &v)| m.max(v));
        if c.logits[top] - runner_up > 2.0 * LOGITS_BOUND * scale {
            assert_eq!(argmax(&g.logits), top, "{what}: top-1 differs");
            top1_checked += 1;
        }
        assert!(
            g.splits >= min_splits,
            "{what}: {} splits, expected at least {min_splits}",
            g.splits
        );
    }
    eprintln!(
        "{} {}: top-1 checked on {top1_checked} of {} steps",
        spec.arch,
        spec.wtype,
        cpu.len()
    );
    assert!(
        top1_checked > 0,
        "no step had a clear enough top-1 to compare"
    );
}

#[test]
fn qwen2_on_wgpu_matches_the_cpu_in_both_attention_forms() {
    for ty in [GgmlType::Q8_0, GgmlType::F16] {
        let spec = TinySpec::qwen2(ty, 75);
        // Inputs stay on the CPU (host-filled), everything else runs on wgpu.
        compare(&spec, false, &[], 2);
        compare(&spec, true, &[], 2);
    }
}

#[test]
fn qwen3_kquants_on_wgpu_match_the_cpu() {
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q5_0] {
        compare(&TinySpec::qwen3_kquant(ty, 57), false, &[], 2);
    }
}

/// A whole model in the IQ4 types, whose matmuls and embedding run in the wgpu shaders.
#[test]
fn qwen3_iq4_on_wgpu_matches_the_cpu() {
    for ty in [GgmlType::Iq4Nl, GgmlType::Iq4Xs] {
        compare(&TinySpec::qwen3_kquant(ty, 57), false, &[], 2);
    }
}

/// The decode QKV fusions (`fused_qkv` with Qwen2's biases, `fused_qkv_norm` with
/// Qwen3's per-head norms) against the unfused chain on the same backend: the same
/// kernels over the same values, so every logits row is bit-identical, and the
/// KV rows the fused nodes stored serve the later steps as the unfused stores did.
#[test]
fn decode_qkv_fusions_are_bit_identical_to_the_unfused_chain_on_wgpu() {
    for spec in [
        TinySpec::qwen2(GgmlType::Q8_0, 75),
        TinySpec::qwen3_kquant(GgmlType::Q4K, 57),
        TinySpec::qwen3_kquant(GgmlType::Q6K, 57),
    ] {
        let file =
            std::sync::Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap());
        let model = minfer_models::load_model(&file).unwrap();
        let (prompt, decode) = ([3u32, 9, 27, 81, 5], [243u32, 8, 40, 2]);
        let run = |fuse| {
            common::run_model_fused(&*model, &file, true, false, &[], &prompt, 1, &decode, fuse)
        };
        let Some(fused) = run(true) else { return };
        let plain = run(false).unwrap();
        let what = format!("{} {}", spec.arch, spec.wtype);
        // The prefill is never fused; every decode step is, once per layer.
        assert_eq!(fused[0].fused_qkv, 0, "{what}: prefill");
        for (i, (f, p)) in fused.iter().zip(&plain).enumerate() {
            if i > 0 {
                assert!(
                    f.fused_qkv > 0,
                    "{what} step {i}: no fused QKV node on wgpu"
                );
            }
            assert_eq!(p.fused_qkv, 0);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&f.logits) == bits(&p.logits),
                "{what} step {i}: fused logits differ from the unfused chain's"
            );
        }
        eprintln!(
            "{what}: {} decode steps, {} fused QKV nodes each, bit-identical",
            decode.len(),
            fused[1].fused_qkv
        );
    }
}

#[test]
fn a_graph_cut_into_many_wgpu_and_cpu_splits_matches_the_cpu() {
    // Norms, adds and the FFN activation on the CPU, the rest on wgpu: every layer
    // crosses the boundary several times in both directions.
    let pinned = ["rms_norm", "add", "swiglu", "silu", "mul"];
    compare(&TinySpec::qwen2(GgmlType::Q8_0, 75), false, &pinned, 8);
    compare(&TinySpec::qwen3_kquant(GgmlType::Q4K, 57), true, &pinned, 8);
    // The pinned ops are f32 on both backends, so staging alone may not move the
    // logits: against the unsplit wgpu run the bound is float noise.
    let spec = TinySpec::qwen3_kquant(GgmlType::Q4K, 57);
    let file = std::sync::Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap());
    let model = minfer_models::load_model(&file).unwrap();
    let (prompt, decode) = ([3u32, 9, 27, 81], [243u32, 8]);
    let Some(split) = run_model(&*model, &file, true, false, &pinned, &prompt, 1, &decode) else {
        return;
    };
    let whole = run_model(&*model, &file, true, false, &[], &prompt, 1, &decode).unwrap();
    for (a, b) in split.iter().zip(&whole) {
        let e = common::rel_err(&a.logits, &b.logits);
        assert!(e <= 1e-5, "split vs unsplit wgpu: error {e:e}");
    }
}

#[test]
fn a_reused_decode_graph_is_bit_identical_and_allocates_nothing_new() {
    use minfer_graph::{BackendImpl, BackendScheduler, CParams, GraphAllocator, GraphParams};
    use minfer_models::{INPUT_POSITIONS, INPUT_TOKEN_IDS};
    let spec = TinySpec::qwen3_kquant(GgmlType::Q4K, 57);
    let file = std::sync::Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap());
    let model = minfer_models::load_model(&file).unwrap();
    let Some(mut g) = common::gpu() else { return };
    g.register_gguf(&file, "").unwrap();
    let mut cpu = minfer_cpu::CpuBackend::new(1);
    cpu.register_gguf(std::sync::Arc::clone(&file), "").unwrap();
    let backends: Vec<Box<dyn BackendImpl>> = vec![Box::new(cpu), Box::new(g)];
    let mut alloc = GraphAllocator::new(backends).unwrap();
    let params = GraphParams {
        n_tokens: 1,
        n_out: 1,
        gtype: minfer_graph::GraphType::Decode,
        cparams: CParams {
            n_ctx: 64,
            flash_attn: false,
            gpu: true,
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
    let mut sched = BackendScheduler::new();
    sched.assign_backends(&mut graph, &alloc);
    alloc.alloc_graph(&graph).unwrap();
    let pool_len = |alloc: &GraphAllocator| alloc.pool_len(minfer_graph::Backend::WGPU);
    let step = |alloc: &mut GraphAllocator, tok: u32, pos: u32| -> Vec<f32> {
        alloc
            .fill_input_u32(&graph, INPUT_TOKEN_IDS, &[tok])
            .unwrap();
        alloc
            .fill_input_u32(&graph, INPUT_POSITIONS, &[pos])
            .unwrap();
        sched.execute(&graph, alloc).unwrap();
        let mut out = Vec::new();
        assert!(alloc.read_into(graph.outputs[0], &mut out));
        out
    };
    let first = step(&mut alloc, 17, 0);
    let pool = pool_len(&alloc);
    let second = step(&mut alloc, 42, 1);
    assert_eq!(
        pool_len(&alloc),
        pool,
        "a reused graph allocates no device buffers"
    );
    // The same two steps again from position 0 give the same bits.
    let again_first = step(&mut alloc, 17, 0);
    let again_second = step(&mut alloc, 42, 1);
    assert_eq!(first, again_first);
    assert_eq!(second, again_second);
    assert_ne!(first, second);
}
