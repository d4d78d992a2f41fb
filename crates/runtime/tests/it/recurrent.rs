//! Hybrid recurrent models on the tiny Qwen3.5 (Gated DeltaNet layers beside gated
//! attention): the state is carried from step to step (decoding token by token gives the
//! prompt's logits; zeroing the state changes them), greedy decode is bitwise the same
//! across thread counts, graph reuse and batch composition, speculative decoding rolls
//! the state back on rejected drafts, everything that would rewind the state (an
//! earlier position, a context shift) prefills again or is refused, and a session file
//! carries the state, so a restored sequence goes on bit for bit.

use std::sync::Arc;

use minfer_gguf::{GgmlType, GgufFile};
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::sampling::argmax;
use minfer_runtime::session;
use minfer_runtime::{
    generate, generate_speculative, Engine, EngineOptions, GenerateOptions, KvHistory, MultiEngine,
    NgramLookup, SamplingParams, SeqStep, Speculator,
};
use minfer_tokenizer::Tokenizer;

const N_CTX: usize = 128;

/// The measured bound between a prompt prefilled at once and token by token (different
/// batch shapes sum in other orders): observed 0 on this model.
const DECODE_BOUND: f32 = 1e-4;

pub(crate) fn file() -> Arc<GgufFile> {
    let spec = TinySpec::qwen35(GgmlType::F32, 1);
    Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec).expect("writer")).expect("reader"))
}

pub(crate) fn opts(threads: usize, n_batch: usize) -> EngineOptions {
    EngineOptions {
        n_threads: threads,
        n_ctx: Some(N_CTX),
        n_batch,
        backend: Some("cpu".into()),
        ..EngineOptions::default()
    }
}

pub(crate) fn engine(threads: usize) -> Engine {
    Engine::from_arc(file(), &opts(threads, 64)).expect("engine")
}

pub(crate) fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + 5 + salt * 11) % 250)
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The prompt's last logits, then `n` greedy steps' logits.
fn greedy(e: &mut Engine, p: &[u32], n: usize) -> Vec<Vec<f32>> {
    let mut out = vec![e.prefill(p, 0).expect("prefill")];
    for i in 0..n {
        let t = argmax(out.last().unwrap()) as u32;
        out.push(e.forward(&[t], p.len() + i, 1).expect("decode"));
    }
    out
}

#[test]
fn the_state_is_carried_from_step_to_step() {
    let p = prompt(20, 0);
    let mut whole = engine(2);
    assert!(whole.is_recurrent());
    let want = whole.prefill(&p, 0).expect("prefill");
    // Token by token: each step reads the state the previous one left.
    let mut e = engine(2);
    let mut got = Vec::new();
    for (i, &t) in p.iter().enumerate() {
        got = e.forward(&[t], i, 1).expect("step");
    }
    let d = max_diff(&got, &want);
    eprintln!("prefill vs token by token: max |dlogit| {d:.3e}");
    assert!(d <= DECODE_BOUND, "{d}");
    // The same last step without the state the prompt built: other logits.
    let mut e = engine(2);
    e.prefill(&p[..19], 0).expect("prefill");
    e.zero_recurrent_state().expect("zero");
    let cut = e.forward(&p[19..], 19, 1).expect("step");
    let d = max_diff(&cut, &want);
    eprintln!("with the state zeroed: max |dlogit| {d:.3e}");
    assert!(d > 0.1, "zeroing the recurrent state changed nothing ({d})");
}

/// The bound between the chunked delta rule's prefill and token-by-token decode (the
/// same recurrence regrouped; observed up to 1.6e-5 on these models, logits of order 1).
const CHUNK_BOUND: f32 = 1e-4;

