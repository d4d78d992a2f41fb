//! The conversation engine: prefix reuse across turns on the default model, bitwise equal
//! to prefilling each turn's whole prompt from scratch; and both context overflow policies
//! on a tiny random-weight model with a small context.

use std::path::PathBuf;
use std::sync::Arc;

use minfer_gguf::{GgmlType, GgufFile};
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::{
    generate, Conversation, ConversationError, ConversationOptions, Engine, EngineOptions,
    FinishReason, GenerateOptions, OverflowPolicy, SamplingParams,
};
use minfer_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

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

fn opts(n_ctx: usize, n_threads: usize) -> EngineOptions {
    EngineOptions {
        n_threads,
        n_ctx: Some(n_ctx),
        backend: None,
        n_batch: 512,
        ..EngineOptions::default()
    }
}

fn default_model() -> Arc<GgufFile> {
    let p: PathBuf = minfer_hub::default_model_path();
    assert!(
        p.exists(),
        "the default model is missing at {}: run `minfer pull` (scripts/test.sh does)",
        p.display()
    );
    Arc::new(GgufFile::open(&p).expect("default model opens"))
}

fn tiny_file() -> Arc<GgufFile> {
    let spec = TinySpec::qwen2(GgmlType::Q8_0, 11);
    Arc::new(GgufFile::from_bytes(tiny_model_bytes(&spec).expect("writer")).expect("reader"))
}

