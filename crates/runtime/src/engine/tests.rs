//! The engine's unit tests.

use super::kv_size::physical_memory;
use super::*;
use minfer_gguf::GgmlType;
use minfer_models::testing::{tiny_model_bytes, TinySpec};

fn tiny_engine() -> Engine {
    let spec = TinySpec::qwen2(GgmlType::Q8_0, 75);
    let file = GgufFile::from_bytes(tiny_model_bytes(&spec).expect("writer")).expect("reader");
    let opts = EngineOptions {
        n_threads: 1,
        n_ctx: Some(32),
        backend: None,
        n_batch: 512,
        ..EngineOptions::default()
    };
    Engine::from_gguf(file, &opts).expect("engine")
}

/// Under debug assertions a reused graph that is not what a rebuild gives (here one
/// whose node was tampered with) stops the step loudly instead of running.
#[cfg(debug_assertions)]
#[test]
fn a_reused_graph_unlike_its_rebuild_fails_loudly() {
    let mut e = tiny_engine();
    e.forward(&[1, 2, 3], 0, 1).unwrap();
    e.forward(&[4, 5, 6], 0, 1)
        .expect("an honest reuse passes the check");
    let mut g = e.cache.graph().expect("cached").clone();
    let params = e.params(3, 1).expect("params");
    let last = g.nodes.len() - 1;
    g.nodes[last].src.reverse();
    g.nodes[last].src.push(0);
    e.cache.replace_graph(g, params);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| e.forward(&[7, 8, 9], 0, 1)));
    let payload = r.expect_err("the check panics");
    let text = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(text.contains("graph reuse identity broken"), "{text}");
}

#[test]
fn the_reuse_check_follows_debug_assertions() {
    let mut e = tiny_engine();
    assert_eq!(e.check_reuse, cfg!(debug_assertions));
    e.set_check_reuse(false);
    assert!(!e.check_reuse);
    e.set_check_reuse(true);
    assert_eq!(e.check_reuse, cfg!(debug_assertions));
}

fn hparams(n_layer: usize, head_dim: usize) -> HParams {
    HParams {
        n_layer,
        n_embd: 64,
        n_head: 2,
        n_head_kv: 2,
        head_dim,
        n_ff: 128,
        n_vocab: 300,
        n_ctx_train: 4096,
        rms_eps: 1e-6,
        rope_freq_base: 10000.0,
        rope_freq_scale: 1.0,
        rope_yarn: None,
        rope_style: minfer_graph::RopeStyle::NonInterleaved,
        moe: None,
    }
}

#[test]
fn kv_sizes_are_checked_products_and_absurd_contexts_are_named_errors() {
    // 2 halves * 4 bytes * 2 layers * 2 heads * 32 dims * 64 positions.
    assert_eq!(
        kv_cache_bytes(&hparams(2, 32), 64),
        Some(2 * 4 * 2 * 2 * 32 * 64)
    );
    assert_eq!(kv_cache_bytes(&hparams(usize::MAX, 32), 1 << 24), None);
    assert!(check_kv_fits(&hparams(2, 32), 64, [KvType::F32; 2]).is_ok());
    let mut absurd = vec![hparams(usize::MAX, 32)];
    if physical_memory().is_some() {
        // 2^58 bytes: representable, but more than any machine holds.
        absurd.push(hparams(1 << 20, 1 << 10));
    }
    for hp in absurd {
        let e = check_kv_fits(&hp, 1 << 24, [KvType::F32; 2])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("context size (-c)") && e.contains("KV cache"),
            "{e}"
        );
    }
}
