//! State checkpoints of the tiny Qwen3.5: a later prompt that shares only part of what
//! ran goes on from the last checkpoint inside the shared prefix (its tail mark, or the
//! earlier prompt's end), bitwise as a fresh prefill of the whole prompt, on the plain
//! engine, in a conversation whose template drops the previous answer, in a slot of
//! the batched engine and in a slot forked from it; with checkpoints off it prefills from 0; a position no checkpoint
//! holds is refused, and a rewritten prefix's checkpoints are gone.

use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model_with_template, TinySpec};
use minfer_runtime::checkpoint::CHECKPOINT_TAIL;
use minfer_runtime::sampling::argmax;
use minfer_runtime::{
    generate, generate_shifting, Conversation, ConversationOptions, Engine, EngineOptions,
    GenerateOptions, KvHistory, MultiEngine, SamplingParams, SeqStep,
};
use minfer_tokenizer::Tokenizer;

use crate::recurrent::{bits, file, go_on, opts, prompt};

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        stop: Vec::new(),
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        constraint: None,
    }
}

/// An engine with `checkpoints` per sequence and prefill chunks of 8 tokens (so a
/// prompt's steps are cut by the batch and by the marks).
fn engine_with(checkpoints: usize) -> Engine {
    let o = EngineOptions {
        ctx_checkpoints: checkpoints,
        ..opts(1, 8)
    };
    Engine::from_arc(file(), &o).expect("engine")
}

/// `head` of `a`, then `tail`.
fn spliced(a: &[u32], head: usize, tail: &[u32]) -> Vec<u32> {
    [&a[..head], tail].concat()
}

/// The prompt's last logits and 6 greedy steps from a fresh engine.
fn fresh(p: &[u32]) -> Vec<Vec<f32>> {
    let mut e = engine_with(0);
    let first = e.prefill(p, 0).expect("fresh prefill");
    let mut out = vec![first.clone()];
    out.extend(go_on(&mut e, first, p.len(), 6));
    out
}

#[test]
fn a_prompt_departing_near_the_last_ones_end_goes_on_from_its_tail_checkpoint() {
    let mut e = engine_with(8);
    let tok = Tokenizer::from_gguf(e.file()).expect("tokenizer");
    let gen = greedy(6);
    let p1 = prompt(30, 1);
    let mut kv = KvHistory::new();
    generate_shifting(&mut e, &tok, &mut kv, &p1, 0, &gen, |_| true).expect("turn 1");
    let st = e.checkpoint_stats();
    assert_eq!((st.taken, st.held), (2, 2), "{st:?}");
    // One checkpoint: per Gated DeltaNet layer its conv window and its matrices, f32.
    let spec = TinySpec::qwen35(GgmlType::F32, 1);
    let ssm = spec.ssm.expect("a hybrid model");
    let layers = (0..spec.n_layer).filter(|&l| ssm.recurrent(l)).count();
    let one = layers * 4 * ((ssm.d_conv - 1) * ssm.channels() + ssm.h_v * ssm.s * ssm.s);
    assert_eq!(e.checkpoint_bytes(), one as u64);
    assert_eq!(st.bytes, 2 * one as u64);
    // Turn 2 departs two tokens before turn 1's prompt ended (a template that renders
    // the last turn's opener otherwise): the tail checkpoint lies inside the shared part.
    let p2 = spliced(&p1, 28, &prompt(12, 7));
    let tail = p1.len() - CHECKPOINT_TAIL;
    assert_eq!(e.resume_point(28), tail);
    let s2 = generate_shifting(&mut e, &tok, &mut kv, &p2, 0, &gen, |_| true).expect("turn 2");
    assert_eq!(s2.stats.prompt_tokens, p2.len() - tail, "only the rest ran");
    let st = e.checkpoint_stats();
    assert_eq!((st.restored, st.last_restored), (1, tail), "{st:?}");
    let want = generate(&mut engine_with(0), &tok, &p2, &gen, |_| true).expect("fresh");
    assert_eq!(s2.stats.tokens, want.tokens);

    // Bit for bit: the prompt's logits and the greedy steps after it, on a third prompt
    // that shares turn 2's first 32 tokens. Turn 1's checkpoint at 30 described other
    // tokens at 28 and 29 and went when turn 2 rewrote them: the engine goes on from
    // turn 1's tail mark, not from a stale state at 30.
    let p3 = spliced(&p2, 32, &prompt(9, 3));
    let from = e.resume_point(32);
    assert_eq!(
        from, tail,
        "turn 2's marks lie past 32, turn 1's 30 is gone"
    );
    let first = e.prefill_prompt(&p3[from..], from).expect("resumed");
    let mut got = vec![first.clone()];
    got.extend(go_on(&mut e, first, p3.len(), 6));
    assert!(bits(&got) == bits(&fresh(&p3)), "resumed logits differ");
}

