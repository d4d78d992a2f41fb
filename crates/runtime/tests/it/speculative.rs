//! Speculative decoding never changes the answer: under greedy sampling the tokens equal
//! plain decode's, with a draft model (the target itself, or a different model with the
//! same vocabulary) and with n-gram lookup, at fixed and adaptive depths; under sampling
//! the token distribution matches plain sampling's (a chi-square test over many seeds).

use std::sync::Arc;

use minfer_gguf::{GgmlType, GgufFile};
use minfer_models::testing::{tiny_model_bytes, TinySpec};
use minfer_runtime::{
    generate, generate_speculative, DraftModel, Engine, EngineOptions, GenerateOptions,
    NgramLookup, SamplingParams, SpecStats, Speculator,
};
use minfer_tokenizer::Tokenizer;

fn opts(n_ctx: usize) -> EngineOptions {
    EngineOptions {
        n_threads: 1,
        n_ctx: Some(n_ctx),
        backend: Some("cpu".into()),
        n_batch: 512,
        ..EngineOptions::default()
    }
}

fn tiny(spec: &TinySpec) -> Arc<GgufFile> {
    Arc::new(GgufFile::from_bytes(tiny_model_bytes(spec).expect("writer")).expect("reader"))
}

fn engine(file: &Arc<GgufFile>, n_ctx: usize) -> Engine {
    Engine::from_arc(Arc::clone(file), &opts(n_ctx)).expect("engine")
}

/// Twenty prompts: code, prose and chat-shaped text, several repetitive (lookup drafts
/// from them) and several not.
const PROMPTS: [&str; 20] = [
    "fn add(a: i32, b: i32) -> i32 { a + b }\nfn sub(a: i32, b: i32) -> i32 {",
    "def square(x):\n    return x * x\n\ndef cube(x):\n    return",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n",
    "let v = vec![1, 2, 3];\nlet w = vec![1, 2, 3];\nlet x =",
    "SELECT name, age FROM users WHERE age > 30; SELECT name FROM",
    "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); return 0; }",
    "<div class=\"a\"><span>one</span></div><div class=\"a\"><span>",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "Once upon a time there was a small village by the sea.",
    "It was the best of times, it was the worst of times, it was",
    "Rain fell on the roofs all night, and in the morning the streets",
    "A list: apples, pears, plums, apples, pears, plums, apples,",
    "Water boils at one hundred degrees at sea level.",
    "She said hello. He said hello. They said",
    "<|im_start|>user\nWhat is two plus two?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nRepeat: abc abc abc<|im_end|>\n<|im_start|>assistant\nabc abc",
    "Q: What is the capital of France?\nA: Paris.\nQ: What is the capital of Spain?\nA:",
    "user: hi\nbot: hello\nuser: hi\nbot:",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
];

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens: n,
        stop: Vec::new(),
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        constraint: None,
    }
}

/// Plain greedy tokens of every prompt.
fn plain_tokens(target: &mut Engine, tok: &Tokenizer, gen: &GenerateOptions) -> Vec<Vec<u32>> {
    PROMPTS
        .iter()
        .map(|p| {
            let prompt = tok.encode(p, true, true);
            generate(target, tok, &prompt, gen, |_| true)
                .expect("plain")
                .tokens
        })
        .collect()
}

/// Every prompt through `spec` must give `plain`'s tokens; returns the summed counters.
fn check_same(
    what: &str,
    target: &mut Engine,
    tok: &Tokenizer,
    gen: &GenerateOptions,
    plain: &[Vec<u32>],
    spec: &mut Speculator,
) -> SpecStats {
    for (p, want) in PROMPTS.iter().zip(plain) {
        let prompt = tok.encode(p, true, true);
        let got = generate_speculative(target, tok, &prompt, 0, gen, Some(&mut *spec), |_| true)
            .expect("speculative");
        assert_eq!(&got.tokens, want, "{what}: {p:?}");
    }
    spec.stats()
}

