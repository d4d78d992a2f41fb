//! The constraint step on the default model: greedy constrained output is deterministic
//! and follows its grammar; a schema that the unconstrained greedy answer already meets
//! leaves that answer unchanged; end tokens come only when the grammar accepts; a lazy
//! grammar starts at its trigger; bad grammars are refused with the compiler's reason.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use minfer_gguf::GgufFile;
use minfer_runtime::{
    generate, CompiledGrammar, ConstraintError, Engine, EngineOptions, GenerateOptions, Grammar,
    GrammarVocab, Prefetch, Sampler, SamplingParams,
};
use minfer_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde_json::{json, Value};

struct Model {
    file: Arc<GgufFile>,
    tok: Tokenizer,
    vocab: Arc<GrammarVocab>,
}

fn model() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| {
        let p: PathBuf = minfer_hub::default_model_path();
        assert!(
            p.exists(),
            "the default model is missing at {}: run `minfer pull` (scripts/test.sh does)",
            p.display()
        );
        let file = Arc::new(GgufFile::open(&p).expect("default model opens"));
        let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
        let vocab = GrammarVocab::new(&tok).expect("grammar vocabulary");
        Model { file, tok, vocab }
    })
}

fn engine() -> Engine {
    let opts = EngineOptions {
        n_threads: 2,
        n_ctx: Some(512),
        backend: Some("cpu".into()),
        ..EngineOptions::default()
    };
    Engine::from_arc(Arc::clone(&model().file), &opts).expect("engine")
}

fn chat(user: &str) -> Vec<u32> {
    let tok = &model().tok;
    let msgs = [ChatMessage::new("user", user)];
    let tpl = ChatTemplate::from_tokenizer(tok).expect("template");
    let r = tpl.render_spans(&msgs, true).expect("render");
    r.encode(tok, &msgs, true).expect("encode")
}

fn greedy(max_tokens: usize, constraint: Option<CompiledGrammar>) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        stop: Vec::new(),
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        constraint,
    }
}

fn compile(g: Grammar) -> CompiledGrammar {
    CompiledGrammar::new(&model().vocab, &g).expect("grammar compiles")
}

fn run(e: &mut Engine, prompt: &[u32], opts: &GenerateOptions) -> String {
    let mut out = String::new();
    generate(e, &model().tok, prompt, opts, |t| {
        out.push_str(t);
        true
    })
    .expect("generation");
    out
}

#[test]
fn constrained_greedy_is_deterministic_and_valid() {
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "population": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"enum": ["big", "old", "coastal"]},
                     "minItems": 1, "maxItems": 2}
        },
        "required": ["city", "population", "tags"],
        "additionalProperties": false
    });
    let g = compile(Grammar::JsonSchema(schema));
    let prompt = chat("Describe Lisbon as JSON.");
    let mut e = engine();
    let a = run(&mut e, &prompt, &greedy(60, Some(g.clone())));
    let b = run(&mut e, &prompt, &greedy(60, Some(g)));
    assert_eq!(a, b, "greedy constrained output is deterministic");
    let v: Value = serde_json::from_str(&a).unwrap_or_else(|e| panic!("{e}: {a}"));
    let tags = v["tags"].as_array().expect("tags");
    assert!((1..=2).contains(&tags.len()), "{a}");
    assert!(v["population"].as_u64().is_some(), "{a}");
    assert_eq!(v.as_object().map(|o| o.len()), Some(3), "{a}");
}

#[test]
fn a_schema_the_free_answer_meets_leaves_it_unchanged() {
    let prompt = chat(
        "Output only this JSON object, nothing else, no code fence: {\"name\": \"Ada\", \"age\": 36}",
    );
    let mut e = engine();
    let free = run(&mut e, &prompt, &greedy(40, None));
    let v: Value = serde_json::from_str(&free).unwrap_or_else(|e| panic!("{e}: {free}"));
    assert_eq!(v, json!({"name": "Ada", "age": 36}), "{free}");
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"]
    });
    for g in [Grammar::JsonSchema(schema), Grammar::JsonObject] {
        let constrained = run(&mut e, &prompt, &greedy(40, Some(compile(g))));
        assert_eq!(constrained, free);
    }
}