#[test]
fn without_checkpoints_the_departing_prompt_runs_from_zero() {
    let mut e = engine_with(0);
    let tok = Tokenizer::from_gguf(e.file()).expect("tokenizer");
    let gen = greedy(4);
    let p1 = prompt(30, 1);
    let mut kv = KvHistory::new();
    generate_shifting(&mut e, &tok, &mut kv, &p1, 0, &gen, |_| true).expect("turn 1");
    assert_eq!(e.checkpoint_stats().taken, 0);
    let p2 = spliced(&p1, 28, &prompt(12, 7));
    assert_eq!(e.resume_point(28), 0);
    let s2 = generate_shifting(&mut e, &tok, &mut kv, &p2, 0, &gen, |_| true).expect("turn 2");
    assert_eq!(s2.stats.prompt_tokens, p2.len(), "everything ran again");
    let want = generate(&mut engine_with(0), &tok, &p2, &gen, |_| true).expect("fresh");
    assert_eq!(s2.stats.tokens, want.tokens);
}

#[test]
fn a_position_no_checkpoint_holds_is_refused_and_the_restored_state_matters() {
    let p = prompt(30, 2);
    let mut e = engine_with(8);
    e.prefill_prompt(&p, 0).expect("prompt");
    // Marks at 26 and 30: 27 is neither the state's end nor a checkpoint.
    let err = e.forward(&p[27..28], 27, 1).unwrap_err().to_string();
    assert!(
        err.contains("recurrent state") && err.contains("checkpoint"),
        "{err}"
    );
    assert_eq!(e.resume_point(29), 26);
    let resumed = e.forward(&p[26..], 26, 1).expect("from the checkpoint");
    let want = engine_with(0).prefill(&p, 0).expect("fresh");
    assert!(bits(&[resumed]) == bits(std::slice::from_ref(&want)));
    // What the restored state carries: the same tokens over the KV rows of 0..26 with
    // the state zeroed give other logits, so a restore that put back the wrong state
    // would be seen.
    let mut z = engine_with(0);
    z.prefill(&p[..26], 0).expect("prefix");
    z.zero_recurrent_state().expect("zero");
    let zeroed = z.forward(&p[26..], 26, 1).expect("rest");
    assert!(
        bits(&[zeroed]) != bits(&[want]),
        "zeroing the state changed nothing"
    );
}

/// A chat template that renders an earlier assistant turn without its text (as
/// templates that drop earlier reasoning do): the next prompt departs from what ran
/// right where the answer began.
const DROPPING_TEMPLATE: &str = "{%- for message in messages %}\
{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant\\n<|im_end|>\\n' }}\
{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\
{%- endif %}{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

fn chat_engine(dir: &std::path::Path, checkpoints: usize) -> Engine {
    let path = dir.join("tiny-qwen35-chat.gguf");
    if !path.exists() {
        let spec = TinySpec::qwen35(GgmlType::F32, 1);
        write_tiny_model_with_template(&path, &spec, DROPPING_TEMPLATE).expect("model");
    }
    let o = EngineOptions {
        ctx_checkpoints: checkpoints,
        ..opts(1, 16)
    };
    Engine::load(&path, &o).expect("engine")
}