fn draft_of(file: &Arc<GgufFile>, tok: &Tokenizer, n_ctx: usize) -> Box<DraftModel> {
    Box::new(DraftModel::new(engine(file, n_ctx), tok, n_ctx).expect("same vocabulary"))
}

#[test]
fn greedy_speculation_gives_plain_decodes_tokens_on_tiny_models() {
    const N_CTX: usize = 160;
    let target_file = tiny(&TinySpec::qwen2(GgmlType::Q8_0, 75));
    let other_file = tiny(&TinySpec::qwen2(GgmlType::Q8_0, 76));
    let mut target = engine(&target_file, N_CTX);
    let tok = Tokenizer::from_gguf(target.file()).expect("tokenizer");
    let gen = greedy(40);
    let plain = plain_tokens(&mut target, &tok, &gen);
    assert!(
        plain.iter().any(|t| t.len() > 10),
        "the tiny model generates"
    );
    for depth in [Some(1), Some(3), Some(7), None] {
        let mut lookup = Speculator::new(Box::new(NgramLookup::new()), 7).unwrap();
        lookup.set_fixed_depth(depth);
        let s = check_same("lookup", &mut target, &tok, &gen, &plain, &mut lookup);
        if depth.is_some() {
            assert!(s.accepted > 0 && s.verify_steps > 0, "lookup drafts: {s:?}");
        }

        // The target as its own draft: every drafted token is accepted (adaptive, a
        // draft that costs a target step is run rarely, restarting on a short window).
        let mut same = Speculator::new(draft_of(&target_file, &tok, N_CTX), 7).unwrap();
        same.set_fixed_depth(depth);
        let s = check_same("self draft", &mut target, &tok, &gen, &plain, &mut same);
        if depth.is_some() {
            assert!(s.drafted > 0 && s.accepted == s.drafted, "{s:?}");
        }

        // Another model with the same vocabulary: partial acceptance.
        let mut other = Speculator::new(draft_of(&other_file, &tok, N_CTX), 7).unwrap();
        other.set_fixed_depth(depth);
        let s = check_same("other draft", &mut target, &tok, &gen, &plain, &mut other);
        if depth.is_some() {
            assert!(
                s.accepted < s.drafted,
                "a different draft is refused: {s:?}"
            );
        }
    }
}

#[test]
fn greedy_speculation_gives_plain_decodes_tokens_on_the_default_model() {
    let path = minfer_hub::default_model_path();
    assert!(
        path.exists(),
        "the default model is missing at {}: run `minfer pull`",
        path.display()
    );
    let file = Arc::new(GgufFile::open(&path).expect("default model opens"));
    let o = EngineOptions {
        n_threads: 2,
        ..opts(256)
    };
    let mut target = Engine::from_arc(Arc::clone(&file), &o).expect("engine");
    let tok = Tokenizer::from_gguf(target.file()).expect("tokenizer");
    let gen = greedy(20);
    let picks = [0, 3, 11, 14, 17];
    let plain: Vec<Vec<u32>> = picks
        .iter()
        .map(|&i| {
            let prompt = tok.encode(PROMPTS[i], true, true);
            generate(&mut target, &tok, &prompt, &gen, |_| true)
                .unwrap()
                .tokens
        })
        .collect();
    let draft = Engine::from_arc(Arc::clone(&file), &o).expect("draft engine");
    let sources: Vec<(&str, Box<dyn minfer_runtime::DraftSource>)> = vec![
        ("lookup", Box::new(NgramLookup::new())),
        (
            "self draft",
            Box::new(DraftModel::new(draft, &tok, 256).expect("same vocabulary")),
        ),
    ];
    for (what, source) in sources {
        let mut spec = Speculator::new(source, 7).unwrap();
        spec.set_fixed_depth(Some(3));
        for (&i, want) in picks.iter().zip(&plain) {
            let prompt = tok.encode(PROMPTS[i], true, true);
            let got =
                generate_speculative(&mut target, &tok, &prompt, 0, &gen, Some(&mut spec), |_| {
                    true
                })
                .unwrap();
            assert_eq!(&got.tokens, want, "{what}: {:?}", PROMPTS[i]);
        }
        assert!(spec.stats().accepted > 0, "{what}: {:?}", spec.stats());
    }
}

