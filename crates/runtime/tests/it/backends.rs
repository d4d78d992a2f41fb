//! The backend seam end to end: an engine builds its backends from a factory table and
//! the fence, hands every one the GGUF the same way, derives `CParams.gpu` from their
//! capabilities, and runs a graph split across them.

use std::sync::Arc;

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::testing::RefBackend;
use minfer_graph::{Backend, BackendCaps, BackendConfig, BackendFactory, BackendImpl, ProbeInfo};
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::{Engine, EngineError, EngineOptions};

fn file() -> Arc<GgufFile> {
    let spec = TinySpec::qwen2(GgmlType::F32, 11);
    Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec).expect("writer")).expect("reader"))
}

fn opts(backend: Option<&str>) -> EngineOptions {
    EngineOptions {
        n_threads: 1,
        n_ctx: Some(32),
        backend: backend.map(str::to_string),
        n_batch: 512,
        ..EngineOptions::default()
    }
}

fn usable(_: &BackendConfig) -> Result<ProbeInfo, String> {
    Ok(ProbeInfo {
        device: "reference device".into(),
        emulated: false,
        detail: None,
    })
}
fn no_adapter(_: &BackendConfig) -> Result<ProbeInfo, String> {
    Err("no adapter found".into())
}
/// A GPU stand-in in the Metal slot that claims the matmuls and element-wise ops only,
/// so a graph alternates between it and the CPU.
fn gpu_device(_: &BackendConfig) -> Result<Box<dyn BackendImpl>, String> {
    Ok(Box::new(
        RefBackend::test_device()
            .claiming(&["matmul", "add", "mul", "silu", "swiglu"])
            .with_fusion(false)
            .as_gpu(true),
    ))
}

const DEVICE: BackendFactory = BackendFactory {
    id: Backend::METAL,
    probe: usable,
    create: gpu_device,
};

#[test]
fn the_cpu_build_derives_no_gpu_flag_its_own_fusions_and_names_its_backend() {
    let e = Engine::with_factories(file(), &opts(None), &[minfer_cpu::FACTORY]).expect("engine");
    // The CPU's decode fusions are the ones the options turn on (none by default).
    let want = opts(None).backend_options.fusions;
    assert_eq!(
        e.backend_caps(),
        BackendCaps {
            gpu: false,
            fuse_qkv: want.qkv,
            fuse_ffn: want.ffn
        }
    );
    assert_eq!(e.backend_names(), vec!["cpu".to_string()]);
    let p = e.params(1, 1).expect("params");
    assert!(!p.cparams.gpu);
    assert_eq!(
        (p.cparams.fuse_qkv, p.cparams.fuse_ffn),
        (want.qkv, want.ffn)
    );
}

#[test]
fn a_plugged_in_gpu_backend_sets_the_flags_and_a_split_graph_matches_the_cpu() {
    let f = file();
    let mut cpu = Engine::from_arc(Arc::clone(&f), &opts(None)).expect("cpu engine");
    let mut mixed =
        Engine::with_factories(Arc::clone(&f), &opts(None), &[minfer_cpu::FACTORY, DEVICE])
            .expect("mixed engine");
    assert_eq!(
        mixed.backend_names(),
        vec!["test".to_string(), "cpu".to_string()]
    );
    assert!(mixed.backend_caps().gpu);
    assert!(mixed.params(1, 1).expect("params").cparams.gpu);
    let g = mixed.preview_graph(1, 1).expect("graph");
    let on = |b| g.nodes.iter().filter(|n| n.backend == Some(b)).count();
    assert!(on(Backend::METAL) > 0 && on(Backend::CPU) > 0, "not split");

    let prompt = [1u32, 7, 3, 9];
    let want = cpu.prefill(&prompt, 0).expect("cpu prefill");
    let got = mixed.prefill(&prompt, 0).expect("mixed prefill");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    let err = want
        .iter()
        .zip(&got)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    // f32 weights on both sides; only the summation orders differ.
    assert!(err / scale < 1e-4, "mixed run off by {err} (scale {scale})");
    let want = cpu.forward(&[5], 4, 1).expect("cpu decode");
    let got = mixed.forward(&[5], 4, 1).expect("mixed decode");
    let err = want
        .iter()
        .zip(&got)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(err / scale < 1e-4, "mixed decode off by {err}");
}

#[test]
fn a_fenced_backend_that_fails_its_probe_is_refused_with_the_reason() {
    let broken = BackendFactory {
        probe: no_adapter,
        ..DEVICE
    };
    let factories = [minfer_cpu::FACTORY, broken];
    let err = Engine::with_factories(file(), &opts(Some("metal")), &factories)
        .err()
        .expect("refused");
    assert!(matches!(err, EngineError::Fence(_)), "{err}");
    assert_eq!(
        err.to_string(),
        "backend 'metal' is not usable on this machine: no adapter found"
    );
    // Without a fence the same build runs on the CPU.
    let e = Engine::with_factories(file(), &opts(None), &factories).expect("cpu fallback");
    assert_eq!(e.backend_names(), vec!["cpu".to_string()]);
    let err = Engine::with_factories(file(), &opts(Some("cuda")), &factories)
        .err()
        .expect("refused");
    assert_eq!(
        err.to_string(),
        "backend 'cuda' is not compiled into this build"
    );
}
