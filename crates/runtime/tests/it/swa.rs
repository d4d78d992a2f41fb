//! Sliding-window KV rings on a tiny Gemma 3 (local layers with a 4-row window): a ringed
//! engine gives bit for bit the logits of one keeping every row, through prompts many
//! times the ring and decode past it, on plain engines, server slots and restored
//! sessions; and a rewind the ring cannot serve is refused or prefilled again, never
//! computed on overwritten rows.

use std::path::PathBuf;

use minfer_gguf::{GgmlType, GgufFile};
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::sampling::argmax;
use minfer_runtime::session;
use minfer_runtime::{Engine, EngineOptions, KvHistory, MultiEngine, SeqStep};

const N_CTX: usize = 96;
/// Prefill chunks of 4: the rings hold the window plus a verify block (17 tokens), so
/// 20 rows of 96, and a 60-token prompt wraps them three times.
const N_BATCH: usize = 4;

fn opts(swa_full: bool) -> EngineOptions {
    EngineOptions {
        n_threads: 2,
        n_ctx: Some(N_CTX),
        n_batch: N_BATCH,
        swa_full,
        ..EngineOptions::default()
    }
}

fn file() -> GgufFile {
    let spec = TinySpec::gemma3(GgmlType::Q8_0, 11);
    GgufFile::from_bytes(tiny_model_bytes(&spec).expect("writer")).expect("reader")
}

fn engine(swa_full: bool) -> Engine {
    Engine::from_gguf(file(), &opts(swa_full)).expect("engine")
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 5) % 200).collect()
}

/// The prompt's last logits, then `n` greedy steps' logits.
fn greedy(e: &mut Engine, prompt: &[u32], pos0: usize, n: usize) -> Vec<Vec<f32>> {
    let mut out = vec![e.prefill(&prompt[pos0..], pos0).expect("prefill")];
    for i in 0..n {
        let t = argmax(out.last().unwrap()) as u32;
        out.push(e.forward(&[t], prompt.len() + i, 1).expect("decode"));
    }
    out
}

#[test]
fn a_ringed_engine_gives_the_logits_of_one_keeping_every_row() {
    let p = prompt(60);
    let mut ringed = engine(false);
    let mut full = engine(true);
    assert!(ringed.swa().active() && !full.swa().active());
    assert!(
        ringed.kv_bytes() < full.kv_bytes(),
        "{} vs {}",
        ringed.kv_bytes(),
        full.kv_bytes()
    );
    let a = greedy(&mut ringed, &p, 0, 12);
    let b = greedy(&mut full, &p, 0, 12);
    assert_eq!(a, b, "ringed and full KV differ");
}

#[test]
fn a_rewind_behind_the_ring_is_refused_and_reuse_starts_over() {
    let p = prompt(60);
    let mut e = engine(false);
    greedy(&mut e, &p, 0, 0);
    // Going on where the rows end, or a little behind, is served.
    assert!(e.keeps(60) && e.keeps(50));
    // Far behind, the local layers' rows were overwritten.
    assert!(!e.keeps(20));
    let err = e.forward(&p[20..21], 20, 1).unwrap_err().to_string();
    assert!(err.contains("prefill from position 0"), "{err}");
    // The reuse rule turns that into a fresh prefill, and the answer is a fresh one's.
    let mut other = p[..21].to_vec();
    other.extend(prompt(9).iter().map(|t| t + 1));
    let mut kv = KvHistory::from_tokens(p.clone());
    let reuse = kv.reuse_if(&other, |k| e.keeps(k));
    assert_eq!(reuse.kept, 0);
    let got = greedy(&mut e, &other, 0, 4);
    let want = greedy(&mut engine(true), &other, 0, 4);
    assert_eq!(got, want);
    // A full-size engine reuses that prefix.
    let mut f = engine(true);
    greedy(&mut f, &p, 0, 0);
    assert!(f.keeps(20));
}

#[test]
fn server_slots_ring_their_rows_separately() {
    let p = prompt(45);
    let q = prompt(38).iter().map(|t| t + 3).collect::<Vec<_>>();
    let mut m =
        MultiEngine::from_shared(std::sync::Arc::new(file()), &opts(false), 2).expect("two slots");
    let mut last = [Vec::new(), Vec::new()];
    // Both slots prefill together, a chunk of each per step.
    let (mut a, mut b) = (0, 0);
    while a < p.len() || b < q.len() {
        let mut steps = Vec::new();
        for (slot, seq, at) in [(0, &p, &mut a), (1, &q, &mut b)] {
            if *at < seq.len() {
                let end = (*at + 7).min(seq.len());
                steps.push(SeqStep {
                    slot,
                    tokens: seq[*at..end].to_vec(),
                    pos0: *at,
                    n_out: 1,
                });
                *at = end;
            }
        }
        let logits = m.step(&steps).expect("step");
        for (s, l) in steps.iter().zip(logits) {
            last[s.slot] = l;
        }
    }
    for (slot, seq) in [(0, &p), (1, &q)] {
        let want = greedy(&mut engine(true), seq, 0, 0).remove(0);
        assert_eq!(
            last[slot], want,
            "slot {slot} against a lone full-size engine"
        );
    }
    assert!(m.keeps(0, 40) && !m.keeps(0, 10));
}

/// A directory of its own, removed when the test ends.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_restored_ringed_session_goes_on_bit_for_bit() {
    let dir = TempDir(std::env::temp_dir().join(format!("minfer-swa-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("s.kv");
    let p = prompt(50);
    let mut e = engine(false);
    let whole = greedy(&mut e, &p, 0, 6);
    let mut e = engine(false);
    greedy(&mut e, &p, 0, 0);
    session::save(&mut e, &p, &path).expect("save");
    let mut back = engine(false);
    let history = session::load(&mut back, &path).expect("restore");
    assert_eq!(history, p);
    // Going on from the restored rows: the last prompt token runs again, for its logits.
    let resumed = greedy(&mut back, &p, p.len() - 1, 6);
    assert_eq!(resumed, whole);
    // What the ring overwrote is not served after a restore either.
    assert!(!back.keeps(10));
    // An engine keeping every row would read the stale rows: refused by name.
    let err = session::load(&mut engine(true), &path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--swa-full"), "{err}");
}
