//! Deterministic mutation testing of the reader: thousands of corrupted variants of a small
//! valid file must each parse to `Ok` or a typed error, never panic, and every accepted
//! variant must expose in-bounds tensor data. Stable-toolchain stand-in for the fuzz target.

mod common;

use common::sample_writer;
use minfer_gguf::{GgufFile, MetaValue};
use minfer_testkit::Rng;

const INTERESTING_U64: [u64; 8] = [0, 1, 4, 32, 0x7fff_ffff, u32::MAX as u64, 1 << 63, u64::MAX];

fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(bytes.len());
        match rng.below(6) {
            0 if !bytes.is_empty() => bytes[at] ^= 1 << rng.below(8),
            1 if !bytes.is_empty() => bytes[at] = [0, 0xff, 0x7f, 0x80, 13][rng.below(5)],
            2 if at + 8 <= bytes.len() => {
                let v = INTERESTING_U64[rng.below(INTERESTING_U64.len())];
                bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            3 => bytes.truncate(at),
            4 => {
                let n = 1 + rng.below(16);
                let ins: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                bytes.splice(at..at, ins);
            }
            _ => {
                let end = (at + 1 + rng.below(16)).min(bytes.len());
                bytes.drain(at..end);
            }
        }
    }
}

/// Reads everything an accepted file exposes, as a consumer would.
fn touch(f: &GgufFile) -> u64 {
    let mut sum = 0u64;
    for (k, v) in f.metadata() {
        sum += k.len() as u64 + v.to_string().len() as u64;
        assert!(f.get(k).is_some());
        if let MetaValue::Array(_, items) = v {
            sum += items.len() as u64;
        }
    }
    for t in f.tensors() {
        let data = f.tensor_data(t);
        assert_eq!(data.len() as u64, t.n_bytes);
        assert_eq!(t.offset % f.alignment(), 0);
        sum += data.iter().map(|&b| b as u64).sum::<u64>();
    }
    let _ = f.hparam_u32("block_count");
    sum
}

#[test]
fn mutated_files_never_panic() {
    let base = sample_writer().to_bytes().unwrap();
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let (mut ok, mut err) = (0, 0);
    for _ in 0..5000 {
        let mut bytes = base.clone();
        mutate(&mut rng, &mut bytes);
        match GgufFile::from_bytes(bytes) {
            Ok(f) => {
                touch(&f);
                ok += 1;
            }
            Err(e) => {
                assert!(!e.to_string().contains('\n'), "{e}");
                err += 1;
            }
        }
    }
    // Both outcomes must occur, or the mutations are not exercising the parser.
    assert!(ok > 100 && err > 1000, "ok {ok}, err {err}");
}

#[test]
fn every_prefix_of_a_valid_file_is_refused() {
    let base = sample_writer().to_bytes().unwrap();
    let last_tensor_end = {
        let f = GgufFile::from_bytes(base.clone()).unwrap();
        let t = f.tensors().iter().max_by_key(|t| t.offset).unwrap();
        (f.data_offset() + t.offset + t.n_bytes) as usize
    };
    for len in 0..last_tensor_end {
        assert!(
            GgufFile::from_bytes(base[..len].to_vec()).is_err(),
            "prefix of {len} bytes accepted"
        );
    }
    assert!(GgufFile::from_bytes(base[..last_tensor_end].to_vec()).is_ok());
}
