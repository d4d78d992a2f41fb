//! Writer -> reader round trips: metadata values and tensor bytes come back exactly.

mod common;

use common::{pattern, sample_writer};
use minfer_gguf::quant::has_quantizer;
use minfer_gguf::{GgmlType, GgufFile, GgufWriter, MetaType, MetaValue, ALL_TYPES};

#[test]
fn metadata_round_trips_in_order_with_every_value_type() {
    let w = sample_writer();
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.file_size(), bytes.len() as u64);
    let keys: Vec<&str> = f.metadata().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys[0], "general.architecture");
    assert_eq!(keys.last(), Some(&"test.nested"));
    assert_eq!(f.get("test.u64"), Some(&MetaValue::U64(u64::MAX)));
    assert_eq!(f.get("test.i32"), Some(&MetaValue::I32(i32::MIN)));
    assert_eq!(f.get("test.f32"), Some(&MetaValue::F32(1.5e-3)));
    assert_eq!(
        f.get("test.empty"),
        Some(&MetaValue::Array(MetaType::F32, vec![]))
    );
    assert_eq!(f.get_str("test.unicode").unwrap(), "héllo ✓");
    let nested = f.get("test.nested").unwrap().as_array().unwrap();
    assert_eq!(
        nested[0],
        MetaValue::Array(MetaType::I16, vec![MetaValue::I16(1), MetaValue::I16(-2)])
    );
    assert_eq!(nested[1], MetaValue::Array(MetaType::I16, vec![]));
    // Re-writing what was read reproduces the file byte for byte.
    let mut again = GgufWriter::new();
    for (k, v) in f.metadata() {
        again.add_meta(k, v.clone());
    }
    for t in f.tensors() {
        again
            .add_tensor_bytes(&t.name, &t.dims, t.ggml_type, f.tensor_data(t).to_vec())
            .unwrap();
    }
    assert!(again.to_bytes().unwrap() == bytes);
}

#[test]
fn tensors_of_every_type_round_trip_aligned() {
    let mut w = GgufWriter::new();
    let mut expected = Vec::new();
    for (i, ty) in ALL_TYPES.into_iter().enumerate() {
        let dims = [ty.block_size() as u64 * 2, 3];
        let n = ty.bytes_for(dims[0] * dims[1]).unwrap() as usize;
        let data = pattern(n, i as u8);
        let name = format!("t.{}", ty.name());
        w.add_tensor_bytes(&name, &dims, ty, data.clone()).unwrap();
        expected.push((name, dims, ty, data));
    }
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.tensors().len(), ALL_TYPES.len());
    assert_eq!(f.data_offset() % 32, 0);
    for ((name, dims, ty, data), info) in expected.iter().zip(f.tensors()) {
        assert_eq!(&info.name, name);
        assert_eq!(info.dims, dims);
        assert_eq!(info.ggml_type, *ty);
        assert_eq!(info.offset % 32, 0);
        assert_eq!(info.n_bytes, data.len() as u64);
        assert_eq!(info.n_elements(), dims[0] * dims[1]);
        assert_eq!(f.tensor_data(info), &data[..], "{name}");
        assert_eq!(f.tensor(name), Some(info));
    }
    assert_eq!(f.tensor("absent"), None);
}

#[test]
fn float_tensors_from_f32_values_round_trip() {
    let values: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 8.0).collect();
    let mut w = GgufWriter::new();
    w.add_tensor_f32("f32", &[16, 4], GgmlType::F32, &values)
        .unwrap()
        .add_tensor_f32("f16", &[64], GgmlType::F16, &values)
        .unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let raw = f.tensor_data(f.tensor("f32").unwrap());
    let back: Vec<f32> = raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(back, values);
    let raw = f.tensor_data(f.tensor("f16").unwrap());
    let back: Vec<f32> = raw
        .chunks_exact(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    // Quarter steps in [-8, 8) are exact in f16.
    assert_eq!(back, values);
}

#[test]
fn quantized_tensors_from_f32_values_dequantize_close() {
    let n = 512;
    let values: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * 0.5)
        .collect();
    for ty in ALL_TYPES
        .into_iter()
        .filter(|&t| t.is_quantized() && t != GgmlType::Q8K && has_quantizer(t))
    {
        let mut w = GgufWriter::new();
        w.add_tensor_f32("q", &[n as u64], ty, &values).unwrap();
        let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let info = f.tensor("q").unwrap();
        let back = minfer_gguf::quant::dequantize_to_vec(ty, f.tensor_data(info), n).unwrap();
        let max_err = values
            .iter()
            .zip(&back)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        // Even 2-bit k-quants stay within a third of the 0.5 amplitude on this ramp; the
        // ternary types can only round to -amax, 0 or amax, so up to half of it.
        // The lattice i-quants bound groups, not elements: a group off the grid takes a
        // nearby grid point, which can move one element by a few steps; their encoders
        // here also weigh by x², favouring the large values (measured: IQ3_XXS 0.18,
        // IQ2_XXS 0.44, IQ2_XS 0.47, IQ1_M 0.53, IQ1_S 0.55).
        let bound = match ty {
            GgmlType::Tq1_0 | GgmlType::Tq2_0 => 0.26,
            GgmlType::Iq3Xxs => 0.21,
            GgmlType::Iq2Xxs | GgmlType::Iq2Xs => 0.55,
            GgmlType::Iq1S | GgmlType::Iq1M => 0.63,
            _ => 0.17,
        };
        assert!(max_err < bound, "{ty}: max error {max_err}");
    }
}

#[test]
fn a_refused_quantization_names_the_tensor_and_the_type() {
    let mut w = GgufWriter::new();
    w.add_tensor_f32("blk.0.w", &[256], GgmlType::Iq3S, &[0.5; 256])
        .expect("IQ3_S has an encoder");
    let Err(err) = w.add_tensor_f32("blk.1.w", &[100], GgmlType::Iq3S, &[0.5; 100]) else {
        panic!("100 values are not whole IQ3_S blocks, yet writing them succeeded");
    };
    let err = err.to_string();
    assert!(
        err.contains("IQ3_S") && err.contains("blk.1.w") && err.contains("block size"),
        "{err}"
    );
}
