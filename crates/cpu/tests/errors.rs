//! Invariant violations are errors naming the node and the values, never panics; and the
//! pool honours the backend contract.

mod common;

use common::*;
use minfer_cpu::CpuBackend;
use minfer_gguf::GgmlType;
use minfer_graph::*;

fn err_of(r: Result<Vec<Vec<f32>>, GraphError>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_missing_weight_is_named() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [32, 1, 1, 1], DType::F32);
    let y = b.matmul(
        x,
        &WeightRef::new("blk.0.nowhere", WeightType::F32, [32, 8]),
        None,
    );
    b.set_name(y, "q_proj");
    b.output(y);
    let e =
        err_of(Runner::cpu(CpuBackend::new(1)).step(b.build(), &[("x", Fill::F32(vec![0.0; 32]))]));
    assert!(e.contains("blk.0.nowhere") && e.contains("q_proj"), "{e}");
}

#[test]
fn a_weight_of_the_wrong_shape_is_refused() {
    let ws = vec![TestWeight::new("w", [32, 4], GgmlType::F32, vec![0.5; 128])];
    let mut b = GraphBuilder::new();
    let x = b.input("x", [32, 1, 1, 1], DType::F32);
    let y = b.matmul(x, &WeightRef::new("w", WeightType::F32, [32, 8]), None);
    b.output(y);
    let e =
        err_of(Runner::cpu(cpu_f32(&ws, 1)).step(b.build(), &[("x", Fill::F32(vec![0.0; 32]))]));
    assert!(e.contains("'w' is [32, 4]") && e.contains("[32, 8]"), "{e}");
}

fn store_graph(n_ctx: usize) -> ComputeGraph {
    let mut b = GraphBuilder::new();
    let k = b.input("k", [8, 2, 1, 1], DType::F32);
    let v = b.input("v", [8, 2, 1, 1], DType::F32);
    let cells = b.input("cells", [2, 1, 1, 1], DType::I32);
    let q = b.input("q", [16, 2, 1, 1], DType::F32);
    b.kvcache_store(3, k, v, cells, n_ctx, None);
    let kv = b.kvcache_load(3, 8, n_ctx, 1, None);
    let meta = AttnMeta {
        layer: 3,
        n_head: 2,
        n_head_kv: 1,
        hd: 8,
        scale: 0.3,
        n_ctx,
        window: None,
        softcap: None,
        ring: None,
        sinks: None,
        causal: true,
    };
    let a = b.attn(q, kv, cells, None, AttnMode::Gqa, meta);
    b.output(a);
    b.build()
}

fn store_inputs(cells: Vec<i32>) -> Vec<(&'static str, Fill)> {
    vec![
        ("k", Fill::F32(vec![1.0; 16])),
        ("v", Fill::F32(vec![1.0; 16])),
        ("cells", Fill::I32(cells)),
        ("q", Fill::F32(vec![1.0; 32])),
    ]
}

#[test]
fn a_kv_row_beyond_the_region_is_an_error_naming_layer_and_row() {
    let mut r = Runner::cpu(CpuBackend::new(2));
    assert!(r.step(store_graph(4), &store_inputs(vec![2, 3])).is_ok());
    let e = err_of(r.step(store_graph(4), &store_inputs(vec![3, 4])));
    assert!(
        e.contains("layer 3") && e.contains("row 4") && e.contains("kvcache_store"),
        "{e}"
    );
    let e = err_of(r.step(store_graph(4), &store_inputs(vec![-1, 0])));
    assert!(e.contains("row -1"), "{e}");
}

#[test]
fn bad_token_ids_and_tail_rows_are_errors() {
    let ws = vec![TestWeight::new(
        "emb",
        [32, 5],
        GgmlType::Q8_0,
        vec![0.25; 160],
    )];
    let mut b = GraphBuilder::new();
    let ids = b.input("ids", [2, 1, 1, 1], DType::I32);
    let sel = b.input("sel", [1, 1, 1, 1], DType::I32);
    let x = b.embedding(ids, &ws[0].wref());
    let t = b.get_rows(x, sel, [32, 1, 1, 1]);
    b.output(t);
    let g = b.build();
    let mut r = Runner::cpu(cpu_gguf(&ws, 1));
    let run = |r: &mut Runner, ids: Vec<i32>, sel: Vec<i32>| {
        r.step(
            g.clone(),
            &[("ids", Fill::I32(ids)), ("sel", Fill::I32(sel))],
        )
    };
    assert_eq!(
        run(&mut r, vec![4, 0], vec![1]).unwrap()[0],
        ws[0].values[..32]
    );
    let e = err_of(run(&mut r, vec![5, 0], vec![1]));
    assert!(e.contains("id 5") && e.contains("5 rows"), "{e}");
    let e = err_of(run(&mut r, vec![0, 0], vec![2]));
    assert!(e.contains("id 2") && e.contains("get_rows"), "{e}");
}

