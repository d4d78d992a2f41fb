//! The prompt cache shared across slots, over HTTP on the tiny model: a prompt sharing a
//! long prefix with one that ran in another slot copies the cached blocks instead of
//! prefilling them (the hit counters move), every greedy answer and its log-probabilities
//! are bitwise those of a server without the cache (plain, `n` choices, speculative, a
//! slot saved and restored after a hit),
//! another model's blocks are never taken, and a tiny budget keeps the cache within it.

use crate::common;

use common::*;
use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model, TinySpec};
use minfer_server::{start, Config, ModelSpec};
use serde_json::{json, Value};

/// A prefix of about 160 tokens of the tiny model, then a short distinct tail.
fn prompt(tail: &str) -> String {
    let mut p = String::new();
    for i in 0..8 {
        p.push_str(&format!("rule {i}: answer briefly. "));
    }
    p.push_str(tail);
    p
}

fn body(prompt: &str, slot: usize, extra: Value) -> Value {
    let mut b = json!({
        "prompt": prompt, "temperature": 0, "max_tokens": 8, "id_slot": slot, "logprobs": 2,
    });
    if let (Some(o), Value::Object(e)) = (b.as_object_mut(), extra) {
        o.extend(e);
    }
    b
}

/// A counter or gauge of `/metrics`.
async fn metric(base: &str, name: &str) -> f64 {
    let (st, text) = get(base, "/metrics").await;
    assert_eq!(st, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {v}"))
}

/// Runs the first prompt in slot 0, then the second in slot 1 with `extra` (in free
/// slots, slot 0 erased first, when it asks for `n` choices); returns
/// both answers' choices and the second's cached tokens.
async fn two_slots(base: &str, extra: &Value) -> (Vec<Value>, u64) {
    let (st, a) = post(base, "/v1/completions", body(&prompt("x"), 0, json!({}))).await;
    assert_eq!(st, 200, "{a}");
    let mut second = body(&prompt("y"), 1, extra.clone());
    if extra.get("n").is_some() {
        // Choices take the slots the server picks: with slot 0 erased, none holds the
        // prefix.
        let (st, v) = post(base, "/slots/0?action=erase", json!({})).await;
        assert_eq!(st, 200, "{v}");
        second.as_object_mut().map(|o| o.remove("id_slot"));
    }
    let (st, b) = post(base, "/v1/completions", second).await;
    assert_eq!(st, 200, "{b}");
    (vec![a["choices"].clone(), b["choices"].clone()], cached(&b))
}

/// A change to a server's config.
type Edit = fn(&mut Config);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_slot_copies_the_shared_prefix_and_answers_bitwise_as_without_the_cache() {
    let cases: [(&str, Value, Edit); 3] = [
        ("plain", json!({}), |_| {}),
        ("n choices", json!({"n": 2}), |_| {}),
        ("speculative", json!({}), |c| {
            c.lookup = Some(4);
            c.draft_depth = Some(3);
        }),
    ];
    for (what, extra, edit) in cases {
        let on = tiny_server(3, |c| {
            c.cache_block = 16;
            edit(c);
        });
        let off = tiny_server(3, |c| {
            c.cache_ram = 0;
            edit(c);
        });
        let hits0 = metric(&on.base, "vllm:prefix_cache_hits_total").await;
        let (want, none) = two_slots(&off.base, &extra).await;
        let (got, hit) = two_slots(&on.base, &extra).await;
        assert_eq!(got, want, "{what}: the cache changed an answer");
        assert_eq!(none, 0, "{what}: without the cache slot 1 holds nothing");
        assert!(hit >= 16 * 8, "{what}: only {hit} cached tokens");
        let copied = metric(&on.base, "minfer_prompt_cache_hit_tokens_total").await;
        assert!(copied >= 128.0, "{what}: {copied} tokens from the cache");
        let hits = metric(&on.base, "vllm:prefix_cache_hits_total").await;
        assert!(
            hits - hits0 >= hit as f64,
            "{what}: prefix hits {hits0} -> {hits}"
        );
        assert!(metric(&on.base, "minfer_prompt_cache_bytes").await > 0.0);
        assert_eq!(
            metric(&off.base, "minfer_prompt_cache_hit_tokens_total").await,
            0.0
        );
        on.stop().expect("stop");
        off.stop().expect("stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_models_blocks_are_never_taken() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("alpha.gguf"), dir.path().join("beta.gguf"));
    // The same architecture and vocabulary: the same prompt is the same tokens.
    write_tiny_model(&a, &TinySpec::qwen2(GgmlType::Q8_0, 7)).unwrap();
    write_tiny_model(&b, &TinySpec::qwen2(GgmlType::Q8_0, 8)).unwrap();
    let serve = |cache_ram: usize| {
        let mut c = tiny_config(&a, 2);
        c.models.push(ModelSpec::new(&b));
        c.max_models = 2;
        c.cache_block = 16;
        c.cache_ram = cache_ram;
        let running = start(c).expect("starting the server");
        let base = format!("http://{}", running.addr());
        (running, base)
    };
    let ask = |model: &str, slot: usize| {
        let mut v = body(&prompt("x"), slot, json!({}));
        v["model"] = json!(model);
        v
    };
    let (off, off_base) = serve(0);
    let (st, want) = post(&off_base, "/v1/completions", ask("beta", 0)).await;
    assert_eq!(st, 200, "{want}");
    let (on, base) = serve(64 << 20);
    let (st, alpha) = post(&base, "/v1/completions", ask("alpha", 0)).await;
    assert_eq!(st, 200, "{alpha}");
    assert!(metric(&base, "minfer_prompt_cache_bytes").await > 0.0);
    let (st, beta) = post(&base, "/v1/completions", ask("beta", 1)).await;
    assert_eq!(st, 200, "{beta}");
    assert_eq!(
        beta["usage"]["prompt_tokens"],
        alpha["usage"]["prompt_tokens"]
    );
    assert_eq!(cached(&beta), 0, "beta took alpha's rows");
    assert_eq!(
        metric(&base, "minfer_prompt_cache_hit_tokens_total").await,
        0.0
    );
    assert_eq!(beta["choices"], want["choices"]);
    // Beta's own blocks serve beta.
    let (st, again) = post(&base, "/v1/completions", ask("beta", 0)).await;
    assert_eq!(st, 200, "{again}");
    assert!(cached(&again) >= 128, "{again}");
    assert_eq!(again["choices"], want["choices"]);
    on.stop().expect("stop");
    off.stop().expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_budget_holds_and_the_least_recently_used_prefix_goes_first() {
    // The budget is what one prompt's blocks took: a second prompt pushes them out.
    let probe = tiny_server(2, |c| c.cache_block = 16);
    let (st, v) = post(
        &probe.base,
        "/v1/completions",
        body(&prompt("x"), 0, json!({})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let budget = metric(&probe.base, "minfer_prompt_cache_bytes").await as usize;
    assert!(budget > 0);
    probe.stop().expect("stop");
    let s = tiny_server(2, |c| {
        c.cache_block = 16;
        c.cache_ram = budget;
    });
    let other = format!("{} other", "words that differ entirely ".repeat(6));
    let (st, _) = post(&s.base, "/v1/completions", body(&prompt("x"), 0, json!({}))).await;
    assert_eq!(st, 200);
    // Another long prompt in the same slot: the first one's blocks are pushed out.
    let (st, _) = post(&s.base, "/v1/completions", body(&other, 0, json!({}))).await;
    assert_eq!(st, 200);
    assert!(metric(&s.base, "minfer_prompt_cache_bytes").await <= budget as f64);
    let (st, v) = post(&s.base, "/v1/completions", body(&prompt("y"), 1, json!({}))).await;
    assert_eq!(st, 200, "{v}");
    let whole = (tokens - 1) / 16 * 16;
    assert!(cached(&v) < whole, "the evicted prefix was served: {v}");
    // That prompt's blocks are back (pushing out the other's): a slot holding none of
    // them gets every whole block from the cache.
    let (st, v) = post(&s.base, "/v1/completions", body(&prompt("z"), 0, json!({}))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(cached(&v), whole, "{v}");
    assert!(metric(&s.base, "minfer_prompt_cache_bytes").await <= budget as f64);
    s.stop().expect("stop");
}

/// Slot 0 runs a prompt; slot 1 takes its prefix (from the cache when on), is saved and
/// restored into slot 0, which then continues a longer prompt. Returns every answer.
async fn save_restore_after_a_hit(base: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for (p, slot) in [(prompt("x"), 0), (prompt("y"), 1)] {
        let (st, v) = post(base, "/v1/completions", body(&p, slot, json!({}))).await;
        assert_eq!(st, 200, "{v}");
        out.push(v["choices"].clone());
    }
    let (st, v) = post(base, "/slots/1?action=save", json!({"filename": "one.kv"})).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = post(
        base,
        "/slots/0?action=restore",
        json!({"filename": "one.kv"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = post(base, "/v1/completions", body(&prompt("y z"), 0, json!({}))).await;
    assert_eq!(st, 200, "{v}");
    assert!(cached(&v) > 128, "the restored rows were not reused: {v}");
    out.push(v["choices"].clone());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_that_took_cached_rows_saves_and_restores_as_one_that_prefilled() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |cache_ram: usize| {
        tiny_server(2, |c| {
            c.cache_block = 16;
            c.cache_ram = cache_ram;
            c.slot_save_path = Some(dir.path().to_path_buf());
        })
    };
    let off = serve(0);
    let want = save_restore_after_a_hit(&off.base).await;
    off.stop().expect("stop");
    let on = serve(64 << 20);
    let got = save_restore_after_a_hit(&on.base).await;
    assert!(metric(&on.base, "minfer_prompt_cache_hit_tokens_total").await >= 128.0);
    assert_eq!(got, want);
    on.stop().expect("stop");
}

/// A hybrid recurrent model (the tiny Qwen3.5): its state is one per slot, not rows by
/// position, so the cache is skipped for it (nothing copied, nothing stored) and the
/// answer is the one a server without the cache gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recurrent_model_skips_the_cache_and_answers_as_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hybrid.gguf");
    write_tiny_model(&path, &TinySpec::qwen35(GgmlType::F32, 3)).unwrap();
    let serve = |cache_ram: usize| {
        let mut c = tiny_config(&path, 3);
        c.cache_block = 16;
        c.cache_ram = cache_ram;
        let running = start(c).expect("starting the server");
        let base = format!("http://{}", running.addr());
        (running, base)
    };
    let (off, off_base) = serve(0);
    let (want, _) = two_slots(&off_base, &json!({})).await;
    let (on, base) = serve(64 << 20);
    let (got, hit) = two_slots(&base, &json!({})).await;
    assert_eq!(got, want, "the cache changed a recurrent model's answer");
    assert_eq!(hit, 0, "a recurrent model took rows from the cache");
    assert_eq!(
        metric(&base, "minfer_prompt_cache_hit_tokens_total").await,
        0.0
    );
    assert_eq!(metric(&base, "minfer_prompt_cache_bytes").await, 0.0);
    on.stop().expect("stop");
    off.stop().expect("stop");
}
