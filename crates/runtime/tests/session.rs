//! KV sessions on tiny random-weight models: a restored session continues bit for bit as
//! if the process had never stopped (every KV format, plain engines and server slots),
//! and every damaged or foreign file is refused with a named error, leaving the file and
//! the engine as they were.

use std::path::{Path, PathBuf};

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::KvType;
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::sampling::argmax;
use minfer_runtime::session::{self, SessionError};
use minfer_runtime::{Engine, EngineOptions, MultiEngine};

fn opts(n_ctx: usize, types: [KvType; 2]) -> EngineOptions {
    EngineOptions {
        n_threads: 2,
        n_ctx: Some(n_ctx),
        backend: None,
        n_batch: 512,
        cache_type_k: types[0],
        cache_type_v: types[1],
    }
}

fn spec() -> TinySpec {
    TinySpec::qwen2(GgmlType::Q8_0, 75)
}

fn engine_of(spec: &TinySpec, n_ctx: usize, types: [KvType; 2]) -> Engine {
    let file = GgufFile::from_bytes(tiny_model_bytes(spec).expect("writer")).expect("reader");
    Engine::from_gguf(file, &opts(n_ctx, types)).expect("engine")
}

fn engine(types: [KvType; 2]) -> Engine {
    engine_of(&spec(), 64, types)
}

fn prompt() -> Vec<u32> {
    (0..13).map(|i| (i * 37 + 5) % 512).collect()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-session-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Greedy decode of `n` tokens from `logits` at position `pos`, returning every logits
/// row's bits (the strictest comparison).
fn decode(e: &mut Engine, mut logits: Vec<f32>, mut pos: usize, n: usize) -> Vec<Vec<u32>> {
    let mut rows = Vec::new();
    for _ in 0..n {
        rows.push(logits.iter().map(|x| x.to_bits()).collect());
        let t = argmax(&logits);
        logits = e.forward(&[t], pos, 1).expect("decode");
        pos += 1;
    }
    rows
}

/// Prefill the prompt and decode `n` tokens: the history the KV holds (the prompt plus
/// every fed token) and the logits of the next step.
fn run_to(e: &mut Engine, n: usize) -> (Vec<u32>, Vec<f32>) {
    let mut hist = prompt();
    let mut logits = e.prefill(&hist, 0).expect("prefill");
    for _ in 0..n {
        let t = argmax(&logits);
        logits = e.forward(&[t], hist.len(), 1).expect("decode");
        hist.push(t);
    }
    (hist, logits)
}

#[test]
fn a_restored_session_continues_bit_for_bit_in_every_kv_format() {
    let d = dir("continue");
    for types in [
        [KvType::F32; 2],
        [KvType::F16; 2],
        [KvType::Q8_0; 2],
        [KvType::Q8_0, KvType::F16],
    ] {
        // Never stopping: 5 decode steps, then 6 more.
        let mut straight = engine(types);
        let (_, logits) = run_to(&mut straight, 5);
        let want = decode(&mut straight, logits, prompt().len() + 5, 6);

        // Stopping after 5: save, then a new engine restores and continues.
        let path = d.join(format!("s-{}-{}.kv", types[0], types[1]));
        let mut first = engine(types);
        let (hist, _) = run_to(&mut first, 5);
        session::save(&mut first, &hist, &path).expect("save");
        drop(first);
        let mut second = engine(types);
        let restored = session::load(&mut second, &path).expect("load");
        assert_eq!(restored, hist);
        assert_eq!(second.seq_len(), hist.len());
        // The last stored token's logits come from running it again, at its position.
        let last = *hist.last().expect("history");
        let logits = second
            .forward(&[last], hist.len() - 1, 1)
            .expect("rerun the last token");
        let got = decode(&mut second, logits, hist.len(), 6);
        assert_eq!(got, want, "{types:?}: the continuation differs");
    }
}

#[test]
fn a_slot_saved_in_one_server_engine_restores_into_another_slot() {
    let d = dir("slots");
    let file =
        || std::sync::Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec()).unwrap()).unwrap());
    let o = opts(128, [KvType::F32; 2]);
    let p = prompt();
    let step = |slot, tokens: Vec<u32>, pos0| minfer_runtime::SeqStep {
        slot,
        tokens,
        pos0,
        n_out: 1,
    };
    let mut a = MultiEngine::from_shared(file(), &o, 2).expect("multi");
    a.step(&[step(0, p.clone(), 0)]).expect("prefill");
    let path = d.join("slot.kv");
    session::save_slot(&mut a, 0, &p, &path).expect("save slot");
    let want = a.step(&[step(0, vec![7], p.len())]).expect("step")[0].clone();

    let mut b = MultiEngine::from_shared(file(), &o, 2).expect("multi");
    let h = session::load_slot(&mut b, 1, &path).expect("load into slot 1");
    assert_eq!(h, p);
    assert_eq!(b.slot_len(1).unwrap(), p.len());
    let got = b.step(&[step(1, vec![7], p.len())]).expect("step")[0].clone();
    assert_eq!(
        got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    // A slot's share (64 rows) must hold the history.
    let mut small = MultiEngine::from_shared(file(), &opts(16, [KvType::F32; 2]), 2).unwrap();
    let e = session::load_slot(&mut small, 0, &path).unwrap_err();
    assert!(matches!(e, SessionError::ContextTooSmall { .. }), "{e}");
}