/// The turn's whole prompt, rendered and tokenised as the server and `run --chat` do.
fn rendered(tok: &Tokenizer, msgs: &[ChatMessage]) -> Vec<u32> {
    let tpl = ChatTemplate::from_tokenizer(tok).expect("template");
    let r = tpl.render_spans(msgs, true).expect("render");
    r.encode(tok, msgs, true).expect("encode")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn five_turns_prefill_only_new_tokens_and_answer_as_fresh_prompts_do() {
    let file = default_model();
    let engine = Engine::from_arc(Arc::clone(&file), &opts(1024, 2)).expect("engine");
    let mut fresh = Engine::from_arc(file, &opts(1024, 2)).expect("engine");
    let mut conv = Conversation::new(engine, ConversationOptions::default()).expect("conv");
    conv.set_system(Some("You are a terse assistant.".into()));
    let tok = Tokenizer::from_gguf(fresh.file()).expect("tokenizer");
    let gen = greedy(5);
    let mut msgs = vec![ChatMessage::new("system", "You are a terse assistant.")];
    let users = [
        "Name a colour.",
        "Name a fruit.",
        "Name a planet.",
        "Name a metal.",
        "Name a river.",
    ];
    let mut held_before = 0;
    for (i, user) in users.iter().enumerate() {
        msgs.push(ChatMessage::new("user", *user));
        let prompt = rendered(&tok, &msgs);
        let mut text = String::new();
        let stats = conv
            .turn(user, &gen, |t| {
                text.push_str(t);
                true
            })
            .expect("turn");
        assert_eq!(stats.prompt_tokens, prompt.len(), "turn {i}");
        assert!(!stats.rewound, "turn {i}: the template only appends");
        assert_eq!(stats.prefilled, prompt.len() - stats.reused, "turn {i}");
        if i > 0 {
            // Everything the KV held (the earlier prompts and answers) is reused: only
            // the answer's closing marker and the new user message are prefilled.
            assert_eq!(stats.reused, held_before, "turn {i}: {stats:?}");
            let new_msg = tok.encode(user, false, false).len();
            assert!(
                stats.prefilled <= new_msg + 12,
                "turn {i}: prefilled {} tokens for a {new_msg}-token message",
                stats.prefilled
            );
        }
        let reference = generate(&mut fresh, &tok, &prompt, &gen, |_| true).expect("fresh");
        assert_eq!(
            stats.tokens, reference.tokens,
            "turn {i}: the conversation's answer differs from a fresh prefill of its prompt"
        );
        // The KV holds the prompt and every answer token that ran (a length-limited
        // answer's last token was sampled but never run).
        let ran = match stats.finish {
            FinishReason::Stop => stats.tokens.len(),
            _ => stats.tokens.len().saturating_sub(1),
        };
        assert_eq!(conv.history(), [&prompt[..], &stats.tokens[..ran]].concat());
        held_before = conv.history().len();
        msgs.push(ChatMessage::new("assistant", text));
    }
    assert_eq!(conv.messages().len(), 10);
}

/// Runs turns until one reports a shift, and returns that turn's stats.
fn turn_until_shift(conv: &mut Conversation, gen: &GenerateOptions) -> minfer_runtime::TurnStats {
    for i in 0..40 {
        let s = conv
            .turn(&format!("message number {i} with some words"), gen, |_| {
                true
            })
            .expect("a shifting conversation always continues");
        if s.shifted > 0 {
            return s;
        }
    }
    panic!("no shift in 40 turns");
}

/// The KV the conversation holds equals a fresh prefill of its tokens: the next step's
/// logits are bitwise those of a fresh engine that prefilled the same tokens.
fn assert_kv_is_a_fresh_prefill(conv: &mut Conversation, file: Arc<GgufFile>, n_ctx: usize) {
    let history = conv.history().to_vec();
    let n = history.len();
    assert!(n < n_ctx);
    let probe = [7u32];
    let got = conv.engine_mut().forward(&probe, n, 1).expect("probe");
    let mut fresh = Engine::from_arc(file, &opts(n_ctx, 1)).expect("engine");
    fresh.prefill(&history, 0).expect("fresh prefill");
    let want = fresh.forward(&probe, n, 1).expect("probe");
    assert_eq!(
        bits(&got),
        bits(&want),
        "the shifted KV is not a fresh prefill"
    );
}

#[test]
fn shift_keeps_the_system_prompt_and_equals_a_fresh_prefill_of_the_kept_tokens() {
    let n_ctx = 96;
    let file = tiny_file();
    let engine = Engine::from_arc(Arc::clone(&file), &opts(n_ctx, 1)).expect("engine");
    let mut conv = Conversation::new(engine, ConversationOptions::default()).expect("conv");
    conv.set_system(Some("be brief".into()));
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let sys = rendered_system(&tok, "be brief");
    let gen = greedy(6);
    let s = turn_until_shift(&mut conv, &gen);
    assert!(s.prompt_tokens < n_ctx, "{s:?}");
    assert!(
        conv.history().starts_with(&sys),
        "the system prompt was dropped"
    );
    // The answer after the shift is what a fresh engine gives for the shifted prompt.
    let prompt = conv.history()[..s.prompt_tokens].to_vec();
    let mut fresh = Engine::from_arc(Arc::clone(&file), &opts(n_ctx, 1)).expect("engine");
    let reference = generate(&mut fresh, &tok, &prompt, &gen, |_| true).expect("fresh");
    assert_eq!(s.tokens, reference.tokens);
    assert_kv_is_a_fresh_prefill(&mut conv, file, n_ctx);
}

fn rendered_system(tok: &Tokenizer, text: &str) -> Vec<u32> {
    let tpl = ChatTemplate::from_tokenizer(tok).expect("template");
    let msgs = [ChatMessage::new("system", text)];
    tpl.render_spans(&msgs, false)
        .expect("render")
        .encode(tok, &msgs, true)
        .expect("encode")
}

#[test]
fn a_long_answer_shifts_mid_generation_and_keeps_the_first_n_keep_tokens() {
    let n_ctx = 32;
    let file = tiny_file();
    let engine = Engine::from_arc(Arc::clone(&file), &opts(n_ctx, 1)).expect("engine");
    let copts = ConversationOptions {
        overflow: OverflowPolicy::Shift,
        n_keep: 10,
    };
    let mut conv = Conversation::new(engine, copts).expect("conv");
    let s = conv.turn("go on", &greedy(60), |_| true).expect("turn");
    let prompt = rendered(conv.tokenizer(), &[ChatMessage::new("user", "go on")]);
    assert!(s.shifted > 0, "{s:?}");
    assert!(
        s.prompt_tokens + s.gen_tokens > n_ctx,
        "the answer runs past the context: {s:?}"
    );
    assert!(!s.context_full);
    assert_eq!(&conv.history()[..10], &prompt[..10]);
    assert_kv_is_a_fresh_prefill(&mut conv, file, n_ctx);
}

#[test]
fn refuse_is_a_named_error_and_leaves_the_conversation_as_it_was() {
    let n_ctx = 64;
    let engine = Engine::from_arc(tiny_file(), &opts(n_ctx, 1)).expect("engine");
    let copts = ConversationOptions {
        overflow: OverflowPolicy::Refuse,
        n_keep: 0,
    };
    let mut conv = Conversation::new(engine, copts).expect("conv");
    // An answer that reaches the end of the context stops there, saying so.
    let s = conv.turn("hi", &greedy(500), |_| true).expect("turn");
    assert_eq!(s.finish, FinishReason::Length);
    assert!(s.context_full && s.shifted == 0, "{s:?}");
    assert_eq!(conv.history().len(), n_ctx);
    let before = conv.messages().to_vec();
    let e = conv.turn("more", &greedy(4), |_| true).unwrap_err();
    assert!(
        matches!(e, ConversationError::ContextFull { n_ctx: 64, .. }),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("context holds 64") && msg.contains("--ctx-overflow"),
        "{msg}"
    );
    assert_eq!(
        conv.messages(),
        &before[..],
        "a refused turn changed the conversation"
    );
    // After a clear the conversation goes on, reusing nothing it cannot.
    conv.clear();
    let s = conv
        .turn("again", &greedy(4), |_| true)
        .expect("turn after clear");
    assert!(
        s.reused > 0,
        "the template's leading tokens are reused: {s:?}"
    );
}

#[test]
fn a_kept_prefix_that_fills_the_context_is_a_named_error() {
    let engine = Engine::from_arc(tiny_file(), &opts(32, 1)).expect("engine");
    let copts = ConversationOptions {
        overflow: OverflowPolicy::Shift,
        n_keep: 1000,
    };
    let mut conv = Conversation::new(engine, copts).expect("conv");
    let long = "word ".repeat(40);
    let e = conv.turn(&long, &greedy(4), |_| true).unwrap_err();
    assert!(matches!(e, ConversationError::KeepTooLong { .. }), "{e:?}");
    assert!(e.to_string().contains("--keep"), "{e}");
    assert!(conv.messages().is_empty());
}

#[test]
fn a_rewritten_history_re_prefills_from_the_first_differing_token() {
    let file = tiny_file();
    let engine = Engine::from_arc(Arc::clone(&file), &opts(256, 1)).expect("engine");
    let mut conv = Conversation::new(engine, ConversationOptions::default()).expect("conv");
    conv.set_system(Some("first system".into()));
    let gen = greedy(4);
    conv.turn("hello", &gen, |_| true).expect("turn");
    conv.set_system(Some("second system".into()));
    let s = conv.turn("and now", &gen, |_| true).expect("turn");
    assert!(s.rewound, "{s:?}");
    let prompt = conv.history()[..s.prompt_tokens].to_vec();
    let mut fresh = Engine::from_arc(file, &opts(256, 1)).expect("engine");
    let reference = generate(&mut fresh, conv.tokenizer(), &prompt, &gen, |_| true).unwrap();
    assert_eq!(s.tokens, reference.tokens);
}

#[test]
fn a_stopped_answer_stays_in_the_history() {
    let engine = Engine::from_arc(tiny_file(), &opts(256, 1)).expect("engine");
    let mut conv = Conversation::new(engine, ConversationOptions::default()).expect("conv");
    let mut pieces = 0;
    let s = conv
        .turn("hi", &greedy(50), |_| {
            pieces += 1;
            pieces < 3
        })
        .expect("turn");
    assert_eq!(s.finish, FinishReason::Cancelled);
    let answer = &conv.messages()[1];
    assert_eq!(answer.role, "assistant");
    assert!(!answer.content.is_empty(), "the partial answer was lost");
    let s2 = conv.turn("more", &greedy(2), |_| true).expect("next turn");
    assert!(s2.reused > s.prompt_tokens, "{s2:?}");
}

/// A directory of its own for one test, removed with everything in it when the test
/// ends, passed or failed.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("minfer-conv-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_saved_conversation_restored_into_a_new_engine_continues_bit_for_bit() {
    let file = default_model();
    let dir = TempDir::new("resume");
    let path = dir.0.join("chat.kv");
    let gen = greedy(6);
    let users = ["Name a colour.", "Name a fruit.", "Name a planet."];
    let last = "Name a metal.";

    // Never stopping: three turns, then the fourth.
    let engine = Engine::from_arc(Arc::clone(&file), &opts(1024, 2)).expect("engine");
    let mut straight = Conversation::new(engine, ConversationOptions::default()).expect("conv");
    straight.set_system(Some("You are a terse assistant.".into()));
    for u in users {
        straight.turn(u, &gen, |_| true).expect("turn");
    }
    straight.save(&path).expect("save");
    let held = straight.history().len();
    let want = straight.turn(last, &gen, |_| true).expect("turn four");
    drop(straight);

    // Stopping after three: a new engine and conversation restore the file.
    let engine = Engine::from_arc(file, &opts(1024, 2)).expect("engine");
    let mut resumed = Conversation::new(engine, ConversationOptions::default()).expect("conv");
    resumed.load(&path).expect("load");
    assert_eq!(resumed.system(), Some("You are a terse assistant."));
    assert_eq!(resumed.messages().len(), 6);
    assert_eq!(resumed.history().len(), held);
    let got = resumed.turn(last, &gen, |_| true).expect("turn four");
    assert_eq!(got.tokens, want.tokens, "the continuation differs");
    assert_eq!(got.prompt_tokens, want.prompt_tokens);
    // Only the new tokens were prefilled: everything the file held was reused.
    assert_eq!(got.reused, held, "{got:?}");
    assert_eq!(got.prefilled, want.prefilled, "{got:?}");
    assert!(!got.rewound, "{got:?}");
}

