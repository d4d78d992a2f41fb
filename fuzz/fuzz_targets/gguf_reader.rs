//! Fuzzes the GGUF reader: any input must parse to `Ok` or a typed error without panicking,
//! and an accepted file must expose in-bounds tensor data and printable metadata.

#![no_main]

use libfuzzer_sys::fuzz_target;
use minfer_gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    let file = match GgufFile::from_bytes(data.to_vec()) {
        Ok(f) => f,
        Err(e) => {
            assert!(!e.to_string().contains('\n'), "multi-line error: {e}");
            return;
        }
    };
    let mut sink = 0u64;
    for (key, value) in file.metadata() {
        sink += (key.len() + value.to_string().len()) as u64;
        assert!(file.get(key).is_some());
    }
    for info in file.tensors() {
        let bytes = file.tensor_data(info);
        assert_eq!(bytes.len() as u64, info.n_bytes);
        assert_eq!(info.offset % file.alignment(), 0);
        sink += bytes.iter().map(|&b| u64::from(b)).sum::<u64>();
    }
    let _ = file.hparam_u32("block_count");
    std::hint::black_box(sink);
});
