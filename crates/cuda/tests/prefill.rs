//! The int8 (dp4a) prefill matmul, which the op-case table's token counts (at most 7)
//! never reach: wider inputs against every quantized weight type the kernel decodes,
//! on CUDA against the CPU backend, which quantizes the activation the same way (Q8_0
//! or Q8_K), so the bound is tight. Skips (saying so) without a device, fails there
//! under `MINFER_CUDA_TESTS=require`.

use std::sync::Arc;

use minfer_cpu::CpuBackend;
use minfer_gguf::{GgmlType, GgufFile, GgufWriter};
use minfer_graph::testing::cases::{run_cases, values, CaseInput, OpCase};
use minfer_graph::{Backend, BackendImpl, DType, GraphBuilder, WeightRef, WeightType};

#[test]
fn the_int8_prefill_matmul_matches_the_cpu_for_every_quantized_type() {
    if !minfer_cuda::testing::device_or_skip("cuda int8 prefill matmul") {
        return;
    }
    let mut cases = Vec::new();
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::Iq4Nl,
        GgmlType::Iq4Xs,
    ] {
        let (in_dim, out_dim) = (512usize, 37usize);
        let mut w = GgufWriter::new();
        w.add_tensor_f32(
            "w",
            &[in_dim as u64, out_dim as u64],
            ty,
            &values(ty.id() as u64 + 3, in_dim * out_dim),
        )
        .expect("weight");
        let weights = Arc::new(GgufFile::from_bytes(w.to_bytes().expect("bytes")).expect("gguf"));
        for nt in [9usize, 33, 64] {
            let mut b = GraphBuilder::new();
            let x = b.input("x", [in_dim, nt, 1, 1], DType::F32);
            let wr = WeightRef::new("w", WeightType(ty.id()), [in_dim, out_dim]);
            let y = b.matmul(x, &wr, None);
            b.output(y);
            cases.push(OpCase {
                name: format!("matmul {} [{in_dim}x{out_dim}] nt={nt} (int8)", ty.name()),
                op: "matmul",
                graph: b.build(),
                inputs: vec![(
                    "x".into(),
                    CaseInput::F32(values(11 + nt as u64, in_dim * nt)),
                )],
                weights: Arc::clone(&weights),
                bound: 1e-4,
            });
        }
    }
    let cuda = || -> Vec<Box<dyn BackendImpl>> {
        let g = minfer_cuda::CudaBackend::new().expect("cuda backend");
        vec![Box::new(CpuBackend::new(1)), Box::new(g)]
    };
    let cpu = || -> Vec<Box<dyn BackendImpl>> { vec![Box::new(CpuBackend::new(1))] };
    let report = run_cases(&cases, Backend::CUDA, &cuda, &cpu);
    for o in &report.passed {
        println!("{:<50} {:.2e} (bound {:.0e})", o.name, o.error, o.bound);
    }
    report.check().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        report.passed.len(),
        cases.len(),
        "declined: {:?}",
        report.unclaimed
    );
}