/// A keyword the engine cannot enforce (`uniqueItems`, an unknown `format`) refuses a
/// strict schema by name; the lenient one constrains by the rest, says what it left out,
/// and still holds the model to the keywords it enforces.
#[test]
fn lenient_schemas_constrain_by_the_rest_and_list_what_they_left_out() {
    use minfer_runtime::constraint::lenient;
    let schema = json!({
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["big", "old", "coastal"]},
                     "minItems": 2, "maxItems": 2, "uniqueItems": true},
            "site": {"type": "string", "format": "x-made-up"}
        },
        "required": ["tags", "site"],
        "additionalProperties": false
    });
    let vocab = &model().vocab;
    let e = CompiledGrammar::new(vocab, &Grammar::JsonSchema(schema.clone()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("uniqueItems"), "{e}");
    let g = compile(Grammar::JsonSchema(lenient(schema)));
    let left_out = g.unenforced().join("; ");
    assert!(left_out.contains("uniqueItems"), "{left_out}");
    assert!(left_out.contains("x-made-up"), "{left_out}");
    // What is enforced holds.
    let out = run(
        &mut engine(),
        &chat("Describe Lisbon as JSON."),
        &greedy(60, Some(g)),
    );
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["tags"].as_array().map(Vec::len), Some(2), "{out}");
    assert!(v["site"].is_string(), "{out}");
    // A schema it enforces whole leaves nothing out, lenient or not.
    let plain = compile(Grammar::JsonSchema(lenient(json!({"type": "object"}))));
    assert!(plain.unenforced().is_empty(), "{:?}", plain.unenforced());
}

#[test]
fn gbnf_and_regex_grammars_constrain_the_model() {
    let mut e = engine();
    let prompt = chat("Is the sky green? Answer at length.");
    let g = compile(Grammar::Gbnf(
        "root ::= answer \".\"\nanswer ::= \"Yes\" | \"No\"".into(),
    ));
    let out = run(&mut e, &prompt, &greedy(20, Some(g)));
    assert!(out == "Yes." || out == "No.", "{out:?}");
    let g = compile(Grammar::Regex("[0-9]{3}-[0-9]{4}".into()));
    let out = run(
        &mut e,
        &chat("Give me a phone number."),
        &greedy(20, Some(g)),
    );
    let b = out.as_bytes();
    assert!(
        out.len() == 8 && b[3] == b'-' && out.bytes().filter(u8::is_ascii_digit).count() == 7,
        "{out:?}"
    );
}

#[test]
fn end_tokens_only_when_the_grammar_accepts_and_alone_once_it_is_complete() {
    let m = model();
    let eog = m.tok.eog_ids().to_vec();
    let n = m.tok.n_vocab();
    let g = compile(Grammar::Regex("ab".into()));
    for prefetch in [Prefetch::Inline, Prefetch::Helper] {
        let mut c = g.start(prefetch);
        let mut row = vec![0.0f32; n];
        c.mask(&mut row).expect("mask");
        assert!(eog.iter().all(|&t| row[t as usize] == f32::NEG_INFINITY));
        let a = m.tok.token_id("a").expect("token a");
        assert!(row[a as usize] == 0.0);
        let allowed = row.iter().filter(|l| l.is_finite()).count();
        assert!(allowed < 10, "{allowed} tokens start `ab`");
        c.advance(a).expect("a");
        assert!(!c.is_accepting().expect("state"));
        let b = m.tok.token_id("b").expect("token b");
        c.advance(b).expect("b");
        assert!(c.is_accepting().expect("state"));
        let mut row = vec![0.0f32; n];
        c.mask(&mut row).expect("mask");
        let left: Vec<u32> = (0..n as u32).filter(|&t| row[t as usize] == 0.0).collect();
        assert_eq!(left, eog, "only the end tokens remain");
        // A token the grammar does not allow is an error, not a silent pass.
        let mut c = g.start(prefetch);
        let err = c.advance(b).unwrap_err();
        assert!(matches!(err, ConstraintError::Runtime(_)), "{err}");
    }
}

#[test]
fn a_lazy_grammar_waits_for_its_trigger() {
    let m = model();
    let g = compile(Grammar::Regex("X+".into())).triggered_by("<tool_call>");
    let mut c = g.start(Prefetch::Helper);
    let mut row = vec![0.0f32; m.tok.n_vocab()];
    c.mask(&mut row).expect("mask");
    assert!(row.iter().all(|&l| l == 0.0), "free before the trigger");
    for t in m.tok.encode("hello <tool_call>", false, false) {
        c.advance(t).expect("free text");
    }
    assert!(c.is_active());
    c.mask(&mut row).expect("mask");
    let x = m.tok.token_id("X").expect("token X");
    assert_eq!(row[x as usize], 0.0);
    assert!(row.iter().filter(|l| l.is_finite()).count() < 20);
}