#[test]
fn a_draft_with_another_vocabulary_is_refused_by_name() {
    let target = tiny(&TinySpec::qwen2(GgmlType::Q8_0, 75));
    let tok = Tokenizer::from_gguf(&target).expect("tokenizer");
    let mut spec = TinySpec::qwen2(GgmlType::Q8_0, 76);
    spec.n_vocab += 5;
    let e = DraftModel::new(engine(&tiny(&spec), 64), &tok, 64)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("draft model") && e.contains("vocabulary"), "{e}");
    // A draft whose context is smaller than the target's is refused too.
    let e = DraftModel::new(engine(&target, 32), &tok, 64)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("draft model") && e.contains("context"), "{e}");
}

/// Chi-square statistic of two samples over the same cells (homogeneity), with cells
/// rarer than 10 in both samples pooled; returns the statistic and degrees of freedom.
fn chi_square(a: &[u32], b: &[u32]) -> (f64, usize) {
    use std::collections::BTreeMap;
    let mut cells: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    for &t in a {
        cells.entry(t).or_default().0 += 1.0;
    }
    for &t in b {
        cells.entry(t).or_default().1 += 1.0;
    }
    let mut pooled = (0.0, 0.0);
    let mut kept = Vec::new();
    for (_, (x, y)) in cells {
        if x + y < 10.0 {
            pooled.0 += x;
            pooled.1 += y;
        } else {
            kept.push((x, y));
        }
    }
    if pooled.0 + pooled.1 > 0.0 {
        kept.push(pooled);
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let mut stat = 0.0;
    for (x, y) in &kept {
        let total = x + y;
        let ea = total * na / (na + nb);
        let eb = total * nb / (na + nb);
        stat += (x - ea).powi(2) / ea + (y - eb).powi(2) / eb;
    }
    (stat, kept.len().saturating_sub(1))
}

/// The chi-square quantile at upper tail 0.001 (Wilson-Hilferty).
fn chi_square_critical(df: usize) -> f64 {
    let k = df.max(1) as f64;
    let z = 3.090;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

#[test]
fn sampled_speculation_keeps_the_target_distribution() {
    const N_CTX: usize = 64;
    const SEEDS: u64 = 1500;
    const N: usize = 4;
    let target_file = tiny(&TinySpec::qwen2(GgmlType::Q8_0, 75));
    let other_file = tiny(&TinySpec::qwen2(GgmlType::Q8_0, 76));
    let mut target = engine(&target_file, N_CTX);
    let tok = Tokenizer::from_gguf(target.file()).expect("tokenizer");
    let prompt = tok.encode("ab ab ab ab ab", true, true);
    let gen = |seed: u64| GenerateOptions {
        max_tokens: N,
        stop: Vec::new(),
        sampling: SamplingParams {
            temperature: 1.5,
            top_k: 12,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.1,
            seed,
            ..SamplingParams::default()
        },
        constraint: None,
    };
    // Token `i` of each generation, over the seeds (end-of-generation as a cell of its own).
    let column = |runs: &[Vec<u32>], i: usize| -> Vec<u32> {
        runs.iter()
            .map(|t| t.get(i).copied().unwrap_or(u32::MAX))
            .collect()
    };
    let plain: Vec<Vec<u32>> = (0..SEEDS)
        .map(|s| {
            generate(&mut target, &tok, &prompt, &gen(s), |_| true)
                .unwrap()
                .tokens
        })
        .collect();
    let sources: Vec<(&str, Box<dyn minfer_runtime::DraftSource>)> = vec![
        ("lookup", Box::new(NgramLookup::new())),
        (
            "other draft",
            Box::new(DraftModel::new(engine(&other_file, N_CTX), &tok, N_CTX).unwrap()),
        ),
    ];
    for (what, source) in sources {
        let mut spec = Speculator::new(source, 3).unwrap();
        spec.set_fixed_depth(Some(3));
        // Other seeds than plain's: the two samples are independent.
        let runs: Vec<Vec<u32>> = (SEEDS..2 * SEEDS)
            .map(|s| {
                generate_speculative(
                    &mut target,
                    &tok,
                    &prompt,
                    0,
                    &gen(s),
                    Some(&mut spec),
                    |_| true,
                )
                .unwrap()
                .tokens
            })
            .collect();
        let st = spec.stats();
        assert!(
            st.accepted > 0 && st.accepted < st.drafted,
            "{what} drafts and is refused sometimes: {st:?}"
        );
        for i in 1..N {
            let (stat, df) = chi_square(&column(&plain, i), &column(&runs, i));
            assert!(df >= 3, "{what}: token {i} spreads over several cells");
            assert!(
                stat < chi_square_critical(df),
                "{what}: token {i}: chi-square {stat:.1} with {df} degrees of freedom"
            );
        }
        // Deterministic for a fixed seed.
        let again = generate_speculative(
            &mut target,
            &tok,
            &prompt,
            0,
            &gen(SEEDS),
            Some(&mut spec),
            |_| true,
        )
        .unwrap()
        .tokens;
        if what == "lookup" {
            // Lookup samples every row from the target as plain decode does.
            let p = generate(&mut target, &tok, &prompt, &gen(SEEDS), |_| true).unwrap();
            assert_eq!(
                again, p.tokens,
                "lookup under sampling equals plain sampling"
            );
        }
        assert_eq!(again, runs[0], "{what}: same seed, same tokens");
    }
}

/// A chat with speculation answers every turn as a plain chat does, and its KV history
/// (what the next turn reuses) is the plain chat's: tokens drafted and run past the end
/// of an answer are not kept. Turns end by length in the middle of blocks, and the
/// small context makes later turns shift.
#[test]
fn speculative_chat_turns_and_history_match_a_plain_chat() {
    use minfer_runtime::{Conversation, ConversationOptions, OverflowPolicy};
    const N_CTX: usize = 96;
    let target_file = tiny(&TinySpec::qwen2(GgmlType::Q8_0, 75));
    let other_file = tiny(&TinySpec::qwen2(GgmlType::Q8_0, 76));
    let tok = Tokenizer::from_gguf(&target_file).expect("tokenizer");
    let opts = ConversationOptions {
        overflow: OverflowPolicy::Shift,
        n_keep: 0,
    };
    let turns = ["ab ab ab ab", "cd cd cd", "ab cd ab cd ab", "xyz"];
    let run = |spec: Option<Speculator>| {
        let mut c = Conversation::new(engine(&target_file, N_CTX), opts).unwrap();
        c.set_speculator(spec);
        let mut out = Vec::new();
        for (i, t) in turns.iter().enumerate() {
            let st = c.turn(t, &greedy(7 + 3 * i), |_| true).expect("turn");
            out.push((st.tokens, c.history().to_vec()));
        }
        (out, c.speculator().map(|s| s.stats()))
    };
    let (plain, _) = run(None);
    let mut lookup = Speculator::new(Box::new(NgramLookup::new()), 7).unwrap();
    lookup.set_fixed_depth(Some(3));
    let mut other = Speculator::new(draft_of(&other_file, &tok, N_CTX), 7).unwrap();
    other.set_fixed_depth(Some(3));
    // All accepted: every block is full, so the answers end inside blocks.
    let mut same = Speculator::new(draft_of(&target_file, &tok, N_CTX), 7).unwrap();
    same.set_fixed_depth(Some(3));
    let sources = [
        ("lookup", lookup),
        ("other draft", other),
        ("self draft", same),
    ];
    for (what, spec) in sources {
        let (got, stats) = run(Some(spec));
        assert_eq!(got, plain, "{what}");
        assert!(stats.is_some_and(|s| s.drafted > 0), "{what}: {stats:?}");
    }
}