#[test]
fn unsupported_ops_are_declined_and_refused_with_a_message() {
    let cpu = CpuBackend::new(1);
    assert!(cpu.supports_op(
        &Op::Attn {
            mode: AttnMode::Gqa,
            explicit_span: false
        },
        DType::F32
    ));
    assert!(cpu.supports_op(&Op::Input, DType::F32));
    assert!(
        !cpu.supports_op(&Op::Input, DType::I32),
        "I32 inputs land on the CPU by default"
    );
    assert!(!cpu.supports_op(&Op::Softmax { dim: 1 }, DType::F32));
    // The mixed-type QKV epilogue is never built for the CPU (three matmuls instead).
    assert!(!cpu.supports_op(&Op::QkvBiasRopeStore { layer: 0 }, DType::F32));
    assert!(cpu.supports_op(&Op::FusedQKV { layer: 0 }, DType::F32));
    assert!(cpu.supports_fused(FusedOp::SwiGLU));
    assert_eq!((cpu.id(), cpu.name()), (Backend::CPU, "cpu"));

    let mut b = GraphBuilder::new();
    let x = b.input("x", [4, 2, 1, 1], DType::F32);
    let s = b.softmax(x, 1);
    b.output(s);
    let e =
        err_of(Runner::cpu(CpuBackend::new(1)).step(b.build(), &[("x", Fill::F32(vec![0.0; 8]))]));
    assert!(
        e.contains("softmax") && e.contains("not implemented"),
        "{e}"
    );
}

#[test]
fn pool_reuses_exact_lengths_zeroed_and_fresh_buffers_append() {
    let mut cpu = CpuBackend::new(1);
    let a = cpu.alloc_buffer(4);
    let b = cpu.alloc_buffer(8);
    cpu.write_host(a, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    cpu.free_buffer(a);
    cpu.free_buffer(a);
    assert_eq!(cpu.alloc_buffer(5), 2, "no free buffer of length 5");
    assert_eq!(cpu.alloc_fresh(4), 3, "fresh buffers bypass the free list");
    assert_eq!(cpu.alloc_buffer(4), a, "exact-length reuse");
    assert_eq!(
        cpu.read_host(a).unwrap(),
        &[0.0; 4],
        "reused buffers are zeroed"
    );
    assert_eq!(cpu.pool_len(), 4);
    assert!(cpu.write_host(b, &[1.0; 7]).is_err());
    cpu.write_host_window(b, 6, &[5.0, 6.0]).unwrap();
    assert_eq!(&cpu.read_host(b).unwrap()[5..], &[0.0, 5.0, 6.0]);
    assert!(cpu.write_host_window(b, 7, &[1.0, 1.0]).is_err());
    assert!(cpu.write_host_window(b, usize::MAX, &[1.0]).is_err());
    assert!(cpu.write_host(99, &[]).is_err());
    assert!(cpu.read_host(99).is_none());
}

#[test]
fn registration_is_zero_copy_and_first_wins() {
    let ws = vec![TestWeight::new("t", [32, 2], GgmlType::Q4_0, vec![0.5; 64])];
    let file = gguf_file(&ws);
    let mut cpu = CpuBackend::new(1);
    assert_eq!(cpu.register_gguf(file.clone(), "").unwrap(), 1);
    assert_eq!(cpu.register_gguf(file.clone(), "").unwrap(), 0);
    assert_eq!(cpu.register_gguf(file.clone(), "draft.").unwrap(), 1);
    let w = cpu.weights().get("draft.t").unwrap();
    let info = file.tensor("t").unwrap();
    assert_eq!(w.bytes().as_ptr(), file.tensor_data(info).as_ptr());
    assert!(!cpu.register_f32("t", &[64], vec![0.0; 64]).unwrap());
    assert_eq!(cpu.weights().get("t").unwrap().ty, GgmlType::Q4_0);
    assert!(cpu.register_f32("bad", &[3, 3], vec![0.0; 8]).is_err());
}