#[test]
fn a_refused_load_leaves_the_conversation_as_it_was() {
    let file = tiny_file();
    let dir = TempDir::new("refused");
    let engine = Engine::from_arc(Arc::clone(&file), &opts(256, 1)).expect("engine");
    let mut conv = Conversation::new(engine, ConversationOptions::default()).expect("conv");
    conv.turn("hello", &greedy(4), |_| true).expect("turn");
    let (history, messages) = (conv.history().to_vec(), conv.messages().to_vec());
    let bad = dir.0.join("bad.kv");
    std::fs::write(&bad, b"MINFERKV\x02\0\0\0 and then nothing sensible").unwrap();
    let e = conv.load(&bad).unwrap_err().to_string();
    assert!(e.contains("damaged"), "{e}");
    // A plain `run --session` file holds no conversation.
    let plain = dir.0.join("plain.kv");
    let mut other = Engine::from_arc(file, &opts(256, 1)).expect("engine");
    other.prefill(&[1, 2, 3], 0).expect("prefill");
    minfer_runtime::session::save(&mut other, &[1, 2, 3], &plain).expect("save");
    let e = conv.load(&plain).unwrap_err().to_string();
    assert!(e.contains("no conversation"), "{e}");
    assert_eq!(conv.history(), &history[..]);
    assert_eq!(conv.messages(), &messages[..]);
    let s = conv
        .turn("more", &greedy(2), |_| true)
        .expect("the chat goes on");
    assert!(s.reused >= history.len(), "{s:?}");
}