/// With `--delta-chunk`, prefill runs whole chunks of the prompt in the chunked form:
/// the logits and the state it leaves equal token-by-token decode within
/// [`CHUNK_BOUND`] (on every hybrid variant, chunks smaller than the prompt and a
/// partial chunk at its end), stay bitwise the same across thread counts and across
/// prompt steps cut at multiples of the chunk, and do differ in the last bits from the
/// token-by-token form (so the chunked form did run).
#[test]
fn the_chunked_prefill_equals_token_by_token_decode_within_the_bound() {
    for spec in [
        TinySpec::qwen35(GgmlType::F32, 1),
        TinySpec::qwen35moe(GgmlType::F32, 2),
        TinySpec::qwen3next(GgmlType::F32, 2),
    ] {
        let f = Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap());
        let make = |threads, n_batch, delta_chunk| {
            let o = EngineOptions {
                delta_chunk,
                ..opts(threads, n_batch)
            };
            Engine::from_arc(Arc::clone(&f), &o).unwrap()
        };
        let p = prompt(30, 4);
        let chunked = greedy(&mut make(2, 64, 8), &p, 6);
        let plain = greedy(&mut make(2, 64, 0), &p, 6);
        assert_ne!(
            chunked[0], plain[0],
            "{}: the chunked form did not run",
            spec.arch
        );
        let mut e = make(2, 64, 8);
        let mut stepped = Vec::new();
        for (i, &t) in p.iter().enumerate() {
            stepped = e.forward(&[t], i, 1).unwrap();
        }
        let d = max_diff(&chunked[0], &stepped);
        eprintln!("{}: chunked prefill vs token by token: {d:.3e}", spec.arch);
        assert!(d <= CHUNK_BOUND, "{}: {d}", spec.arch);
        // The state it leaves: the greedy steps after the prompt.
        for (i, (a, b)) in chunked.iter().zip(&plain).enumerate().skip(1) {
            let d = max_diff(a, b);
            assert!(d <= CHUNK_BOUND, "{}: step {i}: {d}", spec.arch);
        }
        assert_eq!(
            greedy(&mut make(1, 64, 8), &p, 6),
            chunked,
            "{}: threads",
            spec.arch
        );
        assert_eq!(
            greedy(&mut make(2, 16, 8), &p, 6),
            chunked,
            "{}: steps of 16",
            spec.arch
        );
    }
}

/// The MoE variants (Qwen3.5-MoE; Qwen3-Next with its joint beta/alpha and grouped key
/// heads) carry their state and decode bitwise the same on 1 and 2 threads too.
#[test]
fn the_moe_variants_carry_their_state_across_threads() {
    for spec in [
        TinySpec::qwen35moe(GgmlType::F32, 2),
        TinySpec::qwen3next(GgmlType::F32, 2),
    ] {
        let f = Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap());
        let make = |threads| Engine::from_arc(Arc::clone(&f), &opts(threads, 64)).unwrap();
        let p = prompt(16, 6);
        let one = greedy(&mut make(1), &p, 8);
        assert_eq!(
            greedy(&mut make(2), &p, 8),
            one,
            "{}: 1 vs 2 threads",
            spec.arch
        );
        let mut e = make(2);
        let mut got = Vec::new();
        for (i, &t) in p.iter().enumerate() {
            got = e.forward(&[t], i, 1).unwrap();
        }
        let d = max_diff(&got, &one[0]);
        assert!(d <= DECODE_BOUND, "{}: token by token {d}", spec.arch);
        let mut e = make(2);
        e.prefill(&p[..15], 0).unwrap();
        e.zero_recurrent_state().unwrap();
        let cut = e.forward(&p[15..], 15, 1).unwrap();
        assert!(
            max_diff(&cut, &one[0]) > 0.1,
            "{}: state not read",
            spec.arch
        );
    }
}

#[test]
fn greedy_decode_is_bitwise_the_same_across_threads_and_graph_reuse() {
    let p = prompt(24, 1);
    let one = greedy(&mut engine(1), &p, 16);
    let two = greedy(&mut engine(2), &p, 16);
    assert_eq!(one, two, "1 vs 2 threads");
    let mut rebuilt = engine(2);
    rebuilt.set_rebuild_every_step(true);
    assert_eq!(
        greedy(&mut rebuilt, &p, 16),
        two,
        "graph reuse vs rebuilding"
    );
    // Prefill chunks of 5 give the same state as one chunk.
    let mut chunked = Engine::from_arc(file(), &opts(2, 5)).expect("engine");
    let c = greedy(&mut chunked, &p, 16);
    let d = max_diff(&c[0], &two[0]);
    assert!(d <= DECODE_BOUND, "chunked prefill: {d}");
    let tokens = |v: &[Vec<f32>]| v.iter().map(|l| argmax(l)).collect::<Vec<_>>();
    assert_eq!(tokens(&c), tokens(&two));
}

