//! Constrained decoding: the sampler's constraint step. A [`Grammar`] (a JSON schema, any
//! JSON object, a regular expression, a Lark grammar or llama.cpp's GBNF) is compiled by
//! llguidance against the model's vocabulary into a [`CompiledGrammar`]; each generation
//! runs its own [`Constraint`] from it, which masks the logits to the tokens the grammar
//! allows next ([`Constraint::mask`]) and advances with the chosen token
//! ([`Constraint::advance`]). End-of-generation tokens are allowed exactly when the
//! grammar accepts what has been generated, and are the only tokens once it is complete.
//!
//! The mask for step t+1 depends only on the tokens up to t, so a constraint can compute
//! it on a helper thread while the engine runs step t ([`Prefetch::Helper`]).
//!
//! A [`CompiledGrammar`] may be lazy: with a trigger, generation is free until its text
//! appears in the output, and the grammar constrains what follows (tool calls that the
//! model may or may not start).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use minfer_tokenizer::Tokenizer;

mod numbers;

pub use numbers::{bounded_numbers, FRACTION_DIGITS, INT_DIGITS};

/// What a generation must follow.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A value valid for this JSON schema.
    JsonSchema(serde_json::Value),
    /// Text matching this regular expression (Rust `regex` syntax), wholly.
    Regex(String),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// A grammar in llama.cpp's GBNF, translated to the Lark dialect.
    Gbnf(String),
}

impl Grammar {
    /// The kind of grammar, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Grammar::JsonObject => "JSON object",
            Grammar::JsonSchema(_) => "JSON schema",
            Grammar::Regex(_) => "regular expression",
            Grammar::Lark(_) => "Lark grammar",
            Grammar::Gbnf(_) => "GBNF grammar",
        }
    }
}

/// Why a grammar cannot constrain a generation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConstraintError {
    /// The grammar or schema does not compile; `reason` is the compiler's.
    #[error("the {kind} cannot be compiled: {reason}")]
    Compile { kind: &'static str, reason: String },
    /// The vocabulary cannot carry a grammar (no end-of-generation token, no tokens).
    #[error("the model's vocabulary cannot be used for constrained decoding: {0}")]
    Vocab(String),
    /// The grammar or schema is past a limit of the grammar engine (too many alternatives
    /// open at one point, too large a lexer or grammar); `reason` names the limit. The
    /// request is at fault, whether this is found when compiling or while generating.
    #[error("the {kind} exceeds a limit of the grammar engine: {reason}")]
    Limit { kind: &'static str, reason: String },
    /// The grammar failed during generation (a token it did not allow).
    #[error("constrained decoding failed: {0}")]
    Runtime(String),
}

impl ConstraintError {
    /// Whether the request's grammar is at fault (it does not compile or is past a limit),
    /// as opposed to the engine or the vocabulary.
    pub fn is_caller_error(&self) -> bool {
        matches!(
            self,
            ConstraintError::Compile { .. } | ConstraintError::Limit { .. }
        )
    }
}

/// Tokens the compile-time probe walks from a grammar's start (see [`CompiledGrammar::new`]).
pub const PROBE_STEPS: usize = 24;

/// The limit a grammar-engine message reports, in words that name it, or `None` when the
/// message is not about a limit. The engine's own wording is kept after the summary.
fn limit_reason(message: &str) -> Option<String> {
    let first = message.lines().next().unwrap_or(message).trim();
    // The engine asserts that a grammar's symbols fit 16-bit ids; it reaches callers as a
    // caught panic.
    if first.contains("symbols.len() < u16::MAX") {
        return Some(format!(
            "the grammar needs more than {} symbols (rules, terminals and the schemas' \
             parts), the most the engine holds; use fewer or smaller tools or schemas",
            u16::MAX - 10
        ));
    }
    if let Some(rest) = first.split("Current row has ").nth(1) {
        // "Current row has N items; max is M; ..."
        let n = rest.split(' ').next().unwrap_or("?");
        let max = rest
            .split("max is ")
            .nth(1)
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .unwrap_or("?");
        return Some(format!(
            "{n} alternatives are open at one point of the grammar, and at most {max} may be \
             (write long lists of literals as one regular expression or an enum, or split \
             the request)"
        ));
    }
    let lower = first.to_ascii_lowercase();
    let is_limit = [
        "too big",
        "too large",
        "fuel",
        "limit for",
        "limits.",
        "max is",
        "maximum",
    ]
    .iter()
    .any(|k| lower.contains(k));
    is_limit.then(|| first.to_string())
}

/// A grammar-engine error as the [`ConstraintError`] it is: a limit when it names one,
/// else `other`.
fn classify(
    kind: &'static str,
    message: String,
    other: impl FnOnce(String) -> ConstraintError,
) -> ConstraintError {
    match limit_reason(&message) {
        Some(reason) => ConstraintError::Limit { kind, reason },
        None => other(without_backtrace(message)),
    }
}

/// An engine message without the backtrace it appends to a caught panic (source paths of
/// the build machine, no use to a client).
fn without_backtrace(mut message: String) -> String {
    if let Some(i) = message.find("\n<backtrace>") {
        message.truncate(i);
    }
    message
}

/// The model's vocabulary as llguidance sees it: the token trie and the parser factory,
/// built once per tokenizer (it walks the whole vocabulary) and shared by every grammar.
pub struct GrammarVocab {
    factory: ParserFactory,
    n_vocab: usize,
}

impl std::fmt::Debug for GrammarVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarVocab")
            .field("n_vocab", &self.n_vocab)
            .finish()
    }
}

