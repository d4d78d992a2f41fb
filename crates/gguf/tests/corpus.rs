//! The corpus of crafted bad files under `tests/corpus/`: each one must be refused with a
//! specific error variant whose one-line message names the field.
//!
//! The files are generated here (writer output plus byte surgery, or raw bytes); the
//! committed copies must equal what the generator produces. Set `MINFER_REGEN_CORPUS=1`
//! to rewrite them after changing a case.

mod common;

use common::{sample_writer, Raw};
use minfer_gguf::{GgufError, GgufFile, MetaType};
use std::path::PathBuf;

struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    expect: fn(&GgufError) -> bool,
    needles: &'static [&'static str],
}

fn valid() -> Vec<u8> {
    sample_writer().to_bytes().unwrap()
}

/// One metadata key-value with raw value bytes.
fn one_kv(key: &[u8], ty: u32, value: &[u8]) -> Vec<u8> {
    Raw::header(3, 0, 1).str(key).u32(ty).bytes(value).build()
}

/// One tensor info followed by aligned zeroed data of `data_len` bytes.
fn one_tensor(name: &[u8], dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
    Raw::header(3, 1, 0)
        .tensor(name, dims, ty, offset)
        .pad(32)
        .zeros(data_len)
        .build()
}

fn alignment_file(value: impl FnOnce(&mut Raw)) -> Vec<u8> {
    let mut r = Raw::header(3, 0, 1);
    value(&mut r);
    r.build()
}