#[test]
fn an_interrupted_prefill_drops_the_message_and_keeps_the_chunks_that_ran() {
    let file = tiny_file();
    let o = EngineOptions {
        n_batch: 8,
        ..opts(512, 1)
    };
    let engine = Engine::from_arc(Arc::clone(&file), &o).expect("engine");
    let mut conv = Conversation::new(engine, ConversationOptions::default()).expect("conv");
    let gen = greedy(4);
    conv.turn("hello", &gen, |_| true).expect("turn");
    let (history, messages) = (conv.history().to_vec(), conv.messages().to_vec());
    let document = "a long pasted document with many words in it ".repeat(5);
    let mut asked = 0;
    let e = conv
        .turn_interruptible(
            &document,
            &gen,
            || {
                asked += 1;
                asked == 2
            },
            |_| panic!("no answer after an interrupted prefill"),
        )
        .unwrap_err();
    // Two chunks of 8 ran before the interruption was seen.
    assert!(
        matches!(e, ConversationError::Interrupted { done: 16, total } if total > 16),
        "{e:?}"
    );
    assert!(e.to_string().contains("dropped"), "{e}");
    assert_eq!(
        conv.messages(),
        &messages[..],
        "the message was not dropped"
    );
    // The KV history is exactly what ran: the earlier tokens, then 16 of the new prompt.
    let mut msgs = messages.clone();
    msgs.push(ChatMessage::new("user", document.as_str()));
    let attempted = rendered(conv.tokenizer(), &msgs);
    let held = conv.history().to_vec();
    assert_eq!(held.len(), attempted.len().min(held.len()));
    assert_eq!(&held[..], &attempted[..held.len()]);
    assert!(
        held.len() >= history.len(),
        "{} < {}",
        held.len(),
        history.len()
    );
    // The next turn reuses what it shares with that and answers as a fresh prefill does.
    let s = conv.turn("and now?", &gen, |_| true).expect("next turn");
    let prompt = conv.history()[..s.prompt_tokens].to_vec();
    assert!(s.reused > 0 && s.reused < held.len(), "{s:?}");
    let mut fresh = Engine::from_arc(file, &o).expect("engine");
    let reference = generate(&mut fresh, conv.tokenizer(), &prompt, &gen, |_| true).unwrap();
    assert_eq!(s.tokens, reference.tokens);
}