/// The token environment llguidance asks for: the trie, and a tokenizer for byte strings
/// (used only to force tokens, which minfer does not do, so the trie's greedy one is
/// declared non-canonical and is enough).
struct Env {
    trie: TokTrie,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

impl GrammarVocab {
    /// Builds the trie from every token's bytes, special tokens marked as llguidance
    /// expects (a 0xFF byte before their text, so grammar text never matches them), with
    /// every end-of-generation token as an end of the grammar.
    pub fn new(tok: &Tokenizer) -> Result<Arc<Self>, ConstraintError> {
        let words: Vec<Vec<u8>> = tok
            .token_pieces()
            .map(|(bytes, special)| {
                if special {
                    let mut w = Vec::with_capacity(bytes.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(bytes);
                    w
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let n_vocab = words.len();
        let eog: Vec<u32> = tok
            .eog_ids()
            .iter()
            .copied()
            .filter(|&t| (t as usize) < n_vocab)
            .collect();
        let Some(eos) = tok
            .eos()
            .filter(|e| eog.contains(e))
            .or(eog.first().copied())
        else {
            return Err(ConstraintError::Vocab(
                "it has no end-of-generation token".into(),
            ));
        };
        let n = u32::try_from(n_vocab)
            .map_err(|_| ConstraintError::Vocab(format!("{n_vocab} tokens")))?;
        let info = TokRxInfo::new(n, eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        let env: llguidance::toktrie::TokEnv = Arc::new(Env { trie });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Vocab(e.to_string()))?;
        // Warnings reach the caller as errors or not at all; nothing goes to stderr.
        factory.quiet();
        // Errors reach clients: the reason, not a dump of the parser state and the tokens.
        factory.limits_mut().verbose_errors = false;
        Ok(Arc::new(GrammarVocab { factory, n_vocab }))
    }

    /// Number of tokens the masks cover.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    fn trie(&self) -> &TokTrie {
        self.factory.tok_env().tok_trie()
    }
}

/// A grammar compiled against a vocabulary: the start state every [`Constraint`] of it
/// begins from. Cloning is cheap (the compiled grammar is shared).
#[derive(Clone)]
pub struct CompiledGrammar {
    vocab: Arc<GrammarVocab>,
    start: Matcher,
    trigger: Option<Vec<u8>>,
    unenforced: Vec<String>,
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledGrammar")
            .field(
                "trigger",
                &self.trigger.as_deref().map(String::from_utf8_lossy),
            )
            .finish()
    }
}

/// The stack of the thread a grammar compiles on. Reserved address space, not memory:
/// pages are taken only as deep as the compile goes. A 2 MiB stack held fewer than 600
/// levels of a rule or reference chain (several KB a level); a request body's limit
/// (1 MiB) holds at most a few tens of thousands of levels, and chains of 20,000 to
/// 40,000 compiled (or met an engine limit) on this stack.
pub const COMPILE_STACK: usize = 512 << 20;

impl CompiledGrammar {
    /// Compiles `grammar`; the error names what the compiler refused, or the engine limit
    /// the grammar is past. Some limits (how many alternatives may be open at once) are
    /// met only when tokens are applied, so the compile also walks up to [`PROBE_STEPS`]
    /// tokens from the start (the forced ones, else the lowest-numbered allowed text
    /// token) on a copy of the start state: a grammar that fails there fails here, as the
    /// caller's error, not in the middle of a generation.
    ///
    /// The compile runs on a thread of its own with a [`COMPILE_STACK`] stack: the
    /// grammar engine recurses once per level of a chain of rules or schema references,
    /// so a chain a few hundred long (20 KB of request) overflowed an ordinary thread's
    /// stack, which aborts the whole process.
    pub fn new(vocab: &Arc<GrammarVocab>, grammar: &Grammar) -> Result<Self, ConstraintError> {
        std::thread::scope(|s| {
            let compile = std::thread::Builder::new()
                .name("minfer-grammar".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(s, || Self::compile(vocab, grammar))
                .map_err(|e| ConstraintError::Runtime(format!("starting the compile: {e}")))?;
            compile.join().unwrap_or_else(|_| {
                Err(ConstraintError::Runtime(
                    "the grammar compiler panicked".to_string(),
                ))
            })
        })
    }

    /// [`Self::new`] on the calling thread.
    fn compile(vocab: &Arc<GrammarVocab>, grammar: &Grammar) -> Result<Self, ConstraintError> {
        let kind = grammar.kind();
        let bad = |reason: String| ConstraintError::Compile { kind, reason };
        let top = match grammar {
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(bounded_whitespace(
                serde_json::json!({"type": "object"}),
            )),
            Grammar::JsonSchema(s) => {
                if !s.is_object() && !s.is_boolean() {
                    return Err(bad("a schema must be a JSON object".into()));
                }
                TopLevelGrammar::from_json_schema(bounded_whitespace(bounded_numbers(s.clone())))
            }
            Grammar::Regex(r) => TopLevelGrammar::from_regex(r),
            Grammar::Lark(l) => TopLevelGrammar::from_lark(l.clone()),
            Grammar::Gbnf(g) => {
                TopLevelGrammar::from_lark(gbnf_to_lark(g).map_err(|e| classify(kind, e, bad))?)
            }
        };
        let parser = vocab
            .factory
            .create_parser(top)
            .map_err(|e| classify(kind, e.to_string(), bad))?;
        let start = Matcher::new(Ok(parser));
        if let Some(e) = start.get_error() {
            return Err(classify(kind, e, bad));
        }
        probe(vocab, &start, PROBE_STEPS).map_err(|e| classify(kind, e, bad))?;
        let unenforced = start.clone().grammar_warnings();
        Ok(CompiledGrammar {
            vocab: Arc::clone(vocab),
            start,
            trigger: None,
            unenforced,
        })
    }

    /// What a lenient schema ([`lenient`]) asked that the grammar does not enforce, in the
    /// engine's words (`Unimplemented keys: ["uniqueItems"]`); empty when it enforces all.
    pub fn unenforced(&self) -> &[String] {
        &self.unenforced
    }

    /// This grammar made lazy: generation is unconstrained until the output ends with
    /// `trigger`, and the grammar then constrains what follows it.
    pub fn triggered_by(mut self, trigger: &str) -> Self {
        self.trigger = (!trigger.is_empty()).then(|| trigger.as_bytes().to_vec());
        self
    }

    /// A fresh constraint at the grammar's start.
    pub fn start(&self, prefetch: Prefetch) -> Constraint {
        let active = self.trigger.is_none();
        Constraint {
            vocab: Arc::clone(&self.vocab),
            matcher: Some(self.start.clone()),
            ready: None,
            helper: None,
            prefetch,
            trigger: self.trigger.clone(),
            tail: Vec::new(),
            active,
        }
    }
}

/// Walks up to `steps` tokens from `start` on a copy: the tokens the grammar forces, else
/// the lowest-numbered allowed token that is text (not an end or special token). Stops
/// early where the grammar ends or allows no text; the error is the engine's.
fn probe(vocab: &GrammarVocab, start: &Matcher, steps: usize) -> Result<(), String> {
    let mut m = start.clone();
    let trie = vocab.trie();
    let fail = |m: &Matcher, e: String| m.get_error().unwrap_or(e);
    for _ in 0..steps {
        if m.is_stopped() {
            break;
        }
        let forced = m.consume_ff_tokens();
        if let Some(e) = m.get_error() {
            return Err(e);
        }
        if !forced.is_empty() {
            continue;
        }
        let mask = m.compute_mask().map_err(|e| fail(&m, e.to_string()))?;
        let mut next = None;
        mask.iter_set_entries(|t| {
            if next.is_none() {
                let bytes = trie.token(t as TokenId);
                if !bytes.is_empty() && bytes[0] != TokTrie::SPECIAL_TOKEN_MARKER {
                    next = Some(t as TokenId);
                }
            }
        });
        let Some(t) = next else { break };
        m.consume_token(t).map_err(|e| fail(&m, e.to_string()))?;
    }
    Ok(())
}

/// Whitespace a JSON grammar allows between two tokens: a space or two, or a newline and
/// an indent of up to 32 columns. llguidance's default is any run of whitespace, in which
/// a small model that hesitates before a required key can spend every remaining token;
/// this bound keeps pretty-printed JSON (what models write unconstrained) and compact
/// JSON, and forces progress.
pub const JSON_WHITESPACE: &str = r"[\x20\x09]{1,2}|\x0D?\x0A[\x20\x09]{0,32}";

/// `schema` with [`JSON_WHITESPACE`] as its whitespace rule, unless its llguidance
/// options (`x-guidance`) choose one (`whitespace_pattern`, `whitespace_flexible`) or it
/// is a boolean schema.
pub fn bounded_whitespace(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        let opts = o
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(opts) = opts.as_object_mut() {
            if !opts.contains_key("whitespace_pattern") && !opts.contains_key("whitespace_flexible")
            {
                opts.insert("whitespace_pattern".into(), JSON_WHITESPACE.into());
            }
        }
    }
    schema
}

/// `schema` marked lenient (OpenAI's non-strict mode): a keyword the grammar engine
/// cannot enforce while generating (`uniqueItems`, an unknown `format`, ...) is left out
/// instead of refusing the schema, and the compiled grammar lists what was left out
/// ([`CompiledGrammar::unenforced`]). A boolean schema is returned as it is.
pub fn lenient(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        let opts = o
            .entry("x-guidance")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(opts) = opts.as_object_mut() {
            opts.insert("lenient".into(), true.into());
        }
    }
    schema
}

/// Where the next mask is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefetch {
    /// When the sampler asks for it.
    Inline,
    /// On a helper thread, right after [`Constraint::advance`], while the engine runs the
    /// step that produces the logits it will be applied to.
    Helper,
}

/// The helper thread of one constraint: it receives the matcher, computes its mask and
/// hands both back. It ends when the constraint drops its sender.
struct Helper {
    to: Sender<Matcher>,
    from: Receiver<(Matcher, Result<SimpleVob, String>)>,
    busy: bool,
}

impl Helper {
    fn spawn() -> Result<Self, ConstraintError> {
        let (to, rx) = channel::<Matcher>();
        let (tx, from) = channel();
        std::thread::Builder::new()
            .name("minfer-grammar".into())
            .spawn(move || {
                while let Ok(mut m) = rx.recv() {
                    let mask = m.compute_mask_or_eos().map_err(|e| e.to_string());
                    if tx.send((m, mask)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| ConstraintError::Runtime(format!("starting the mask thread: {e}")))?;
        Ok(Helper {
            to,
            from,
            busy: false,
        })
    }
}

/// One generation's grammar state.
pub struct Constraint {
    vocab: Arc<GrammarVocab>,
    /// `None` only while the helper holds it.
    matcher: Option<Matcher>,
    /// The mask of the current state, when already computed.
    ready: Option<SimpleVob>,
    helper: Option<Helper>,
    prefetch: Prefetch,
    /// The text that starts a lazy grammar, and the latest output bytes to find it in.
    trigger: Option<Vec<u8>>,
    tail: Vec<u8>,
    active: bool,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("active", &self.active)
            .field("prefetch", &self.prefetch)
            .finish()
    }
}

impl Constraint {
    /// Whether the grammar constrains the next token (a lazy one only after its trigger).
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// Takes the matcher back from the helper, with the mask it computed.
    fn settle(&mut self) -> Result<(), ConstraintError> {
        if let Some(h) = self.helper.as_mut().filter(|h| h.busy) {
            h.busy = false;
            let (m, mask) = h
                .from
                .recv()
                .map_err(|_| ConstraintError::Runtime("the mask thread ended".into()))?;
            self.matcher = Some(m);
            self.ready = Some(mask.map_err(runtime)?);
        }
        Ok(())
    }

    fn matcher(&mut self) -> Result<&mut Matcher, ConstraintError> {
        self.settle()?;
        self.matcher
            .as_mut()
            .ok_or_else(|| ConstraintError::Runtime("the grammar state was lost".into()))
    }

    /// Bans (sets to -inf) every logit the grammar does not allow next, and every logit
    /// past the vocabulary. When the grammar is complete only end-of-generation tokens
    /// remain. Does nothing while a lazy grammar waits for its trigger.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        if !self.active {
            return Ok(());
        }
        self.settle()?;
        let mask = match self.ready.take() {
            Some(m) => m,
            None => self
                .matcher()?
                .compute_mask_or_eos()
                .map_err(|e| runtime(e.to_string()))?,
        };
        let n = self.vocab.n_vocab.min(logits.len());
        // Whole 32-token words at a time: most of a large vocabulary is banned.
        for (w, &bits) in mask.as_slice().iter().enumerate() {
            let base = w * 32;
            if base >= n {
                break;
            }
            if bits == u32::MAX {
                continue;
            }
            let end = (base + 32).min(n);
            for (i, l) in logits[base..end].iter_mut().enumerate() {
                if bits & (1 << i) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        for l in logits.iter_mut().skip(n) {
            *l = f32::NEG_INFINITY;
        }
        // Keep the mask for a repeated call on the same state.
        self.ready = Some(mask);
        Ok(())
    }

    /// Advances the grammar with the token that was sampled; a token the grammar does not
    /// allow is an error. With [`Prefetch::Helper`] the next mask starts computing now.
    pub fn advance(&mut self, token: u32) -> Result<(), ConstraintError> {
        if !self.active {
            let Some(trigger) = self.trigger.as_deref() else {
                return Ok(());
            };
            let bytes = self.vocab.trie().token(token);
            self.tail.extend_from_slice(bytes);
            if self.tail.ends_with(trigger) {
                self.active = true;
                self.tail = Vec::new();
                self.ready = None;
                return self.prefetch_next();
            }
            let keep = trigger.len().saturating_sub(1);
            if self.tail.len() > keep {
                self.tail.drain(..self.tail.len() - keep);
            }
            return Ok(());
        }
        self.ready = None;
        let m = self.matcher()?;
        // A token after the grammar stopped can only be an end token, which ends the
        // generation anyway.
        if m.is_stopped() {
            return Ok(());
        }
        m.consume_token(token).map_err(|e| runtime(e.to_string()))?;
        self.ready = None;
        self.prefetch_next()
    }

    fn prefetch_next(&mut self) -> Result<(), ConstraintError> {
        if self.prefetch != Prefetch::Helper {
            return Ok(());
        }
        if self.helper.is_none() {
            self.helper = Some(Helper::spawn()?);
        }
        let (Some(h), Some(m)) = (self.helper.as_mut(), self.matcher.take()) else {
            return Ok(());
        };
        match h.to.send(m) {
            Ok(()) => {
                h.busy = true;
                Ok(())
            }
            Err(e) => {
                self.matcher = Some(e.0);
                Err(ConstraintError::Runtime("the mask thread ended".into()))
            }
        }
    }

    /// Whether the output so far is a complete sentence of the grammar (always true for a
    /// lazy grammar not yet triggered).
    pub fn is_accepting(&mut self) -> Result<bool, ConstraintError> {
        if !self.active {
            return Ok(true);
        }
        self.matcher()?
            .is_accepting()
            .map_err(|e| runtime(e.to_string()))
    }
}

/// An error met while generating: a limit when it names one (the grammar's kind is no
/// longer known here), else a runtime failure.
fn runtime(message: String) -> ConstraintError {
    classify("grammar", message, ConstraintError::Runtime)
}

/// Most alternatives the grammar engine holds open at one point of a parse (llguidance's
/// `max_items_in_row`); a GBNF group with more is refused when translated.
pub const MAX_ALTERNATIVES: usize = 2000;

/// Translates llama.cpp's GBNF into llguidance's Lark dialect: `root` becomes `start`,
/// rule names are renamed injectively into Lark's lowercase names, character classes and
/// `.` become regular expressions, strings are re-quoted, and the operators (`|`, `()`,
/// `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`) carry over. The error names the line.
pub fn gbnf_to_lark(src: &str) -> Result<String, String> {
    let mut p = Gbnf {
        s: src.as_bytes(),
        src,
        i: 0,
    };
    let mut rules: Vec<(String, String)> = Vec::new();
    loop {
        p.space();
        if p.i >= p.s.len() {
            break;
        }
        let name = p.ident().ok_or_else(|| p.err("expected a rule name"))?;
        p.space();
        if !p.eat("::=") {
            return Err(p.err(&format!("expected `::=` after rule name `{name}`")));
        }
        let mut body = String::new();
        let mut depth = 0usize;
        // Alternatives of each open group, outermost first: one group with more than the
        // engine can hold open is refused here, before a costly compile.
        let mut alts = vec![1usize];
        loop {
            p.space();
            if p.i >= p.s.len() || (depth == 0 && p.at_rule_start()) {
                break;
            }
            let c = p.s[p.i];
            let piece = match c {
                b'"' => p.string()?,
                b'[' => p.class()?,
                b'.' => {
                    p.i += 1;
                    "/(?s:.)/".to_string()
                }
                b'(' => {
                    depth += 1;
                    alts.push(1);
                    p.i += 1;
                    "(".into()
                }
                b')' => {
                    depth = depth
                        .checked_sub(1)
                        .ok_or_else(|| p.err("unbalanced `)`"))?;
                    alts.pop();
                    p.i += 1;
                    ")".into()
                }
                b'|' => {
                    let n = alts.last_mut().map_or(0, |n| {
                        *n += 1;
                        *n
                    });
                    if n > MAX_ALTERNATIVES {
                        return Err(p.err(&format!(
                            "rule `{name}` has more than {MAX_ALTERNATIVES} alternatives in \
                             one group, past the engine's maximum open at one point"
                        )));
                    }
                    p.i += 1;
                    "|".into()
                }
                b'*' | b'+' | b'?' => {
                    p.i += 1;
                    (c as char).to_string()
                }
                b'{' => p.repeat()?,
                _ => match p.ident() {
                    Some(r) => lark_name(&r),
                    None => return Err(p.err(&format!("unexpected `{}`", c as char))),
                },
            };
            if !body.is_empty() {
                body.push(' ');
            }
            body.push_str(&piece);
        }
        if depth != 0 {
            return Err(p.err(&format!("unclosed `(` in rule `{name}`")));
        }
        if body.is_empty() {
            return Err(p.err(&format!("rule `{name}` is empty")));
        }
        if rules.iter().any(|(n, _)| *n == name) {
            return Err(format!("rule `{name}` is defined twice"));
        }
        rules.push((name, body));
    }
    if !rules.iter().any(|(n, _)| n == "root") {
        return Err("the grammar has no `root` rule".into());
    }
    let mut out = String::from("start: ");
    out.push_str(&lark_name("root"));
    out.push('\n');
    for (name, body) in &rules {
        out.push_str(&format!("{}: {}\n", lark_name(name), body));
    }
    Ok(out)
}

/// A GBNF name as a Lark rule name: `g_` then the name with `_` doubled, `-` as `_0`
/// and each capital as `_` and its lowercase, so that distinct names stay distinct.
fn lark_name(name: &str) -> String {
    let mut s = String::from("g_");
    for c in name.chars() {
        match c {
            '_' => s.push_str("__"),
            '-' => s.push_str("_0"),
            c if c.is_ascii_uppercase() => {
                s.push('_');
                s.push(c.to_ascii_lowercase());
            }
            c => s.push(c),
        }
    }
    s
}

struct Gbnf<'a> {
    s: &'a [u8],
    src: &'a str,
    i: usize,
}

impl Gbnf<'_> {
    fn err(&self, what: &str) -> String {
        let line = self.src[..self.i.min(self.src.len())]
            .bytes()
            .filter(|&b| b == b'\n')
            .count()
            + 1;
        format!("GBNF line {line}: {what}")
    }

