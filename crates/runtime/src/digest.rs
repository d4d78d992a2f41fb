//! The model digest: what identifies a model's weights cheaply enough to compute at each
//! session save, and well enough that a session, a cache entry or an API's model digest
//! never matches another quantisation or fine-tune of the same architecture.

use minfer_gguf::GgufFile;
use sha2::{Digest, Sha256};

/// Bytes sampled from each tensor at each of [`DIGEST_SAMPLES`] evenly spaced offsets.
const DIGEST_CHUNK: usize = 4096;

/// Sample points per tensor: enough to tell apart two quantisations or fine-tunes of one
/// architecture without reading every weight at each save.
const DIGEST_SAMPLES: usize = 4;

/// SHA-256 over the tensor table (names, dims, types, offsets, sizes) and
/// [`DIGEST_SAMPLES`] chunks of every tensor's data: another quantisation changes the
/// table, other weights of one shape change the samples.
pub fn model_digest(file: &GgufFile) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"minfer-model-digest-1");
    for t in file.tensors() {
        h.update((t.name.len() as u64).to_le_bytes());
        h.update(t.name.as_bytes());
        h.update((t.dims.len() as u64).to_le_bytes());
        for d in &t.dims {
            h.update(d.to_le_bytes());
        }
        h.update(format!("{:?}", t.ggml_type).as_bytes());
        h.update(t.offset.to_le_bytes());
        h.update(t.n_bytes.to_le_bytes());
        let data = file.tensor_data(t);
        if data.len() <= DIGEST_CHUNK * DIGEST_SAMPLES {
            h.update(data);
        } else {
            let step = (data.len() - DIGEST_CHUNK) / (DIGEST_SAMPLES - 1);
            for i in 0..DIGEST_SAMPLES {
                h.update(&data[i * step..i * step + DIGEST_CHUNK]);
            }
        }
    }
    h.finalize().into()
}
