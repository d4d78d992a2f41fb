//! Whole tiny-model graphs of each architecture on CUDA (every op it claims, the decode
//! fusions included) against the all-CPU engine: a prefill, then decode steps over the
//! KV the prefill left on the device. Skips (saying so) without a device, fails there
//! under `MINFER_CUDA_TESTS=require`.

use std::sync::Arc;

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::{Backend, BackendFactory};
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::sampling::argmax;
use minfer_runtime::testing::{fenced, rel_err};
use minfer_runtime::Engine;

const FACTORIES: [BackendFactory; 2] = [minfer_cpu::FACTORY, minfer_cuda::FACTORY];
/// Max abs logits error relative to the logits' scale: the CPU quantizes activations
/// to Q8 before every quantized matmul, the CUDA mat-vec (decode) kernels do not.
const LOGITS_BOUND: f32 = 3e-2;

#[test]
fn the_concat_weight_name_is_the_builders() {
    for il in [0, 7, 23] {
        assert_eq!(
            minfer_cuda::qkv_concat_name(il),
            minfer_models::qkv_concat_name(il)
        );
    }
}

#[test]
fn tiny_models_of_every_architecture_agree_with_the_cpu_through_decode() {
    if !minfer_cuda::testing::device_or_skip("cuda tiny models") {
        return;
    }
    let specs = [
        TinySpec::qwen2(GgmlType::Q8_0, 3),
        TinySpec::qwen2(GgmlType::F16, 4),
        TinySpec::llama(GgmlType::Q5_0, 5),
        TinySpec::qwen3(GgmlType::Q8_0, 6),
        TinySpec::qwen3_kquant(GgmlType::Q4K, 7),
        TinySpec::qwen3_kquant(GgmlType::Q6K, 8),
        TinySpec::qwen3_kquant(GgmlType::Iq4Nl, 9),
        TinySpec::qwen3_kquant(GgmlType::Iq4Xs, 10),
    ];
    for spec in specs {
        let what = format!("{} {}", spec.arch, spec.wtype);
        let bytes = tiny_model_bytes(&spec).expect("tiny model");
        let file = Arc::new(GgufFile::from_bytes(bytes).expect("parses"));
        let opts = |b: &str| fenced(b, 64, 1);
        let mut g = Engine::with_factories(Arc::clone(&file), &opts("cuda"), &FACTORIES)
            .expect("cuda engine");
        let mut c = Engine::with_factories(file, &opts("cpu"), &FACTORIES).expect("cpu");
        // The decode graph puts the QKV fusion (and everything else it claims) on CUDA.
        let decode = g.preview_graph(1, 1).expect("decode graph");
        let fused: Vec<_> = decode
            .nodes
            .iter()
            .filter(|n| matches!(n.op.name(), "fused_qkv" | "fused_qkv_norm"))
            .collect();
        assert!(
            !fused.is_empty(),
            "{what}: the decode graph has no QKV fusion"
        );
        assert!(
            fused.iter().all(|n| n.backend == Some(Backend::CUDA)),
            "{what}"
        );
        let prompt = [1u32, 17, 300, 42, 5, 99, 7];
        let (mut lg, mut lc) = (
            g.forward(&prompt, 0, 1).expect("cuda prefill"),
            c.forward(&prompt, 0, 1).expect("cpu prefill"),
        );
        for step in 0..4 {
            let e = rel_err(&lg, &lc);
            eprintln!("{what} step {step}: logits error {e:.2e}");
            assert!(e <= LOGITS_BOUND, "{what} step {step}: logits error {e:e}");
            let next = argmax(&lc);
            lg = g
                .forward(&[next], prompt.len() + step, 1)
                .expect("cuda decode");
            lc = c
                .forward(&[next], prompt.len() + step, 1)
                .expect("cpu decode");
        }
    }
}