    /// Skips blanks, newlines and `#` comments.
    fn space(&mut self) {
        while self.i < self.s.len() {
            match self.s[self.i] {
                b' ' | b'\t' | b'\r' | b'\n' => self.i += 1,
                b'#' => {
                    while self.i < self.s.len() && self.s[self.i] != b'\n' {
                        self.i += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Option<String> {
        let start = self.i;
        while self.i < self.s.len()
            && (self.s[self.i].is_ascii_alphanumeric() || matches!(self.s[self.i], b'-' | b'_'))
        {
            self.i += 1;
        }
        (self.i > start).then(|| self.src[start..self.i].to_string())
    }

    /// Whether a new rule (`name ::=`) starts here.
    fn at_rule_start(&mut self) -> bool {
        let save = self.i;
        let yes = self.ident().is_some() && {
            self.space();
            self.s[self.i..].starts_with(b"::=")
        };
        self.i = save;
        yes
    }

    /// One (possibly escaped) character inside a string or class; `self.i` is on it.
    fn char_in(&mut self, what: &str) -> Result<char, String> {
        let rest = &self.src[self.i..];
        let mut it = rest.chars();
        let c = it
            .next()
            .ok_or_else(|| self.err(&format!("unterminated {what}")))?;
        if c != '\\' {
            self.i += c.len_utf8();
            return Ok(c);
        }
        let e = it
            .next()
            .ok_or_else(|| self.err(&format!("unterminated {what}")))?;
        self.i += 1 + e.len_utf8();
        let hex = |p: &mut Self, n: usize| -> Result<char, String> {
            let h = p
                .src
                .get(p.i..p.i + n)
                .ok_or_else(|| p.err("short hex escape"))?;
            let v = u32::from_str_radix(h, 16).map_err(|_| p.err("bad hex escape"))?;
            p.i += n;
            char::from_u32(v).ok_or_else(|| p.err("escape outside Unicode"))
        };
        Ok(match e {
            'n' => '\n',
            't' => '\t',
            'r' => '\r',
            'x' => hex(self, 2)?,
            'u' => hex(self, 4)?,
            'U' => hex(self, 8)?,
            c => c,
        })
    }

    fn string(&mut self) -> Result<String, String> {
        self.i += 1;
        let mut text = String::new();
        loop {
            if self.s.get(self.i) == Some(&b'"') {
                self.i += 1;
                break;
            }
            text.push(self.char_in("string")?);
        }
        if text.is_empty() {
            // Lark has no empty literal; an empty regex is the same language.
            return Ok("/(?:)/".into());
        }
        serde_json::to_string(&text).map_err(|e| self.err(&e.to_string()))
    }

    /// `[...]` or `[^...]` as a regex whose every character is a code-point escape, so
    /// nothing in it can mean more to the regex syntax than it did to GBNF.
    fn class(&mut self) -> Result<String, String> {
        self.i += 1;
        let negated = self.eat("^");
        let mut out = String::from(if negated { "/[^" } else { "/[" });
        let mut any = false;
        loop {
            if self.s.get(self.i) == Some(&b']') {
                self.i += 1;
                break;
            }
            let lo = self.char_in("character class")?;
            let mut hi = lo;
            if self.s.get(self.i) == Some(&b'-') && self.s.get(self.i + 1) != Some(&b']') {
                self.i += 1;
                hi = self.char_in("character class")?;
                if hi < lo {
                    return Err(self.err(&format!("range {lo:?}-{hi:?} is reversed")));
                }
            }
            out.push_str(&format!("\\x{{{:x}}}", lo as u32));
            if hi != lo {
                out.push_str(&format!("-\\x{{{:x}}}", hi as u32));
            }
            any = true;
        }
        if !any {
            return Err(self.err("empty character class"));
        }
        out.push_str("]/");
        Ok(out)
    }

    /// `{m}`, `{m,}` or `{m,n}`, checked and copied.
    fn repeat(&mut self) -> Result<String, String> {
        let start = self.i;
        let end = self.src[start..]
            .find('}')
            .map(|e| start + e + 1)
            .ok_or_else(|| self.err("unclosed `{`"))?;
        let inner: String = self.src[start + 1..end - 1]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        let ok = inner
            .split(',')
            .all(|n| n.is_empty() || n.bytes().all(|b| b.is_ascii_digit()))
            && inner.split(',').count() <= 2
            && !inner.starts_with(',');
        if !ok || inner.is_empty() {
            return Err(self.err(&format!("bad repetition `{{{inner}}}`")));
        }
        self.i = end;
        Ok(format!("{{{inner}}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_messages_about_limits_become_limit_errors_without_backtraces() {
        let row = "Current row has 50001 items; max is 2000; consider making your grammar \
                   left-recursive if it's right-recursive\n<state>\nTokens: ...";
        match classify("GBNF grammar", row.into(), ConstraintError::Runtime) {
            ConstraintError::Limit { kind, reason } => {
                assert_eq!(kind, "GBNF grammar");
                assert!(reason.contains("50001 alternatives") && reason.contains("at most 2000"));
                assert!(!reason.contains("<state>"), "{reason}");
            }
            e => panic!("{e:?}"),
        }
        let panic = "panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10\n\
                     <backtrace>\n   0: llguidance::x\n at /src/a.rs:1";
        let e = classify("Lark grammar", panic.into(), ConstraintError::Runtime);
        assert!(matches!(e, ConstraintError::Limit { .. }), "{e:?}");
        assert!(!e.to_string().contains("backtrace") && e.to_string().contains("65525"));
        // Not a limit: kept, less any backtrace; "delimiter" is no limit.
        let other = "panic: unexpected delimiter\n<backtrace>\n   0: x";
        let e = classify("Lark grammar", other.into(), |m| ConstraintError::Compile {
            kind: "Lark grammar",
            reason: m,
        });
        assert_eq!(
            e.to_string(),
            "the Lark grammar cannot be compiled: panic: unexpected delimiter"
        );
    }

    #[test]
    fn gbnf_groups_past_the_alternatives_limit_are_refused_naming_the_rule() {
        let alts = |n: usize| {
            (0..n)
                .map(|i| format!("\"w{i}\""))
                .collect::<Vec<_>>()
                .join(" | ")
        };
        assert!(gbnf_to_lark(&format!("root ::= {}", alts(MAX_ALTERNATIVES))).is_ok());
        let e = gbnf_to_lark(&format!(
            "root ::= \"a\" (x)\nx ::= {}",
            alts(MAX_ALTERNATIVES + 1)
        ))
        .unwrap_err();
        assert!(e.contains("rule `x`") && e.contains("2000"), "{e}");
        // Alternatives of separate groups are counted apart.
        let two = format!("root ::= ({}) ({})", alts(1500), alts(1500));
        assert!(gbnf_to_lark(&two).is_ok());
    }

    #[test]
    fn gbnf_translates_names_classes_strings_and_repeats() {
        let g = r#"
            # a comment
            root ::= greeting ("," ws name){1,3} "!"
            greeting ::= "hi" | "h\"o"
            name ::= [A-Z] [a-z-]* | Ab_c
            Ab_c ::= [^\n\]] .
            ws ::= [ \t]?
        "#;
        let l = gbnf_to_lark(g).unwrap();
        let lines: Vec<&str> = l.lines().collect();
        assert_eq!(lines[0], "start: g_root");
        assert_eq!(
            lines[1],
            r#"g_root: g_greeting ( "," g_ws g_name ) {1,3} "!""#
        );
        assert_eq!(lines[2], r#"g_greeting: "hi" | "h\"o""#);
        assert_eq!(
            lines[3],
            r"g_name: /[\x{41}-\x{5a}]/ /[\x{61}-\x{7a}\x{2d}]/ * | g__ab__c"
        );
        assert_eq!(lines[4], r"g__ab__c: /[^\x{a}\x{5d}]/ /(?s:.)/");
        assert_eq!(lines[5], r"g_ws: /[\x{20}\x{9}]/ ?");
    }

    #[test]
    fn gbnf_names_are_renamed_injectively() {
        let names = ["a-b", "a_b", "aB", "a__b", "A-b", "a_0b"];
        let mapped: std::collections::HashSet<String> =
            names.iter().map(|n| lark_name(n)).collect();
        assert_eq!(mapped.len(), names.len(), "{mapped:?}");
    }

    #[test]
    fn gbnf_errors_name_the_line_and_the_problem() {
        for (g, want) in [
            ("root ::= foo", ""),
            ("root = \"a\"", "line 1: expected `::=`"),
            ("root ::= \"a\"\nx ::= (\"b\"", "line 2: unclosed `(`"),
            ("root ::= \"a\" )", "unbalanced `)`"),
            ("x ::= \"a\"", "no `root` rule"),
            ("root ::= [z-a]", "reversed"),
            ("root ::= \"a\"{x}", "bad repetition"),
            ("root ::= \"abc", "unterminated string"),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
        ] {
            let r = gbnf_to_lark(g);
            if want.is_empty() {
                assert!(r.is_ok(), "{g}: {r:?}");
            } else {
                let e = r.unwrap_err();
                assert!(e.contains(want), "{g}: {e}");
            }
        }
    }
}
