//! The shared op-case table (`minfer_graph::testing::cases`) on the CPU backend, against
//! the scalar f32 reference backend, within each case's stated bound.

use minfer_cpu::CpuBackend;
use minfer_graph::testing::cases::{op_cases, run_cases};
use minfer_graph::testing::RefBackend;
use minfer_graph::{Backend, BackendImpl};

#[test]
fn the_cpu_backend_passes_the_op_case_table() {
    let cases = op_cases();
    let cpu = || -> Vec<Box<dyn BackendImpl>> { vec![Box::new(CpuBackend::new(2))] };
    let reference = || -> Vec<Box<dyn BackendImpl>> { vec![Box::new(RefBackend::cpu())] };
    let report = run_cases(&cases, Backend::CPU, &cpu, &reference);
    for o in &report.passed {
        println!("{:<60} {:.2e} (bound {:.0e})", o.name, o.error, o.bound);
    }
    report.check().unwrap_or_else(|e| panic!("{e}"));
    // The CPU claims every op the models emit: nothing may run elsewhere.
    assert!(report.unclaimed.is_empty(), "{:?}", report.unclaimed);
    assert_eq!(report.passed.len(), cases.len());
}

/// The other CPU configurations users can select (no repacked weights, scalar vector
/// primitives, one thread) meet the same bounds.
#[test]
fn every_cpu_configuration_passes_the_op_case_table() {
    let cases = op_cases();
    let reference = || -> Vec<Box<dyn BackendImpl>> { vec![Box::new(RefBackend::cpu())] };
    let plain = || -> Vec<Box<dyn BackendImpl>> {
        let mut b = CpuBackend::new(1);
        b.set_repack(false);
        b.set_vec_isa(minfer_cpu::ops::vec::VecIsa::Scalar);
        vec![Box::new(b)]
    };
    let report = run_cases(&cases, Backend::CPU, &plain, &reference);
    report.check().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.passed.len(), cases.len());
}