#[test]
fn the_sampler_masks_before_the_distribution_stages() {
    let m = model();
    let n = m.tok.n_vocab();
    let g = compile(Grammar::Regex("7".into()));
    // A high temperature and no truncation: only the mask keeps other tokens out.
    let params = SamplingParams {
        temperature: 5.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 3,
        ..SamplingParams::default()
    };
    let seven = m.tok.token_id("7").expect("token 7");
    for _ in 0..20 {
        let mut s = Sampler::new(params.clone())
            .expect("sampler")
            .with_constraint(Some(g.start(Prefetch::Inline)));
        let mut row: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
        assert_eq!(s.try_sample(&mut row).expect("sample"), seven);
    }
}

#[test]
fn bad_grammars_are_refused_with_the_reason() {
    let vocab = &model().vocab;
    for (g, want) in [
        (
            Grammar::JsonSchema(
                json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}),
            ),
            "JSON schema cannot be compiled",
        ),
        (Grammar::JsonSchema(json!({"type": "strnig"})), "strnig"),
        (Grammar::JsonSchema(json!([1, 2])), "must be a JSON object"),
        (Grammar::Regex("(unclosed".into()), "regular expression"),
        (
            Grammar::Lark("start: undefined_rule".into()),
            "undefined_rule",
        ),
        (Grammar::Gbnf("root ::= (".into()), "GBNF line 1"),
    ] {
        let e = CompiledGrammar::new(vocab, &g).unwrap_err().to_string();
        assert!(e.contains(want), "{g:?}: {e}");
    }
}

/// `root ::= "w0" | "w1" | ...` with `n` alternatives, in GBNF.
fn alternatives(n: usize) -> String {
    let alts: Vec<String> = (0..n).map(|i| format!("\"w{i}\"")).collect();
    format!("root ::= {}", alts.join(" | "))
}

