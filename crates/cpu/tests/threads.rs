//! `-t 1`, `-t 2` and `-t 3` must give bitwise-identical results.

mod common;

use common::*;
use minfer_cpu::ops::vec::VecIsa;
use minfer_gguf::GgmlType;

fn ty(name: &str) -> GgmlType {
    match name {
        n if n.contains("attn") => GgmlType::Q4K,
        n if n.contains("ffn_down") => GgmlType::Q6K,
        n if n.contains("ffn") => GgmlType::Q5_0,
        "output.weight" => GgmlType::Q8_0,
        _ => GgmlType::F16,
    }
}

#[test]
fn thread_count_never_changes_a_bit() {
    // A longer prompt so attention, norms and element-wise ops take their parallel paths.
    let mut cfg = Cfg::small(false);
    cfg.n_ctx = 160;
    let ws = make_weights(&cfg, 3, &ty);
    let prompt: Vec<i32> = (0..140).map(|i| i * 37 % 300).collect();
    let mut results = Vec::new();
    for nth in [1, 2, 3] {
        let mut r = Runner::cpu(cpu_gguf(&ws, nth));
        results.push(run_model(&mut r, &cfg, &ws, &prompt, &[5, 6]));
    }
    for (i, r) in results.iter().enumerate().skip(1) {
        assert!(
            r.0 == results[0].0,
            "logits differ between -t 1 and -t {}",
            i + 1
        );
        assert!(
            r.1 == results[0].1,
            "KV differs between -t 1 and -t {}",
            i + 1
        );
    }
}

#[test]
fn scalar_attention_primitives_agree_with_simd_within_rounding() {
    let cfg = Cfg::small(true);
    let ws = make_weights(&cfg, 5, &|_| GgmlType::F32);
    let mut scalar = cpu_f32(&ws, 2);
    scalar.set_vec_isa(VecIsa::Scalar);
    let prompt = [1, 2, 3, 4, 5, 6, 7, 8];
    let (a, _) = run_model(&mut Runner::cpu(scalar), &cfg, &ws, &prompt, &[9]);
    let (b, _) = run_model(&mut Runner::cpu(cpu_f32(&ws, 2)), &cfg, &ws, &prompt, &[9]);
    for (x, y) in a.iter().zip(&b) {
        assert_close(x, y, 1e-5, "logits");
    }
}