fn cases() -> Vec<Case> {
    use GgufError as E;
    let patched = |at: usize, bytes: &[u8]| {
        let mut v = valid();
        v[at..at + bytes.len()].copy_from_slice(bytes);
        v
    };
    let bad_magic = patched(0, b"GGML");
    let version_1 = patched(4, &1u32.to_le_bytes());
    let big_endian = patched(4, &3u32.to_be_bytes());
    let mut nested = Raw::header(3, 0, 1);
    nested.key("deep", MetaType::Array);
    for _ in 0..20 {
        nested.u32(MetaType::Array as u32).u64(1);
    }
    let data_cut = {
        let v = valid();
        v[..v.len() - 40].to_vec()
    };
    let f32_id = 0;
    vec![
        Case {
            name: "empty",
            bytes: vec![],
            expect: |e| matches!(e, E::Truncated { .. }),
            needles: &["header magic", "byte 0", "needs 4 bytes, 0 remain"],
        },
        Case {
            name: "bad_magic",
            bytes: bad_magic,
            expect: |e| matches!(e, E::BadMagic { .. }),
            needles: &["magic at byte 0"],
        },
        Case {
            name: "version_1",
            bytes: version_1,
            expect: |e| matches!(e, E::UnsupportedVersion { version: 1 }),
            needles: &["version 1 at byte 4"],
        },
        Case {
            name: "big_endian",
            bytes: big_endian,
            expect: |e| matches!(e, E::UnsupportedVersion { .. }),
            needles: &["version 50331648", "little-endian"],
        },
        Case {
            name: "truncated_header",
            bytes: valid()[..20].to_vec(),
            expect: |e| matches!(e, E::Truncated { .. }),
            needles: &["header metadata count at byte 16 needs 8 bytes, 4 remain"],
        },
        Case {
            name: "truncated_string_value",
            bytes: one_kv(
                b"k",
                MetaType::String as u32,
                &[10, 0, 0, 0, 0, 0, 0, 0, b'a', b'b'],
            ),
            expect: |e| matches!(e, E::Truncated { .. }),
            needles: &["metadata #0 `k` string value at byte 45 needs 10 bytes, 2 remain"],
        },
        Case {
            name: "huge_key_length",
            bytes: Raw::header(3, 0, 1).u64(u64::MAX).bytes(b"abc").build(),
            expect: |e| matches!(e, E::Truncated { .. }),
            needles: &["metadata #0 key at byte 32 needs 18446744073709551615 bytes, 3 remain"],
        },
        Case {
            name: "huge_array_count",
            bytes: Raw::header(3, 0, 1)
                .key("arr", MetaType::Array)
                .u32(MetaType::U32 as u32)
                .u64(1 << 60)
                .zeros(16)
                .build(),
            expect: |e| matches!(e, E::Truncated { .. }),
            needles: &[
                "metadata #0 `arr` array of 1152921504606846976 u32",
                "16 remain",
            ],
        },
        Case {
            name: "huge_tensor_count",
            bytes: Raw::header(3, u64::MAX, 0).build(),
            expect: |e| matches!(e, E::Truncated { .. }),
            needles: &["tensor info #0 name length at byte 24"],
        },
        Case {
            name: "truncated_tensor_dims",
            bytes: Raw::header(3, 1, 0)
                .str(b"blk.0.attn_q.weight")
                .u32(2)
                .u64(32)
                .bytes(&[1, 2, 3])
                .build(),
            expect: |e| matches!(e, E::Truncated { .. }),
            needles: &[
                "tensor info #0 `blk.0.attn_q.weight` dims at byte 63 needs 8 bytes, 3 remain",
            ],
        },
        Case {
            name: "unknown_value_type",
            bytes: one_kv(b"k", 13, &[0; 8]),
            expect: |e| matches!(e, E::UnknownValueType { id: 13, .. }),
            needles: &["metadata #0 `k` value type at byte 33"],
        },
        Case {
            name: "unknown_array_element_type",
            bytes: one_kv(
                b"k",
                MetaType::Array as u32,
                &[99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            expect: |e| matches!(e, E::UnknownValueType { id: 99, .. }),
            needles: &["metadata #0 `k` array element type at byte 37"],
        },
        Case {
            name: "nesting_too_deep",
            bytes: nested.build(),
            expect: |e| matches!(e, E::NestingTooDeep { max: 16, .. }),
            needles: &["metadata #0 `deep`[0][0]", "deeper than 16"],
        },
        Case {
            name: "invalid_utf8_key",
            bytes: one_kv(&[b'a', 0xff, 0xfe], MetaType::U8 as u32, &[1]),
            expect: |e| matches!(e, E::InvalidUtf8 { .. }),
            needles: &["metadata #0 key at byte 32"],
        },
        Case {
            name: "invalid_utf8_string_value",
            bytes: one_kv(
                b"k",
                MetaType::String as u32,
                &[2, 0, 0, 0, 0, 0, 0, 0, 0xc3, 0x28],
            ),
            expect: |e| matches!(e, E::InvalidUtf8 { .. }),
            needles: &["metadata #0 `k` string value at byte 45"],
        },
        Case {
            name: "invalid_utf8_tensor_name",
            bytes: one_tensor(&[0x80], &[1], f32_id, 0, 4),
            expect: |e| matches!(e, E::InvalidUtf8 { .. }),
            needles: &["tensor info #0 name at byte 32"],
        },
        Case {
            name: "duplicate_key",
            bytes: Raw::header(3, 0, 2)
                .key("k", MetaType::U8)
                .bytes(&[1])
                .key("k", MetaType::U8)
                .bytes(&[2])
                .build(),
            expect: |e| matches!(e, E::DuplicateKey { .. }),
            needles: &["duplicate metadata key `k` at byte 38"],
        },
        Case {
            name: "duplicate_tensor",
            bytes: Raw::header(3, 2, 0)
                .tensor(b"w", &[8], f32_id, 0)
                .tensor(b"w", &[8], f32_id, 32)
                .pad(32)
                .zeros(64)
                .build(),
            expect: |e| matches!(e, E::DuplicateTensor { index: 1, .. }),
            needles: &["duplicate tensor name `w` in tensor info #1 at byte 57"],
        },
        Case {
            name: "too_many_dims",
            bytes: one_tensor(b"t", &[1, 1, 1, 1, 1], f32_id, 0, 4),
            expect: |e| matches!(e, E::TooManyDims { n_dims: 5, .. }),
            needles: &["tensor info #0 `t` n_dims at byte 33 is 5"],
        },
        Case {
            name: "element_count_overflow",
            bytes: one_tensor(b"t", &[1 << 32, 1 << 32, 4], f32_id, 0, 4),
            expect: |e| matches!(e, E::BadDims { .. }),
            needles: &[
                "tensor info #0 `t` dims",
                "at byte 37",
                "element count overflows",
            ],
        },
        Case {
            name: "byte_size_overflow",
            bytes: one_tensor(b"t", &[1 << 62], f32_id, 0, 4),
            expect: |e| matches!(e, E::BadDims { .. }),
            needles: &["tensor info #0 `t` dims", "byte size overflows"],
        },
        Case {
            name: "negative_dim",
            bytes: one_tensor(b"t", &[4, -2i64 as u64], f32_id, 0, 4),
            expect: |e| matches!(e, E::BadDims { .. }),
            needles: &["tensor info #0 `t` dims", "negative dimension"],
        },
        Case {
            name: "unknown_tensor_type",
            bytes: one_tensor(b"t", &[32], 4, 0, 32),
            expect: |e| matches!(e, E::UnknownTensorType { id: 4, .. }),
            needles: &["tensor info #0 `t` type at byte 45", "id 4"],
        },
        Case {
            name: "row_not_block_multiple",
            bytes: one_tensor(b"t", &[100, 2], 12, 0, 288),
            expect: |e| matches!(e, E::RowNotBlockMultiple { row: 100, .. }),
            needles: &["tensor info #0 `t` row length 100", "Q4_K block size 256"],
        },
        Case {
            name: "misaligned_tensor",
            bytes: one_tensor(b"t", &[1], f32_id, 8, 64),
            expect: |e| matches!(e, E::MisalignedTensor { data_offset: 8, .. }),
            needles: &[
                "tensor info #0 `t` data offset 8 at byte 49",
                "alignment 32",
            ],
        },
        Case {
            name: "data_out_of_bounds",
            bytes: data_cut,
            expect: |e| matches!(e, E::TensorOutOfBounds { .. }),
            needles: &["tensor `c` data at bytes", "outside the file"],
        },
        Case {
            name: "huge_tensor_offset",
            bytes: one_tensor(b"t", &[1], f32_id, 1 << 63, 4),
            expect: |e| matches!(e, E::TensorOutOfBounds { .. }),
            needles: &["tensor `t` data at bytes 9223372036854775872"],
        },
        Case {
            name: "tensor_overlap",
            bytes: Raw::header(3, 2, 0)
                .tensor(b"a", &[32], f32_id, 0)
                .tensor(b"b", &[8], f32_id, 64)
                .pad(32)
                .zeros(128)
                .build(),
            expect: |e| matches!(e, E::TensorOverlap { .. }),
            needles: &["tensor `b` data", "overlaps tensor `a`"],
        },
        Case {
            name: "alignment_zero",
            bytes: alignment_file(|r| {
                r.key("general.alignment", MetaType::U32).u32(0);
            }),
            expect: |e| matches!(e, E::BadAlignment { .. }),
            needles: &["general.alignment 0 at byte 53"],
        },
        Case {
            name: "alignment_not_power_of_two",
            bytes: alignment_file(|r| {
                r.key("general.alignment", MetaType::U32).u32(48);
            }),
            expect: |e| matches!(e, E::BadAlignment { .. }),
            needles: &["general.alignment 48"],
        },
        Case {
            name: "alignment_string",
            bytes: alignment_file(|r| {
                r.key("general.alignment", MetaType::String).str(b"32");
            }),
            expect: |e| matches!(e, E::BadAlignment { .. }),
            needles: &["general.alignment \"32\""],
        },
    ]
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

#[test]
fn committed_corpus_matches_the_generator() {
    let dir = corpus_dir();
    let cases = cases();
    if minfer_env::REGEN_CORPUS
        .get_or(false)
        .expect("MINFER_REGEN_CORPUS")
    {
        std::fs::create_dir_all(&dir).unwrap();
        for c in &cases {
            std::fs::write(dir.join(format!("{}.gguf", c.name)), &c.bytes).unwrap();
        }
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut expected: Vec<String> = cases.iter().map(|c| format!("{}.gguf", c.name)).collect();
    expected.sort();
    assert_eq!(
        on_disk, expected,
        "corpus files differ from the generator's cases"
    );
    for c in &cases {
        let committed = std::fs::read(dir.join(format!("{}.gguf", c.name))).unwrap();
        assert!(
            committed == c.bytes,
            "{}: committed bytes are stale",
            c.name
        );
    }
}

#[test]
fn every_corpus_file_is_refused_with_its_error() {
    for c in cases() {
        let bytes = std::fs::read(corpus_dir().join(format!("{}.gguf", c.name))).unwrap();
        let err = match GgufFile::from_bytes(bytes) {
            Ok(_) => panic!("{}: accepted", c.name),
            Err(e) => e,
        };
        let msg = err.to_string();
        assert!((c.expect)(&err), "{}: unexpected variant {err:?}", c.name);
        assert!(
            !msg.contains('\n'),
            "{}: multi-line message {msg:?}",
            c.name
        );
        for needle in c.needles {
            assert!(msg.contains(needle), "{}: {msg:?} lacks {needle:?}", c.name);
        }
    }
}

#[test]
fn corpus_files_fail_the_same_way_through_open() {
    for c in cases() {
        let path = corpus_dir().join(format!("{}.gguf", c.name));
        let via_open = GgufFile::open(&path).err().map(|e| e.to_string());
        let via_bytes = GgufFile::from_bytes(c.bytes).err().map(|e| e.to_string());
        assert!(via_open.is_some(), "{}: accepted by open", c.name);
        assert_eq!(via_open, via_bytes, "{}", c.name);
    }
}

#[test]
fn the_valid_base_is_accepted_in_versions_2_and_3() {
    let mut v = valid();
    assert_eq!(GgufFile::from_bytes(v.clone()).unwrap().version(), 3);
    v[4..8].copy_from_slice(&2u32.to_le_bytes());
    let f = GgufFile::from_bytes(v).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.tensors().len(), 3);
}