#[test]
fn grammars_past_an_engine_limit_are_refused_when_compiled_naming_the_limit() {
    let vocab = &model().vocab;
    // One group with too many alternatives is refused as it is translated.
    let e = CompiledGrammar::new(vocab, &Grammar::Gbnf(alternatives(50_000))).unwrap_err();
    assert!(matches!(e, ConstraintError::Limit { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("rule `root` has more than 2000"), "{text}");
    // Two groups that are each under it but open together: the engine meets it only
    // when a token is applied, so the compile's probe must find it.
    let half = |p: &str| {
        (0..1_500)
            .map(|i| format!("\"{p}{i}\""))
            .collect::<Vec<_>>()
    };
    let g = format!(
        "root ::= a | b\na ::= {}\nb ::= {}",
        half("a").join(" | "),
        half("b").join(" | ")
    );
    let e = CompiledGrammar::new(vocab, &Grammar::Gbnf(g)).unwrap_err();
    assert!(matches!(e, ConstraintError::Limit { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("alternatives are open") && text.contains("at most 2000"),
        "{text}"
    );
    // Past a lexer limit.
    let values: Vec<String> = (0..100_000).map(|i| format!("v{i}")).collect();
    let schema = json!({"type": "object", "properties": {"a": {"enum": values}}});
    let e = CompiledGrammar::new(vocab, &Grammar::JsonSchema(schema)).unwrap_err();
    assert!(matches!(e, ConstraintError::Limit { .. }), "{e:?}");
    assert!(e.is_caller_error());
    // Just under the limit still compiles, and no message carries a backtrace.
    CompiledGrammar::new(vocab, &Grammar::Gbnf(alternatives(1_500))).expect("1,500 alternatives");
    let symbols = (0..4_000)
        .map(|i| format!("r{i}: \"x{i}\""))
        .collect::<Vec<_>>()
        .join("\n");
    let rules: Vec<String> = (0..4_000).map(|i| format!("r{i}")).collect();
    let lark = format!("start: {}\n{symbols}\n", rules.join(" "));
    if let Err(e) = CompiledGrammar::new(vocab, &Grammar::Lark(lark)) {
        assert!(!e.to_string().contains("backtrace"), "{e}");
    }
}

/// Chains of rules and of schema references recurse in the grammar compiler once per
/// level; a few hundred levels overflowed an ordinary thread's stack and aborted the
/// process. Chains as long as a request body can hold compile (or are refused by an
/// engine limit) on the compile's own thread.
#[test]
fn long_rule_and_reference_chains_compile_without_overflowing_the_stack() {
    let vocab = &model().vocab;
    let n = 20_000;
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(
            format!("a{i}"),
            json!({"$ref": format!("#/$defs/a{}", i + 1)}),
        );
    }
    defs.insert(format!("a{n}"), json!({"const": "b"}));
    let schema = json!({"$defs": defs, "$ref": "#/$defs/a0"});
    CompiledGrammar::new(vocab, &Grammar::JsonSchema(schema)).expect("a reference chain");
    let mut g = String::from("root ::= r0\n");
    for i in 0..n {
        g.push_str(&format!("r{i} ::= r{}\n", i + 1));
    }
    g.push_str(&format!("r{n} ::= \"b\"\n"));
    CompiledGrammar::new(vocab, &Grammar::Gbnf(g)).expect("a rule chain");
}

/// A schema's open integers and numbers end after `INT_DIGITS` digits before the point
/// and `FRACTION_DIGITS` after it, as llama.cpp's schema grammars do: a model repeating a
/// digit is made to close the number instead of spending every token it has left on it.
#[test]
fn schema_numbers_end_after_a_bounded_count_of_digits() {
    use minfer_runtime::constraint::{FRACTION_DIGITS, INT_DIGITS};
    let m = model();
    let id = |s: &str| {
        let ids = m.tok.encode(s, false, false);
        assert_eq!(ids.len(), 1, "{s:?} is one token");
        ids[0]
    };
    let (one, dot, close) = (id("1"), id("."), id("}"));
    let allowed = |c: &mut minfer_runtime::Constraint, t: u32| {
        let mut logits = vec![0.0f32; m.tok.n_vocab()];
        c.mask(&mut logits).expect("mask");
        logits[t as usize].is_finite()
    };
    for ty in ["integer", "number"] {
        let schema = json!({"type": "object", "properties": {"n": {"type": ty}},
            "required": ["n"], "additionalProperties": false});
        let mut c = compile(Grammar::JsonSchema(schema)).start(Prefetch::Inline);
        for t in m.tok.encode("{\"n\": ", false, false) {
            assert!(allowed(&mut c, t), "{ty}: the prefix");
            c.advance(t).expect("prefix token");
        }
        for i in 0..INT_DIGITS {
            assert!(allowed(&mut c, one), "{ty}: digit {i}");
            c.advance(one).expect("digit");
        }
        assert!(!allowed(&mut c, one), "{ty}: a 17th digit");
        assert!(allowed(&mut c, close), "{ty}: the number ends");
        if ty == "number" {
            c.advance(dot).expect("point");
            for i in 0..FRACTION_DIGITS {
                assert!(allowed(&mut c, one), "decimal {i}");
                c.advance(one).expect("decimal");
            }
            assert!(!allowed(&mut c, one), "an 11th decimal");
            assert!(allowed(&mut c, close));
        }
    }
}

/// The number bounds leave schemas that compiled compiling: numbers beside other types,
/// their own bounds and steps, references, combinators and property patterns.
#[test]
fn schemas_with_numbers_everywhere_still_compile() {
    let schemas = [
        json!({"type": ["integer", "number", "null"]}),
        json!({"type": "number", "multipleOf": 0.25, "exclusiveMinimum": 0}),
        json!({"type": "integer", "minimum": 10_000_000_000_000_000u64}),
        json!({"type": "integer", "maximum": -5}),
        json!({"allOf": [{"type": "number"}, {"multipleOf": 7}]}),
        json!({"anyOf": [{"type": "number"}, {"type": "integer", "multipleOf": 3}],
               "minimum": 1}),
        json!({"$defs": {"n": {"type": "number"}}, "type": "object",
               "properties": {"a": {"$ref": "#/$defs/n", "multipleOf": 3},
                              "b": {"$ref": "#/$defs/n"}}}),
        json!({"type": "object", "properties": {"x1": {"type": "number"}},
               "patternProperties": {"^x": {"type": "number", "multipleOf": 3}}}),
        json!({"type": "array", "prefixItems": [{"type": "number"}],
               "items": {"type": "number", "maximum": 2}}),
        json!({"type": "object", "additionalProperties": {"type": "number"}}),
    ];
    for s in schemas {
        let g = Grammar::JsonSchema(minfer_runtime::constraint::lenient(s.clone()));
        CompiledGrammar::new(&model().vocab, &g).unwrap_or_else(|e| panic!("{s}: {e}"));
    }
}