#[test]
fn a_chat_whose_template_drops_the_answer_goes_on_from_the_last_prompts_end() {
    let dir = std::env::temp_dir().join(format!("minfer-ckpt-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    let gen = greedy(5);
    for checkpoints in [8, 0] {
        let mut conv = Conversation::new(
            chat_engine(&dir, checkpoints),
            ConversationOptions::default(),
        )
        .expect("conversation");
        let one = conv.turn("hello there", &gen, |_| true).expect("turn 1");
        let two = conv.turn("and again", &gen, |_| true).expect("turn 2");
        assert!(two.rewound, "the template dropped the answer: {two:?}");
        let reused = if checkpoints > 0 {
            one.prompt_tokens
        } else {
            0
        };
        assert_eq!(two.reused, reused, "checkpoints {checkpoints}: {two:?}");
        assert_eq!(two.prefilled, two.prompt_tokens - reused);
        // The answer is a fresh engine's for the whole second prompt.
        let p2 = conv.history()[..two.prompt_tokens].to_vec();
        let mut e = chat_engine(&dir, 0);
        let tok = Tokenizer::from_gguf(e.file()).expect("tokenizer");
        let want = generate(&mut e, &tok, &p2, &gen, |_| true).expect("fresh");
        assert_eq!(two.tokens, want.tokens, "checkpoints {checkpoints}");
        // And the state and rows the conversation holds are a fresh prefill's: the next
        // step's logits are bitwise the same.
        let held = conv.history().to_vec();
        let probe = conv
            .engine_mut()
            .forward(&[7], held.len(), 1)
            .expect("probe");
        let mut e = chat_engine(&dir, 0);
        e.prefill(&held, 0).expect("fresh prefill");
        let fresh_probe = e.forward(&[7], held.len(), 1).expect("probe");
        assert!(
            bits(&[probe]) == bits(&[fresh_probe]),
            "checkpoints {checkpoints}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two slots with 4 checkpoints each and prefill chunks of 8 tokens.
fn two_slots() -> MultiEngine {
    let o = EngineOptions {
        ctx_checkpoints: 4,
        ..opts(1, 8)
    };
    MultiEngine::from_shared(file(), &o, 2).expect("slots")
}

/// `tokens` of `slot` from `pos0`, the last row's logits wanted.
fn step(slot: usize, tokens: Vec<u32>, pos0: usize) -> SeqStep {
    SeqStep {
        slot,
        tokens,
        pos0,
        n_out: 1,
    }
}

#[test]
fn a_slot_goes_on_from_its_checkpoint_beside_a_busy_neighbour() {
    let mut m = two_slots();
    let p1 = prompt(21, 4);
    let other = prompt(19, 8);
    m.checkpoint_prompt(0, p1.len());
    m.checkpoint_prompt(1, other.len());
    let out = m
        .step(&[step(1, other.clone(), 0), step(0, p1.clone(), 0)])
        .expect("both prompts");
    assert_eq!(m.checkpoint_stats().held, 4, "two marks per slot");
    // Slot 0 decodes two tokens; slot 1 one.
    let t = argmax(&out[1]) as u32;
    let l = m.step(&[step(0, vec![t], p1.len())]).expect("decode")[0].clone();
    let u = argmax(&l) as u32;
    m.step(&[
        step(0, vec![u], p1.len() + 1),
        step(1, vec![argmax(&out[0]) as u32], other.len()),
    ])
    .expect("decode both");
    // The next prompt in slot 0 shares 19 tokens: its tail mark (17) is the resume point.
    let p2 = spliced(&p1, 19, &prompt(10, 5));
    let from = m.resume_point(0, 19);
    assert_eq!(from, p1.len() - CHECKPOINT_TAIL);
    assert_eq!(
        m.resume_point(1, 5),
        0,
        "slot 1 holds no checkpoint inside 5"
    );
    m.checkpoint_prompt(0, p2.len());
    let got = m
        .step(&[
            step(0, p2[from..].to_vec(), from),
            step(1, vec![9], other.len() + 1),
        ])
        .expect("resumed beside a decode");
    let want = engine_with(0).prefill(&p2, 0).expect("fresh");
    assert!(bits(&got[..1]) == bits(&[want]));
    assert_eq!(m.checkpoint_stats().restored, 1);
    // A reset slot forgets its checkpoints.
    m.reset_slot(0).expect("reset");
    assert_eq!(m.resume_point(0, 19), 0);
}

/// A fork (the server's `n` choices) copies the source's checkpoints with its state, so
/// the forked slot goes on from them as the source would: bitwise a fresh prefill.
#[test]
fn a_forked_slot_goes_on_from_the_checkpoints_it_copied() {
    let mut m = two_slots();
    let p1 = prompt(21, 4);
    m.checkpoint_prompt(0, p1.len());
    m.step(&[step(0, p1.clone(), 0)]).expect("prompt");
    assert_eq!(m.resume_point(1, 19), 0, "slot 1 holds nothing yet");
    m.copy_prefix(0, 1, p1.len()).expect("fork");
    assert_eq!(
        m.checkpoint_stats().held,
        4,
        "both slots hold the two marks"
    );
    let from = m.resume_point(1, 19);
    assert_eq!(from, p1.len() - CHECKPOINT_TAIL);
    let p2 = spliced(&p1, 19, &prompt(10, 5));
    m.checkpoint_prompt(1, p2.len());
    let got = m
        .step(&[step(1, p2[from..].to_vec(), from)])
        .expect("resumed in the fork");
    let want = engine_with(0).prefill(&p2, 0).expect("fresh");
    assert!(bits(&got) == bits(&[want]));
}

#[test]
fn after_a_step_that_unwinds_the_state_goes_on_only_from_a_checkpoint() {
    let p = prompt(30, 6);
    let want = {
        let mut e = engine_with(0);
        e.prefill(&p, 0).expect("prompt");
        e.forward(&[5], p.len(), 1).expect("decode")
    };
    for checkpoints in [8, 0] {
        let mut e = engine_with(checkpoints);
        e.prefill_prompt(&p, 0).expect("prompt");
        // Deep in the step, past the first Gated DeltaNet layers' state updates.
        let nodes = e.preview_graph(1, 1).expect("graph").nodes.len();
        e.inject_kernel_panic(nodes * 3 / 4);
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| e.forward(&[5], p.len(), 1)));
        assert!(r.is_err(), "the armed node did not panic");
        assert_eq!(e.seq_len(), p.len(), "the prompt's rows stay");
        let again = e.forward(&[5], p.len(), 1);
        if checkpoints > 0 {
            // The checkpoint at the prompt's end puts the state back.
            let got = again.expect("from the checkpoint");
            assert!(bits(&[got]) == bits(std::slice::from_ref(&want)));
        } else {
            // Without one, the half-advanced state is refused, not computed on.
            let err = again.unwrap_err().to_string();
            assert!(err.contains("recurrent state"), "{err}");
            assert_eq!(e.resume_point(p.len()), 0);
        }
    }
}