#[test]
fn four_concurrent_sequences_equal_each_alone() {
    let prompts: Vec<Vec<u32>> = (0..4).map(|s| prompt(9 + 3 * s as usize, s + 2)).collect();
    let multi = || MultiEngine::from_shared(file(), &opts(2, 64), 4).expect("slots");
    // All four at once: prefill together, then 8 decode steps together.
    let mut m = multi();
    let steps: Vec<SeqStep> = prompts
        .iter()
        .enumerate()
        .map(|(slot, p)| SeqStep {
            slot,
            tokens: p.clone(),
            pos0: 0,
            n_out: 1,
        })
        .collect();
    let mut together = vec![Vec::new(); 4];
    let mut last = m.step(&steps).expect("prefill");
    for _ in 0..8 {
        let steps: Vec<SeqStep> = (0..4)
            .map(|slot| {
                let t = argmax(&last[slot]) as u32;
                together[slot].push(t);
                SeqStep {
                    slot,
                    tokens: vec![t],
                    pos0: prompts[slot].len() + together[slot].len() - 1,
                    n_out: 1,
                }
            })
            .collect();
        last = m.step(&steps).expect("decode");
    }
    // Each alone, in another slot of a fresh engine, so slot and neighbours both differ.
    for (i, p) in prompts.iter().enumerate() {
        let mut m = multi();
        let slot = 3 - i;
        let mut l = m
            .step(&[SeqStep {
                slot,
                tokens: p.clone(),
                pos0: 0,
                n_out: 1,
            }])
            .expect("alone")
            .remove(0);
        let mut alone = Vec::new();
        for _ in 0..8 {
            let t = argmax(&l) as u32;
            alone.push(t);
            l = m
                .step(&[SeqStep {
                    slot,
                    tokens: vec![t],
                    pos0: p.len() + alone.len() - 1,
                    n_out: 1,
                }])
                .expect("alone")
                .remove(0);
        }
        assert_eq!(alone, together[i], "sequence {i}");
        assert_eq!(l, last[i], "sequence {i}: last logits");
        // And against a plain single-sequence engine.
        let plain = greedy(&mut engine(2), p, 8);
        assert_eq!(
            plain.last().unwrap(),
            &l,
            "sequence {i} against a plain engine"
        );
    }
}

#[test]
fn a_fork_copies_the_state_whole() {
    let p = prompt(15, 3);
    let mut m = MultiEngine::from_shared(file(), &opts(2, 64), 2).expect("slots");
    let step = |slot, tokens: Vec<u32>, pos0| SeqStep {
        slot,
        tokens,
        pos0,
        n_out: 1,
    };
    let first = m.step(&[step(0, p.clone(), 0)]).expect("prefill").remove(0);
    // Only the whole sequence can be forked: the state holds all of it.
    assert!(m.copy_prefix(0, 1, 10).is_err());
    m.copy_prefix(0, 1, p.len()).expect("fork");
    let t = argmax(&first) as u32;
    let out = m
        .step(&[step(0, vec![t], p.len()), step(1, vec![t], p.len())])
        .expect("both");
    assert_eq!(out[0], out[1], "the fork goes on as its source");
}

#[test]
fn rewinding_the_state_is_refused_and_reuse_starts_over() {
    let p = prompt(30, 4);
    let mut e = engine(2);
    greedy(&mut e, &p, 0);
    assert!(e.keeps(30) && e.keeps(0));
    assert!(!e.keeps(20), "the state cannot be rewound to position 20");
    let err = e.forward(&p[20..21], 20, 1).unwrap_err().to_string();
    assert!(err.contains("recurrent state"), "{err}");
    // The reuse rule prefills from 0, and the answer is a fresh engine's.
    let mut other = p[..21].to_vec();
    other.extend(prompt(6, 9));
    let mut kv = KvHistory::from_tokens(p.clone());
    assert_eq!(kv.reuse_if(&other, |k| e.keeps(k)).kept, 0);
    assert_eq!(greedy(&mut e, &other, 4), greedy(&mut engine(2), &other, 4));
}

pub(crate) fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// From `logits` at position `pos`: the greedy steps' logits, `n` of them.
pub(crate) fn go_on(
    e: &mut Engine,
    mut logits: Vec<f32>,
    mut pos: usize,
    n: usize,
) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(&logits) as u32;
        logits = e.forward(&[t], pos, 1).expect("decode");
        out.push(logits.clone());
        pos += 1;
    }
    out
}

