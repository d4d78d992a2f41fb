//! Encoding throughput on 1 MB of mixed text with the default model's vocabulary.
//! Run: `cargo bench -p minfer-tokenizer --bench encode` (needs `minfer pull` first).

use minfer_gguf::GgufFile;
use minfer_tokenizer::Tokenizer;
use std::time::Instant;

/// Deterministic mixed text: prose, code, digits, whitespace runs, CJK, Cyrillic, emoji.
fn mixed_text(target: usize) -> String {
    const PARTS: [&str; 10] = [
        "The quick brown fox doesn't jump over the lazy dog; it's 42 times faster. ",
        "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{v:?}\");\n}\n",
        "def f(x):\n\treturn {'a': x ** 2, \"b\": [1, 2, 3]}  # comment\n\n",
        "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
        "Привет, мир! Это тестовая строка на русском языке. ",
        "👋🏽 Hello 👨‍👩‍👧‍👦 family 🇯🇵 flag ✨ ",
        "   \t  \n\n\n    indented    text   ",
        "3.14159265358979323846 2718281828 1,000,000 0xDEADBEEF ",
        "مرحبا بالعالم. नमस्ते दुनिया। ",
        "<html><body class=\"main\"><p>Some &amp; text</p></body></html>\n",
    ];
    let mut s = String::with_capacity(target + 256);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    while s.len() < target {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        s.push_str(PARTS[(state % PARTS.len() as u64) as usize]);
    }
    s
}

fn main() {
    let path = minfer_hub::default_model_path();
    let file = GgufFile::open(&path).unwrap_or_else(|e| {
        panic!(
            "cannot open {} ({e}); run `minfer pull` first",
            path.display()
        )
    });
    let t0 = Instant::now();
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer loads");
    let load = t0.elapsed();
    println!(
        "load: {:.1} ms ({} tokens, {} merges)",
        load.as_secs_f64() * 1e3,
        tok.n_vocab(),
        tok.n_merges()
    );

    let text = mixed_text(1 << 20);
    let mb = text.len() as f64 / 1e6;
    let mut best = f64::INFINITY;
    let mut n_ids = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let ids = tok.encode(&text, false, false);
        best = best.min(t.elapsed().as_secs_f64());
        n_ids = ids.len();
    }
    println!(
        "encode: {:.2} MB in {:.1} ms -> {:.1} MB/s ({n_ids} tokens)",
        mb,
        best * 1e3,
        mb / best
    );

    let ids = tok.encode(&text, false, false);
    let t = Instant::now();
    let back = tok.decode_bytes(&ids, false).expect("ids are in range");
    let dt = t.elapsed().as_secs_f64();
    assert_eq!(back, text.as_bytes(), "round trip");
    println!("decode: {:.1} MB/s", mb / dt);
}
