//! The shared op-case table on the CUDA backend, with the CPU backend as host (inputs),
//! against the scalar f32 reference backend, within each case's stated bound. Every
//! case must run on CUDA except those the backend declines by capability: matmuls over
//! weight types no kernel decodes and rope with Llama 3 frequency factors. Skips
//! (saying so) without a device, fails there under `MINFER_CUDA_TESTS=require`.

use minfer_cpu::CpuBackend;
use minfer_graph::testing::cases::{op_cases, run_cases};
use minfer_graph::testing::RefBackend;
use minfer_graph::{Backend, BackendImpl};

#[test]
fn the_cuda_backend_passes_the_op_case_table() {
    if !minfer_cuda::testing::device_or_skip("cuda op-case table") {
        return;
    }
    let cases = op_cases();
    let t0 = std::time::Instant::now();
    let cuda = || -> Vec<Box<dyn BackendImpl>> {
        let g = minfer_cuda::CudaBackend::new().expect("cuda backend");
        vec![Box::new(CpuBackend::new(1)), Box::new(g)]
    };
    let reference = || -> Vec<Box<dyn BackendImpl>> { vec![Box::new(RefBackend::cpu())] };
    let report = run_cases(&cases, Backend::CUDA, &cuda, &reference);
    for o in &report.passed {
        println!("{:<60} {:.2e} (bound {:.0e})", o.name, o.error, o.bound);
    }
    println!(
        "RESULT op_cases {} of {} on cuda in {:.1?}",
        report.passed.len(),
        cases.len(),
        t0.elapsed()
    );
    report.check().unwrap_or_else(|e| panic!("{e}"));
    let decoded: Vec<String> = minfer_cuda::CudaBackend::weight_types()
        .iter()
        .map(|t| t.to_string())
        .collect();
    for name in &report.unclaimed {
        let mut words = name.split_whitespace();
        let (op, ty) = (words.next(), words.next().unwrap_or(""));
        let declined_rope = op == Some("rope") && name.contains("freq_factors");
        assert!(
            declined_rope || (op == Some("matmul") && !decoded.iter().any(|d| d == ty)),
            "'{name}' was not run on cuda, though the backend implements it"
        );
    }
    for ty in &decoded {
        let prefix = format!("matmul {ty} ");
        assert!(
            report.passed.iter().any(|o| o.name.starts_with(&prefix)),
            "no {ty} matmul case ran on cuda"
        );
    }
    assert_eq!(report.passed.len() + report.unclaimed.len(), cases.len());
}