#[test]
fn a_restored_session_carries_the_recurrent_state_bit_for_bit() {
    let d = std::env::temp_dir().join(format!("minfer-rec-session-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    let path = d.join("s.kv");
    let p = prompt(12, 5);
    // Never stopping: the prompt, then 8 greedy steps.
    let want = greedy(&mut engine(1), &p, 8);
    // Stopping after the prompt: save; a new engine restores and takes the next token.
    let mut first = engine(1);
    let logits = first.prefill(&p, 0).expect("prefill");
    // The state holds 12 positions: a shorter history is refused by name.
    let err = session::save(&mut first, &p[..11], &path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("recurrent state") && err.contains("qwen35"),
        "{err}"
    );
    assert!(!path.exists());
    session::save(&mut first, &p, &path).expect("save");
    drop(first);
    let mut second = engine(2);
    assert_eq!(session::load(&mut second, &path).expect("load"), p);
    assert_eq!(second.seq_len(), p.len());
    assert!(second.keeps(p.len()) && !second.keeps(p.len() - 1));
    let got = go_on(&mut second, logits.clone(), p.len(), 8);
    assert_eq!(bits(&got), bits(&want[1..]), "the continuation differs");
    // The state is what carries it: restored without it, the next step differs.
    let mut third = engine(1);
    session::load(&mut third, &path).expect("load");
    third.zero_recurrent_state().expect("zero");
    let zeroed = go_on(&mut third, logits, p.len(), 1);
    assert_ne!(bits(&zeroed), bits(&want[1..2]));

    // A file without the state (version 3's layout: version field 3, no state section)
    // is refused by name, and so is a damaged one.
    let bytes = std::fs::read(&path).expect("read back");
    let body = &bytes[..bytes.len() - 32];
    // The body ends with the state section and the conversation flag (none).
    let mut old = body[..body.len() - 1 - state_section_len()].to_vec();
    old[8..12].copy_from_slice(&3u32.to_le_bytes());
    old.push(0);
    let sum: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(&old).into();
    old.extend_from_slice(&sum);
    let old_path = d.join("v3.kv");
    std::fs::write(&old_path, &old).expect("write");
    let err = session::load(&mut engine(1), &old_path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("version 3") && err.contains("recurrent state"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Bytes of the tiny Qwen3.5's recurrent state section: the layer count, and per
/// recurrent layer its index, two counts and its conv and matrix values.
fn state_section_len() -> usize {
    let spec = TinySpec::qwen35(GgmlType::F32, 1);
    let ssm = spec.ssm.expect("a hybrid model");
    let layers = (0..spec.n_layer).filter(|&l| ssm.recurrent(l)).count();
    let values = (ssm.d_conv - 1) * ssm.channels() + ssm.h_v * ssm.s * ssm.s;
    4 + layers * (4 + 8 + 8 + 4 * values)
}

#[test]
fn a_slot_session_carries_its_state_into_another_slot() {
    let f = file();
    let o = opts(1, 64);
    let p = prompt(10, 2);
    let step = |slot, tokens: Vec<u32>, pos0| SeqStep {
        slot,
        tokens,
        pos0,
        n_out: 1,
    };
    let path = std::env::temp_dir().join(format!("minfer-rec-slot-{}.kv", std::process::id()));
    let mut a = MultiEngine::from_shared(Arc::clone(&f), &o, 2).expect("multi");
    a.step(&[step(1, prompt(7, 3), 0)])
        .expect("another sequence");
    a.step(&[step(0, p.clone(), 0)]).expect("prefill");
    session::save_slot(&mut a, 0, &p, &path).expect("save slot");
    let want = a.step(&[step(0, vec![7], p.len())]).expect("step")[0].clone();
    let mut b = MultiEngine::from_shared(f, &o, 2).expect("multi");
    b.step(&[step(0, prompt(9, 4), 0)])
        .expect("another sequence");
    assert_eq!(session::load_slot(&mut b, 1, &path).expect("load"), p);
    let got = b.step(&[step(1, vec![7], p.len())]).expect("step")[0].clone();
    assert_eq!(bits(&[got]), bits(&[want]));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_kv_figure_counts_attention_rows_and_the_recurrent_state() {
    let spec = TinySpec::qwen35(GgmlType::F32, 1);
    let ssm = spec.ssm.clone().expect("a hybrid model");
    let e = engine(1);
    let attention = (0..spec.n_layer).filter(|&l| !ssm.recurrent(l)).count();
    let rows = attention * 2 * spec.n_head_kv * spec.head_dim * 4 * N_CTX;
    let per_layer = (ssm.d_conv - 1) * ssm.channels() + ssm.h_v * ssm.s * ssm.s;
    let state = (spec.n_layer - attention) * per_layer * 4;
    assert_eq!(e.kv_bytes(), (rows + state) as u64);
}

#[test]
fn greedy_speculation_rolls_the_state_back_and_gives_plain_tokens() {
    let f = file();
    let mut target = Engine::from_arc(Arc::clone(&f), &opts(1, 64)).expect("engine");
    let tok = Tokenizer::from_gguf(target.file()).expect("tokenizer");
    let gen = GenerateOptions {
        max_tokens: 40,
        stop: Vec::new(),
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        constraint: None,
    };
    let mut drafted = 0;
    for text in [
        "A list: apples, pears, plums, apples, pears, plums, apples,",
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
        "abc abc abc abc abc abc",
    ] {
        let prompt = tok.encode(text, true, true);
        let plain = generate(&mut target, &tok, &prompt, &gen, |_| true)
            .expect("plain")
            .tokens;
        let mut spec = Speculator::new(Box::new(NgramLookup::new()), 5).unwrap();
        spec.set_fixed_depth(Some(3));
        let got =
            generate_speculative(&mut target, &tok, &prompt, 0, &gen, Some(&mut spec), |_| {
                true
            })
            .expect("speculative")
            .tokens;
        assert_eq!(got, plain, "{text:?}");
        let s = spec.stats();
        drafted += s.drafted - s.accepted;
    }
    assert!(
        drafted > 0,
        "no draft was ever rejected: the rollback went untested"
    );
}
