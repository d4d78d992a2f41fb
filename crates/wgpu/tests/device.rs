//! Adapter policy and weight registration on a real device.

mod common;

use common::gpu;
use minfer_gguf::GgmlType;
use minfer_graph::BackendImpl;
use minfer_wgpu::WgpuBackend;

#[test]
fn a_cpu_emulation_adapter_is_used_only_when_named_explicitly() {
    let Some(g) = gpu() else { return };
    let a = g.adapter().clone();
    assert!(
        !a.name.is_empty(),
        "the adapter has a name for `minfer info`"
    );
    assert!(a.to_string().contains(&a.name));
    assert_eq!(g.name(), "wgpu");
    let default = WgpuBackend::probe(false);
    if a.is_cpu_emulation {
        // Explicit probing fell back to an emulation, so no real GPU is here: the
        // default policy must refuse, naming the adapter and the reason.
        let e = default.expect_err("an emulation adapter is refused by default");
        assert!(
            e.reason.contains(&a.name) && e.reason.contains("CPU emulation"),
            "{e}"
        );
    } else {
        let b = default.expect("a real GPU is usable by default");
        assert!(!b.adapter().is_cpu_emulation);
    }
}

#[test]
fn weight_registration_refuses_what_the_kernels_cannot_read() {
    let Some(mut g) = gpu() else { return };
    let q8 = vec![0u8; 34 * 2];
    assert!(g
        .register_weight("w", GgmlType::Q8_0, &[32, 2], &q8)
        .unwrap());
    assert!(
        !g.register_weight("w", GgmlType::Q8_0, &[32, 2], &q8)
            .unwrap(),
        "a second registration of a name keeps the first"
    );
    let cases: [(&str, GgmlType, &[usize], usize, &str); 4] = [
        ("a", GgmlType::Q4_0, &[32, 2], 36, "not decoded"),
        ("b", GgmlType::Q8_0, &[32, 2], 67, "bytes"),
        ("c", GgmlType::Q4K, &[128, 1], 72, "block"),
        ("d", GgmlType::F32, &[], 0, "no dimensions"),
    ];
    for (name, ty, dims, len, want) in cases {
        let e = g
            .register_weight(name, ty, dims, &vec![0u8; len])
            .unwrap_err();
        assert!(
            e.to_string().contains(want) && e.to_string().contains(name),
            "{e}"
        );
    }
}