#[test]
fn a_plain_completion_shifts_past_the_end_of_the_context() {
    let n_ctx = 32;
    let file = tiny_file();
    let mut engine = Engine::from_arc(Arc::clone(&file), &opts(n_ctx, 1)).expect("engine");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    let prompt = tok.encode("once upon a time there was", true, true);
    let mut kv = minfer_runtime::KvHistory::new();
    let r = minfer_runtime::shift::generate_shifting(
        &mut engine,
        &tok,
        &mut kv,
        &prompt,
        4,
        &greedy(80),
        |_| true,
    )
    .expect("generate");
    assert!(r.shifted > 0, "{r:?}");
    assert!(r.stats.gen_tokens > n_ctx, "{r:?}");
    assert_eq!(&kv.tokens()[..4], &prompt[..4], "the kept tokens stay");
    // The KV equals a fresh prefill of the tokens it holds.
    let n = kv.len();
    let got = engine.forward(&[7], n, 1).expect("probe");
    let mut fresh = Engine::from_arc(file, &opts(n_ctx, 1)).expect("engine");
    fresh.prefill(kv.tokens(), 0).expect("fresh prefill");
    let want = fresh.forward(&[7], n, 1).expect("probe");
    assert_eq!(
        bits(&got),
        bits(&want),
        "the shifted KV is not a fresh prefill"
    );
}
