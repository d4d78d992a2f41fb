//! KV sessions on tiny random-weight models: a restored session continues bit for bit as
//! if the process had never stopped (every KV format, plain engines and server slots),
//! and every damaged or foreign file is refused with a named error, leaving the file and
//! the engine as they were.

use std::path::{Path, PathBuf};

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::KvType;
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::sampling::argmax;
use minfer_runtime::session::{self, SavedChat, SessionError};
use minfer_runtime::{Engine, EngineOptions, MultiEngine};
use minfer_tokenizer::ChatMessage;

fn opts(n_ctx: usize, types: [KvType; 2]) -> EngineOptions {
    EngineOptions {
        n_threads: 2,
        n_ctx: Some(n_ctx),
        backend: None,
        n_batch: 512,
        cache_type_k: types[0],
        cache_type_v: types[1],
        ..EngineOptions::default()
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

/// A directory of its own for one test, removed with everything in it when the test
/// ends, passed or failed.
struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("minfer-session-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    TempDir(d)
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

/// A conversation with multi-byte text, an empty message and a newline in one.
fn chat() -> SavedChat {
    SavedChat {
        system: Some("Be brief. ünïcødé".into()),
        messages: vec![
            ChatMessage::new("user", "Hello, how are you? 🙂"),
            ChatMessage::new("assistant", "Fine."),
            ChatMessage::new("user", ""),
            ChatMessage::new("assistant", "Line one\nline two"),
        ],
        dropped: 3,
    }
}

/// Truncates `bytes` at many points and flips bits across it: every variant is refused
/// (through `load`, and through `load_chat`), the engine keeps its sequence, the victim
/// file is left as written, and the original never changes.
fn assert_every_damage_is_refused(d: &Path, orig: &Path, bytes: &[u8]) {
    let mut e = engine([KvType::F32; 2]);
    e.prefill(&[1, 2, 3], 0).expect("prefill");
    let victim = d.join("victim.kv");
    let check = |e: &mut Engine, what: &str, ok: &dyn Fn(&str) -> bool| {
        let want = std::fs::read(&victim).unwrap();
        let err = refused(e, &victim).to_string();
        assert!(ok(&err), "{what}: {err}");
        assert!(!err.contains('\n'), "one line: {err}");
        let before = e.seq_len();
        let err = session::load_chat(e, &victim)
            .expect_err("refused")
            .to_string();
        assert!(ok(&err), "{what} (chat): {err}");
        assert_eq!(
            e.seq_len(),
            before,
            "{what}: a refused chat load changed the engine"
        );
        assert_eq!(
            std::fs::read(&victim).unwrap(),
            want,
            "{what}: the file changed"
        );
    };
    let mut cuts: Vec<usize> = (0..64).collect();
    cuts.extend((64..bytes.len()).step_by(bytes.len() / 97 + 1));
    // Every cut inside the conversation section and the checksum.
    cuts.extend(bytes.len().saturating_sub(160)..bytes.len());
    for cut in cuts {
        std::fs::write(&victim, &bytes[..cut]).unwrap();
        check(&mut e, &format!("cut at {cut}"), &|err| {
            err.contains("damaged") || err.contains("magic")
        });
    }
    let mut flips: Vec<usize> = (0..80).collect();
    flips.extend((80..bytes.len()).step_by(bytes.len() / 211 + 1));
    flips.extend(bytes.len().saturating_sub(160)..bytes.len());
    for at in flips {
        for bit in [0u8, 7] {
            let mut bad = bytes.to_vec();
            bad[at] ^= 1 << bit;
            std::fs::write(&victim, &bad).unwrap();
            check(&mut e, &format!("flip at {at}.{bit}"), &|err| {
                err.contains("damaged") || err.contains("magic") || err.contains("version")
            });
        }
    }
    assert_eq!(
        std::fs::read(orig).unwrap(),
        bytes,
        "the original never changes"
    );
    // The good file still loads after all that.
    session::load(&mut e, orig).expect("the original loads");
}

#[test]
fn every_truncation_and_bit_flip_is_refused_and_the_file_is_never_modified() {
    let d = dir("corrupt");
    let (orig, bytes) = saved(&d, "good.kv", [KvType::F32; 2]);
    assert_every_damage_is_refused(&d, &orig, &bytes);
}

#[test]
fn a_session_with_a_conversation_round_trips_and_every_damage_to_it_is_refused() {
    let d = dir("corrupt-chat");
    let mut e = engine([KvType::F32; 2]);
    let (hist, _) = run_to(&mut e, 3);
    let path = d.join("chat.kv");
    session::save_with(&mut e, &hist, Some(&chat()), &path).expect("save");
    let bytes = std::fs::read(&path).expect("read back");
    let mut fresh = engine([KvType::F32; 2]);
    let (tokens, got) = session::load_chat(&mut fresh, &path).expect("load");
    assert_eq!(tokens, hist);
    assert_eq!(got, chat(), "the conversation comes back exactly");
    assert_eq!(fresh.seq_len(), hist.len());
    assert_every_damage_is_refused(&d, &path, &bytes);

    // A file without a conversation is refused by a chat, before the engine changes.
    let (plain, _) = saved(&d, "plain.kv", [KvType::F32; 2]);
    let mut e = engine([KvType::F32; 2]);
    e.prefill(&[1, 2, 3], 0).expect("prefill");
    let err = session::load_chat(&mut e, &plain).unwrap_err();
    assert!(matches!(err, SessionError::NoConversation { .. }), "{err}");
    assert!(err.to_string().contains("no conversation"), "{err}");
    assert_eq!(e.seq_len(), 3, "a refused chat load changed the engine");
    // ... and `load` of a chat file gives the tokens alone.
    let mut e = engine([KvType::F32; 2]);
    assert_eq!(session::load(&mut e, &path).expect("load"), hist);
}

/// Rewrites a version-4 file of a model without sliding windows or recurrent layers, and
/// without a conversation, as `version` 3 (the same bytes less the empty recurrent state
/// section), 2 (less the ring step too, which is 0) or 1 (less the conversation flag
/// too), checksummed again.
fn as_older(v4: &[u8], version: u32) -> Vec<u8> {
    use sha2::Digest;
    let body = &v4[..v4.len() - 32];
    // The empty state section (a zero layer count) before the conversation flag.
    let state_at = body.len() - 5;
    assert_eq!(
        &body[state_at..],
        &[0; 5],
        "no recurrent state, no conversation"
    );
    let mut body = body.to_vec();
    body.drain(state_at..state_at + 4);
    if version == 3 {
        body[8..12].copy_from_slice(&3u32.to_le_bytes());
        let sum = sha2::Sha256::digest(&body);
        body.extend_from_slice(&sum);
        return body;
    }
    let body = &body[..];
    let arch_len = u16::from_le_bytes([body[12], body[13]]) as usize;
    // Magic, version, architecture, hyperparameters, digest, backend, formats, geometry.
    let step_at = 12 + 2 + arch_len + 8 * 8 + 3 * 4 + 1 + 32 + 2 + 2 + 3 * 8;
    assert_eq!(
        &body[step_at..step_at + 8],
        &[0; 8],
        "a file with a ring step"
    );
    let mut out = body[..step_at].to_vec();
    out.extend_from_slice(&body[step_at + 8..]);
    if version == 1 {
        assert_eq!(out.last(), Some(&0), "no conversation in this file");
        out.pop();
    }
    out[8..12].copy_from_slice(&version.to_le_bytes());
    let sum = sha2::Sha256::digest(&out);
    out.extend_from_slice(&sum);
    out
}

#[test]
fn version_1_2_and_3_files_still_load() {
    let d = dir("v1");
    let (path, bytes) = saved(&d, "s.kv", [KvType::F32; 2]);
    let want = session::load(&mut engine([KvType::F32; 2]), &path).expect("v4");
    for version in [3, 2] {
        std::fs::write(&path, as_older(&bytes, version)).unwrap();
        let mut e = engine([KvType::F32; 2]);
        assert_eq!(
            session::load(&mut e, &path).expect("loads"),
            want,
            "v{version}"
        );
    }
    std::fs::write(&path, as_older(&bytes, 1)).unwrap();
    let mut e = engine([KvType::F32; 2]);
    assert_eq!(session::load(&mut e, &path).expect("v1 loads"), want);
    let err = session::load_chat(&mut engine([KvType::F32; 2]), &path).unwrap_err();
    assert!(matches!(err, SessionError::NoConversation { .. }), "{err}");
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
    let mut v5 = bytes.clone();
    v5[8] = 5;
    std::fs::write(&bad, &v5).unwrap();
    let e = refused(&mut e32, &bad).to_string();
    assert!(
        e.contains("version 5") && e.contains("versions 1 to 4"),
        "{e}"
    );
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
    let left: Vec<_> = std::fs::read_dir(&*d)
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

fn multi_of(spec: &TinySpec, types: [KvType; 2], swa_full: bool) -> MultiEngine {
    let file = GgufFile::from_bytes(tiny_model_bytes(spec).expect("writer")).expect("reader");
    // Few tokens an execution, so a window's ring is smaller than a slot.
    let o = EngineOptions {
        swa_full,
        n_batch: 4,
        ..opts(128, types)
    };
    MultiEngine::from_shared(std::sync::Arc::new(file), &o, 2).expect("engine")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn rows_exported_from_one_slot_and_imported_into_another_continue_bit_for_bit() {
    let p = prompt();
    for types in [[KvType::F16; 2], [KvType::Q8_0, KvType::F16]] {
        let mut m = multi_of(&spec(), types, false);
        assert!(m.rows_portable());
        let run = |m: &mut MultiEngine, slot, tokens: &[u32], pos0| {
            let step = minfer_runtime::SeqStep {
                slot,
                tokens: tokens.to_vec(),
                pos0,
                n_out: 1,
            };
            m.step(&[step]).expect("step").remove(0)
        };
        let want = run(&mut m, 0, &p, 0);
        // Slot 1 holds another sequence, which the import must replace from position 0.
        run(&mut m, 1, &[3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 0);
        let first = m.export_rows(0, 0, 4).expect("export");
        let second = m.export_rows(0, 4, 4).expect("export");
        m.import_rows(1, 0, 4, &first).expect("import");
        m.import_rows(1, 4, 4, &second).expect("import");
        assert_eq!(m.slot_len(1).unwrap(), 8);
        let got = run(&mut m, 1, &p[8..], 8);
        assert!(bits(&got) == bits(&want), "{types:?}: imported rows differ");
        // Past what a slot holds, past the slot, or too few words: refused by name.
        assert!(m.export_rows(0, 10, 4).is_err());
        assert!(m.import_rows(1, 20, 4, &first).is_err());
        assert!(m.import_rows(1, 62, 4, &first).is_err());
        assert!(m.import_rows(1, 0, 8, &first).is_err());
    }
}

#[test]
fn the_kv_fingerprint_tells_models_and_kv_formats_apart() {
    let f16 = session::kv_fingerprint(&multi_of(&spec(), [KvType::F16; 2], false));
    assert_eq!(
        f16,
        session::kv_fingerprint(&multi_of(&spec(), [KvType::F16; 2], false)),
        "the same model and formats must share rows"
    );
    let q8 = session::kv_fingerprint(&multi_of(&spec(), [KvType::Q8_0, KvType::F16], false));
    let other = multi_of(
        &TinySpec::qwen2(GgmlType::Q8_0, 76),
        [KvType::F16; 2],
        false,
    );
    assert_ne!(f16, q8, "another K format");
    assert_ne!(f16, session::kv_fingerprint(&other), "another model");
}

#[test]
fn ringed_sliding_window_rows_are_not_portable_and_full_ones_are() {
    let gemma = TinySpec::gemma3(GgmlType::Q8_0, 11);
    let mut ringed = multi_of(&gemma, [KvType::F16; 2], false);
    let full = multi_of(&gemma, [KvType::F16; 2], true);
    assert!(!ringed.rows_portable() && full.rows_portable());
    let e = ringed.export_rows(0, 0, 0).unwrap_err().to_string();
    assert!(e.contains("--swa-full"), "{e}");
}