/// Saves a session of `types` and returns its path and bytes.
fn saved(d: &Path, name: &str, types: [KvType; 2]) -> (PathBuf, Vec<u8>) {
    let mut e = engine(types);
    let (hist, _) = run_to(&mut e, 3);
    let path = d.join(name);
    session::save(&mut e, &hist, &path).expect("save");
    let bytes = std::fs::read(&path).expect("read back");
    (path, bytes)
}

/// Loads `path` into a fresh-state engine that already holds a sequence; a refusal must
/// leave that sequence intact.
fn refused(e: &mut Engine, path: &Path) -> SessionError {
    let before = e.seq_len();
    let err = session::load(e, path).expect_err("a damaged session must be refused");
    assert_eq!(e.seq_len(), before, "a refused load changed the engine");
    err
}

#[test]
fn every_truncation_and_bit_flip_is_refused_and_the_file_is_never_modified() {
    let d = dir("corrupt");
    let (orig, bytes) = saved(&d, "good.kv", [KvType::F32; 2]);
    let mut e = engine([KvType::F32; 2]);
    e.prefill(&[1, 2, 3], 0).expect("prefill");
    let victim = d.join("victim.kv");
    let mut cuts: Vec<usize> = (0..64).collect();
    cuts.extend((64..bytes.len()).step_by(bytes.len() / 97 + 1));
    cuts.push(bytes.len() - 1);
    for cut in cuts {
        std::fs::write(&victim, &bytes[..cut]).unwrap();
        let err = refused(&mut e, &victim).to_string();
        assert!(
            err.contains("damaged") || err.contains("magic"),
            "cut at {cut}: {err}"
        );
        assert!(!err.contains('\n'), "one line: {err}");
        assert_eq!(std::fs::read(&victim).unwrap(), &bytes[..cut], "cut {cut}");
    }
    let mut flips: Vec<usize> = (0..80).collect();
    flips.extend((80..bytes.len()).step_by(bytes.len() / 211 + 1));
    flips.push(bytes.len() - 1);
    for at in flips {
        for bit in [0u8, 7] {
            let mut bad = bytes.clone();
            bad[at] ^= 1 << bit;
            std::fs::write(&victim, &bad).unwrap();
            let err = refused(&mut e, &victim).to_string();
            assert!(
                err.contains("damaged") || err.contains("magic") || err.contains("version"),
                "flip at {at}.{bit}: {err}"
            );
            assert_eq!(std::fs::read(&victim).unwrap(), bad, "flip {at}");
        }
    }
    assert_eq!(
        std::fs::read(&orig).unwrap(),
        bytes,
        "the original never changes"
    );
    // The good file still loads after all that.
    session::load(&mut e, &orig).expect("the original loads");
}

