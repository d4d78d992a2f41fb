//! The shared op-case table (`minfer_graph::testing::cases`) on the wgpu backend, with
//! the CPU backend as host (inputs), against the scalar f32 reference backend, within
//! each case's stated bound. Every case must run on wgpu except the matmuls over weight
//! types no shader decodes, which the backend declines by capability (they run on the
//! CPU in a real graph), rope with Llama 3 frequency factors or YaRN terms, gpt-oss's
//! attention sinks, attention over a KV ring, BERT's LayerNorm and bidirectional
//! attention, the experts' routing and products, and the recurrent ops, which have no
//! shader: every op the Qwen2/Qwen3 and Gemma graphs emit (Gemma's GELU, GeGLU,
//! embedding scale and soft-caps included), the MoE shared expert's sigmoid gate, and
//! every weight type of the real models and IQ4_NL/IQ4_XS, runs on the device.

use minfer_cpu::CpuBackend;
use minfer_graph::testing::cases::run_device_cases;
use minfer_graph::{Backend, BackendImpl};

#[test]
fn the_wgpu_backend_passes_the_op_case_table() {
    if minfer_wgpu::testing::gpu().is_none() {
        return;
    }
    let wgpu = || -> Vec<Box<dyn BackendImpl>> {
        let g = minfer_wgpu::testing::gpu().expect("adapter");
        vec![Box::new(CpuBackend::new(1)), Box::new(g)]
    };
    let decoded = minfer_wgpu::WgpuBackend::weight_types();
    let report =
        run_device_cases(Backend::WGPU, "wgpu", &wgpu, decoded).unwrap_or_else(|e| panic!("{e}"));
    // The attention shader honours a sliding window and a score soft-cap, so no such
    // case may be left to the CPU (one with sinks is declined for them, and a ringed one
    // for its KV ring, which the shader lacks).
    let declined: Vec<_> = report
        .unclaimed
        .iter()
        .filter(|c| {
            (c.contains(" window ") || c.contains(" softcap "))
                && !c.contains(" ring ")
                && !c.contains(" sinks")
        })
        .collect();
    assert!(
        declined.is_empty(),
        "window or soft-cap cases declined on wgpu: {declined:?}"
    );
}
