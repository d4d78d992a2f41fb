//! Checks against the real Qwen2.5-Coder-0.5B Q4_K_M model that the test script pulls.

mod common;

use common::model_path;
use minfer_gguf::{GgmlType, GgufError, GgufFile};
use std::collections::BTreeMap;
use std::io::Read;

#[test]
fn real_model_header_tensors_and_hparams() {
    let f = GgufFile::open(&model_path()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.file_size(), 491_400_064);
    assert_eq!(f.architecture(), Some("qwen2"));
    assert_eq!(f.tensors().len(), 291);
    let mut counts = BTreeMap::new();
    for t in f.tensors() {
        *counts.entry(t.ggml_type).or_insert(0) += 1;
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes, "{}", t.name);
    }
    let expected = BTreeMap::from([
        (GgmlType::F32, 121),
        (GgmlType::Q5_0, 133),
        (GgmlType::Q8_0, 13),
        (GgmlType::Q4K, 12),
        (GgmlType::Q6K, 12),
    ]);
    assert_eq!(counts, expected);
    assert_eq!(f.hparam_u32("block_count").unwrap(), 24);
    assert_eq!(f.hparam_u32("embedding_length").unwrap(), 896);
    assert_eq!(f.hparam_u32("attention.head_count").unwrap(), 14);
    assert_eq!(f.hparam_u32("attention.head_count_kv").unwrap(), 2);
    assert_eq!(f.hparam_f32("rope.freq_base").unwrap(), 1e6);
    let tokens = f.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
    assert_eq!(tokens.len(), 151_936);
    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dims, [896, 151_936]);
    assert_eq!(f.data_offset() % f.alignment(), 0);
}

#[test]
fn every_kib_prefix_of_the_real_header_is_truncated() {
    let mut head = Vec::new();
    std::fs::File::open(model_path())
        .unwrap()
        .take(64 * 1024)
        .read_to_end(&mut head)
        .unwrap();
    assert_eq!(head.len(), 64 * 1024);
    for k in 1..=64 {
        match GgufFile::from_bytes(head[..k * 1024].to_vec()) {
            Err(GgufError::Truncated { what, .. }) => assert!(what.contains("metadata"), "{what}"),
            Err(e) => panic!("{k} KiB: unexpected error {e}"),
            Ok(_) => panic!("{k} KiB prefix accepted"),
        }
    }
}

#[test]
fn real_model_cut_mid_data_is_out_of_bounds() {
    let path = model_path();
    let data_offset = GgufFile::open(&path).unwrap().data_offset();
    let size = std::fs::metadata(&path).unwrap().len();
    let keep = data_offset + (size - data_offset) / 2;
    let mut prefix = Vec::new();
    std::fs::File::open(&path)
        .unwrap()
        .take(keep)
        .read_to_end(&mut prefix)
        .unwrap();
    let e = GgufFile::from_bytes(prefix)
        .err()
        .expect("half a model accepted");
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    assert!(
        e.to_string().contains(&format!("file of {keep} bytes")),
        "{e}"
    );
}