#[test]
fn foreign_files_are_refused_with_what_differs() {
    let d = dir("foreign");
    let (path, bytes) = saved(&d, "f32.kv", [KvType::F32; 2]);
    // Another KV format.
    let mut f16 = engine([KvType::F16; 2]);
    let e = refused(&mut f16, &path).to_string();
    assert!(
        e.contains("f32") && e.contains("f16") && e.contains("--cache-type"),
        "{e}"
    );
    // Another quantisation of the same model, and other weights of the same shape.
    for other in [
        TinySpec::qwen2(GgmlType::Q4_0, 75),
        TinySpec::qwen2(GgmlType::Q8_0, 76),
    ] {
        let mut o = engine_of(&other, 64, [KvType::F32; 2]);
        let e = refused(&mut o, &path).to_string();
        assert!(e.contains("another model"), "{e}");
    }
    // Another architecture.
    let mut q3 = engine_of(&TinySpec::qwen3(GgmlType::Q8_0, 75), 64, [KvType::F32; 2]);
    let e = refused(&mut q3, &path).to_string();
    assert!(e.contains("another model") && e.contains("qwen2"), "{e}");
    // A context too small for the history.
    let mut small = engine_of(&spec(), 8, [KvType::F32; 2]);
    let e = refused(&mut small, &path).to_string();
    assert!(e.contains("16 tokens") && e.contains("holds 8"), "{e}");
    // A wrong magic, a future version (checksummed, so only the version is wrong).
    let mut e32 = engine([KvType::F32; 2]);
    let bad = d.join("bad.kv");
    std::fs::write(&bad, b"GGUF\x03\0\0\0 not a session at all").unwrap();
    let e = refused(&mut e32, &bad).to_string();
    assert!(e.contains("bad magic"), "{e}");
    let mut v2 = bytes.clone();
    v2[8] = 2;
    std::fs::write(&bad, &v2).unwrap();
    let e = refused(&mut e32, &bad).to_string();
    assert!(e.contains("version 2"), "{e}");
    // A missing file names itself.
    let e = refused(&mut e32, &d.join("absent.kv")).to_string();
    assert!(e.contains("absent.kv"), "{e}");
}

#[test]
fn a_save_replaces_the_file_atomically_and_refuses_history_the_kv_lacks() {
    let d = dir("atomic");
    let (path, first) = saved(&d, "s.kv", [KvType::F32; 2]);
    let mut e = engine([KvType::F32; 2]);
    let (hist, _) = run_to(&mut e, 1);
    let mut longer = hist.clone();
    longer.push(9);
    let err = session::save(&mut e, &longer, &path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds"), "{err}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        first,
        "a refused save writes nothing"
    );
    session::save(&mut e, &hist, &path).expect("save over");
    assert_ne!(std::fs::read(&path).unwrap(), first);
    let left: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .map(|x| x.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "no temporary left behind: {left:?}");
}

#[test]
fn packed_kv_formats_shrink_the_regions() {
    let f32 = engine([KvType::F32; 2]);
    let f16 = engine([KvType::F16; 2]);
    let q8 = engine([KvType::Q8_0; 2]);
    assert_eq!(f16.kv_bytes() * 2, f32.kv_bytes());
    // 34 bytes per 32 values instead of 128.
    assert_eq!(q8.kv_bytes() * 128, f32.kv_bytes() * 34);
    let mut sizes = Vec::new();
    for mut e in [f32, f16, q8] {
        e.prefill(&prompt(), 0).expect("prefill");
        sizes.push(e.pool_elems());
    }
    assert!(sizes[0] > sizes[1] && sizes[1] > sizes[2], "{sizes:?}");
}
