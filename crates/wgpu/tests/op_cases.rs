//! The shared op-case table (`minfer_graph::testing::cases`) on the wgpu backend, with
//! the CPU backend as host (inputs), against the scalar f32 reference backend, within
//! each case's stated bound. Every case must run on wgpu except the matmuls over weight
//! types no shader decodes, which the backend declines by capability (they run on the
//! CPU in a real graph) and rope with Llama 3 frequency factors: every op the Qwen2/Qwen3 graphs emit, and every weight type of
//! the real models, runs on the device.

use minfer_cpu::CpuBackend;
use minfer_graph::testing::cases::{op_cases, run_cases};
use minfer_graph::testing::RefBackend;
use minfer_graph::{Backend, BackendImpl};

#[test]
fn the_wgpu_backend_passes_the_op_case_table() {
    if minfer_wgpu::testing::gpu().is_none() {
        return;
    }
    let cases = op_cases();
    let t0 = std::time::Instant::now();
    let wgpu = || -> Vec<Box<dyn BackendImpl>> {
        let g = minfer_wgpu::testing::gpu().expect("adapter");
        vec![Box::new(CpuBackend::new(1)), Box::new(g)]
    };
    let reference = || -> Vec<Box<dyn BackendImpl>> { vec![Box::new(RefBackend::cpu())] };
    let report = run_cases(&cases, Backend::WGPU, &wgpu, &reference);
    for o in &report.passed {
        println!("{:<60} {:.2e} (bound {:.0e})", o.name, o.error, o.bound);
    }
    println!("{} cases in {:.1?}", cases.len(), t0.elapsed());
    report.check().unwrap_or_else(|e| panic!("{e}"));
    let decoded: Vec<String> = minfer_wgpu::WgpuBackend::weight_types()
        .iter()
        .map(|t| t.to_string())
        .collect();
    for name in &report.unclaimed {
        let mut words = name.split_whitespace();
        let (op, ty) = (words.next(), words.next().unwrap_or(""));
        // Rope with Llama 3 frequency factors has no term in the shader: the backend
        // declines it by capability, and those nodes run on the CPU.
        let declined_rope = op == Some("rope") && name.contains("freq_factors");
        assert!(
            declined_rope || (op == Some("matmul") && !decoded.iter().any(|d| d == ty)),
            "'{name}' was not run on wgpu, though the backend implements it"
        );
    }
    for ty in &decoded {
        let prefix = format!("matmul {ty} ");
        assert!(
            report.passed.iter().any(|o| o.name.starts_with(&prefix)),
            "no {ty} matmul case ran on wgpu"
        );
    }
    println!("declined by capability: {:?}", report.unclaimed);
    assert_eq!(report.passed.len() + report.unclaimed.len(), cases.len());
}
