//! The shared op-case table on the CUDA backend, with the CPU backend as host (inputs),
//! against the scalar f32 reference backend, within each case's stated bound. Every
//! case must run on CUDA except those the backend declines by capability: matmuls over
//! weight types no kernel decodes (never one of the real models' types or IQ4_NL/IQ4_XS),
//! rope with Llama 3 frequency factors or YaRN terms, sliding-window attention, attention
//! sinks or over a KV ring, BERT's LayerNorm and bidirectional attention, the experts'
//! routing and products, and the recurrent ops. Gemma's GELU, GeGLU, embedding scale
//! and soft-caps (the attention score cap included) and the MoE shared expert's sigmoid
//! gate run here. Skips (saying so) without a
//! device, fails there under `MINFER_CUDA_TESTS=require`.

use minfer_cpu::CpuBackend;
use minfer_graph::testing::cases::run_device_cases;
use minfer_graph::{Backend, BackendImpl};

#[test]
fn the_cuda_backend_passes_the_op_case_table() {
    if !minfer_cuda::testing::device_or_skip("cuda op-case table") {
        return;
    }
    let cuda = || -> Vec<Box<dyn BackendImpl>> {
        let g = minfer_cuda::CudaBackend::new().expect("cuda backend");
        vec![Box::new(CpuBackend::new(1)), Box::new(g)]
    };
    let decoded = minfer_cuda::CudaBackend::weight_types();
    run_device_cases(Backend::CUDA, "cuda", &cuda, decoded).unwrap_or_else(|e| panic!("{e}"));
}
