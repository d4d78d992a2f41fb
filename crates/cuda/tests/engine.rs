//! The CUDA backend through the engine on this machine, its factory beside the CPU's as a
//! binary built with the `cuda` feature has them. Without a usable device (CI) the
//! `cuda` fence is refused with the probe's reason and the default selection runs on
//! the CPU; with one, the fence selects it.

use std::sync::Arc;

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::{BackendConfig, BackendFactory, BackendRegistry, FenceError};
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::{Engine, EngineOptions};

const FACTORIES: [BackendFactory; 2] = [minfer_cpu::FACTORY, minfer_cuda::FACTORY];

fn tiny() -> Arc<GgufFile> {
    let bytes = tiny_model_bytes(&TinySpec::qwen2(GgmlType::Q8_0, 5)).expect("tiny model");
    Arc::new(GgufFile::from_bytes(bytes).expect("parses"))
}

fn opts(backend: Option<&str>) -> EngineOptions {
    EngineOptions {
        n_threads: 1,
        n_ctx: Some(64),
        backend: backend.map(str::to_string),
        ..EngineOptions::default()
    }
}

#[test]
fn the_cuda_fence_is_refused_with_the_probe_reason_where_no_device_is_usable() {
    let reason = match minfer_cuda::probe() {
        Ok(d) => {
            eprintln!(
                "{} is usable here; the refusal is checked on machines without one",
                d.name
            );
            return;
        }
        Err(r) => r,
    };
    let reg =
        BackendRegistry::from_factories(&FACTORIES, &BackendConfig::default()).expect("registry");
    match reg.parse_fence("cuda") {
        Err(FenceError::NotUsable { name, reason: r }) => {
            assert_eq!(name, "cuda");
            assert_eq!(r, reason);
        }
        other => panic!("expected a not-usable refusal, got {other:?}"),
    }
    let e = match Engine::with_factories(tiny(), &opts(Some("cuda")), &FACTORIES) {
        Ok(_) => panic!("an engine was built on an unusable backend"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("cuda") && e.contains(&reason), "{e}");
    // The default selection (no fence) leaves the unusable backend out.
    let mut eng = Engine::with_factories(tiny(), &opts(Some("cpu")), &FACTORIES).expect("cpu");
    assert!(eng.backend_names().iter().all(|n| n != "cuda"));
    assert!(!eng.forward(&[1, 2, 3], 0, 1).expect("forward").is_empty());
    let sel = reg.select(None);
    assert_eq!(sel.backends, vec![minfer_graph::Backend::CPU]);
    assert!(
        sel.notices
            .iter()
            .any(|n| n.contains("'cuda'") && n.contains(&reason)),
        "{:?}",
        sel.notices
    );
}

#[test]
fn with_a_device_the_fence_selects_it_as_a_gpu() {
    if !minfer_cuda::testing::device_or_skip("cuda engine selection") {
        return;
    }
    let mut eng = Engine::with_factories(tiny(), &opts(Some("cuda")), &FACTORIES).expect("cuda");
    assert_eq!(eng.backend_info()[0].name, "cuda");
    assert!(eng.backend_info()[0].gpu);
    assert!(!eng.forward(&[1, 2, 3], 0, 1).expect("forward").is_empty());
}
