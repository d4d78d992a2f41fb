//! KV sessions: one sequence's token history and the KV rows it wrote, in a versioned,
//! checksummed file that a later process (or another slot) restores instead of prefilling
//! the history again (design §3.6, ADR-0006).
//!
//! Format (version 4, little-endian):
//!
//! | field | bytes |
//! |---|---|
//! | magic `MINFERKV` | 8 |
//! | version | u32 |
//! | architecture | u16 length + UTF-8 |
//! | hyperparameters | 8 × u64 (layers, embd, heads, KV heads, head dim, ffn, vocab, trained ctx), 3 × f32 bits (rms eps, rope base, rope scale), u8 rope style |
//! | model digest | 32 (SHA-256 of the tensor table and sampled tensor data) |
//! | backend id | u16 ([`minfer_graph::Backend`]) |
//! | K, V element formats | 2 × u8 ([`KvType::code`]) |
//! | row width, K and V words per row | 3 × u64 |
//! | sliding-window ring step | u64: 0 when every row was kept, else the step the rings were sized with (see below) |
//! | token count `n` | u64 |
//! | tokens | n × u32 |
//! | per layer keeping KV rows: K rows, then V rows | n × words per row × u32 each |
//! | recurrent state: layer count `r` | u32 (0 for a model without recurrent layers) |
//! | — per recurrent layer: index, conv values `c`, matrix values `m` | u32, u64, u64 |
//! | — then its conv windows, then its delta-rule matrices | (c + m) × f32 bits |
//! | conversation | u8: 0 none, 1 present (then the fields below) |
//! | — tokens dropped by context shifts | u64 |
//! | — system message | u8: 0 none, 1 present (then u32 length + UTF-8) |
//! | — message count `m` | u32 |
//! | — per message: role, content | u16 length + UTF-8, u32 length + UTF-8 |
//! | SHA-256 of everything above | 32 |
//!
//! Version 3 is version 4 without the recurrent state; version 2 is version 3 without
//! the ring step (every row kept); version 1 is version 2 without the conversation
//! section. This build still reads them all and writes version 4.
//!
//! A hybrid recurrent model (Qwen3.5) keeps KV rows in its attention layers only, and in
//! each recurrent layer one state per sequence: the conv window and the delta-rule
//! matrices after exactly the `n` stored tokens. A session of it stores the sequence's
//! state slot beside the rows, so a restored sequence goes on from position `n` as if it
//! had never stopped (it cannot go back: the state holds no earlier position). Saving
//! needs the history to be exactly what the state holds; a file without state (a version
//! before 4) or with state of another shape is refused by name.
//!
//! A sliding-window layer keeping a KV ring ([`crate::swa`]) holds only its last rows:
//! the file stores every position's row as the ring returns it, so rows the ring had
//! already overwritten are stale. The ring step says which are: an engine with rings
//! restores such a file and treats the stale rows as overwritten (a reuse that needs
//! them prefills again); an engine keeping every row of its windowed layers
//! (`--swa-full`) refuses it by name.
//!
//! A file is written to a temporary in the same directory, synced and renamed over the
//! target, so a reader sees the old file or the new one, never a mix. A load checks
//! everything (magic, version, checksum, model, backend, formats, context) before it
//! touches the engine: a refused file changes neither the engine nor the file.

use std::io::Write;
use std::path::{Path, PathBuf};

use minfer_graph::{KvType, RopeStyle};
use minfer_models::HParams;
use minfer_tokenizer::ChatMessage;
use sha2::{Digest, Sha256};

use crate::checkpoint::SlotState;
use crate::engine::{Engine, EngineError};
use crate::multi::MultiEngine;

/// The first bytes of every session file.
pub const MAGIC: [u8; 8] = *b"MINFERKV";

/// The format version this build writes (and the newest it reads).
pub const VERSION: u32 = 4;

/// The oldest format version this build reads: version 1 lacks only the conversation.
pub const OLDEST_VERSION: u32 = 1;

/// Why a session was not saved or restored.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Reading or writing the file failed.
    #[error("session {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The file is not a session file.
    #[error("session {path}: not a minfer KV session (bad magic)")]
    BadMagic {
        /// The file.
        path: PathBuf,
    },
    /// The file is of a format version this build does not read.
    #[error(
        "session {path}: format version {found} is not supported (this build reads versions {OLDEST_VERSION} to {VERSION})"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
    },
    /// The file is damaged: truncated, bit-flipped or inconsistent.
    #[error("session {path}: damaged file ({what})")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The file was written by another model (or another quantisation of it).
    #[error("session {path}: written by another model ({what})")]
    OtherModel {
        /// The file.
        path: PathBuf,
        /// What differs.
        what: String,
    },
    /// The file holds KV rows of another backend or element format.
    #[error("session {path}: {what}")]
    OtherFormat {
        /// The file.
        path: PathBuf,
        /// What differs.
        what: String,
    },
    /// The stored history does not fit the engine's context (or slot).
    #[error("session {path}: holds {needed} tokens but the context holds {n_ctx} (raise -c)")]
    ContextTooSmall {
        /// The file.
        path: PathBuf,
        /// Tokens stored.
        needed: usize,
        /// Positions available.
        n_ctx: usize,
    },
    /// A conversation was asked for, but the file holds only tokens and KV rows.
    #[error(
        "session {path}: holds KV rows but no conversation (a `minfer run --session` file); \
         a chat restores only files it saved"
    )]
    NoConversation {
        /// The file.
        path: PathBuf,
    },
    /// The history to save is not what the engine's KV holds.
    #[error("session: {0}")]
    History(String),
    /// The file's recurrent state does not fit the engine's model: none stored (a file
    /// from before version 4), or of another shape.
    #[error("session {path}: {what}")]
    RecurrentState {
        /// The file.
        path: PathBuf,
        /// What is missing or differs.
        what: String,
    },
    /// The engine failed to read or write its KV.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The conversation a chat session carries beside its tokens, so that a restore gives
/// back the messages the KV rows were rendered from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedChat {
    /// The system message, if any.
    pub system: Option<String>,
    /// The user and assistant turns, in order (without the system message).
    pub messages: Vec<ChatMessage>,
    /// Tokens of the full rendering that context shifts dropped after the kept ones.
    pub dropped: usize,
}

/// What a session file holds: the tokens whose KV rows it restored, and the
/// conversation when a chat saved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The token history, now at positions `0..tokens.len()` of the sequence.
    pub tokens: Vec<u32>,
    /// The conversation, when the file has one.
    pub chat: Option<SavedChat>,
}

/// The fixed part of a session: what must match the restoring engine.
#[derive(Debug, Clone, PartialEq)]
struct Header {
    arch: String,
    hparams: [u64; 8],
    floats: [u32; 3],
    rope: u8,
    digest: [u8; 32],
    backend: u16,
    types: [u8; 2],
    row: u64,
    words: [u64; 2],
    /// The sliding-window ring step (0: every row kept).
    ring_step: u64,
}

fn rope_code(s: RopeStyle) -> u8 {
    match s {
        RopeStyle::NonInterleaved => 0,
        RopeStyle::Interleaved => 1,
    }
}

impl Header {
    fn of(engine: &Engine) -> Result<Header, SessionError> {
        let hp: &HParams = engine.hparams();
        let row = hp.n_head_kv * hp.head_dim;
        let types = engine.kv_types();
        let words = types.map(|t| t.row_words(row).unwrap_or(0) as u64);
        Ok(Header {
            arch: engine.arch().to_string(),
            hparams: [
                hp.n_layer,
                hp.n_embd,
                hp.n_head,
                hp.n_head_kv,
                hp.head_dim,
                hp.n_ff,
                hp.n_vocab,
                hp.n_ctx_train,
            ]
            .map(|x| x as u64),
            floats: [
                hp.rms_eps.to_bits(),
                hp.rope_freq_base.to_bits(),
                hp.rope_freq_scale.to_bits(),
            ],
            rope: rope_code(hp.rope_style),
            digest: engine.model_digest(),
            backend: engine.kv_backend().0,
            types: types.map(KvType::code),
            row: row as u64,
            words,
            ring_step: engine.swa().saved_step() as u64,
        })
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.arch.len() as u16).to_le_bytes());
        out.extend_from_slice(self.arch.as_bytes());
        for x in self.hparams {
            out.extend_from_slice(&x.to_le_bytes());
        }
        for x in self.floats {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.push(self.rope);
        out.extend_from_slice(&self.digest);
        out.extend_from_slice(&self.backend.to_le_bytes());
        out.extend_from_slice(&self.types);
        for x in [self.row, self.words[0], self.words[1], self.ring_step] {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }

    fn read(r: &mut Reader, version: u32) -> Result<Header, String> {
        let n = u16::from_le_bytes(r.take("the architecture")?) as usize;
        let arch = std::str::from_utf8(r.bytes(n, "the architecture")?)
            .map_err(|_| "the architecture is not UTF-8".to_string())?
            .to_string();
        let mut hparams = [0u64; 8];
        for x in &mut hparams {
            *x = u64::from_le_bytes(r.take("the hyperparameters")?);
        }
        let mut floats = [0u32; 3];
        for x in &mut floats {
            *x = u32::from_le_bytes(r.take("the hyperparameters")?);
        }
        let [rope] = r.take("the hyperparameters")?;
        let digest = r.take("the model digest")?;
        let backend = u16::from_le_bytes(r.take("the backend id")?);
        let types = r.take("the KV formats")?;
        let mut geo = [0u64; 3];
        for x in &mut geo {
            *x = u64::from_le_bytes(r.take("the KV geometry")?);
        }
        let ring_step = if version >= 3 {
            u64::from_le_bytes(r.take("the ring step")?)
        } else {
            0
        };
        Ok(Header {
            arch,
            hparams,
            floats,
            rope,
            digest,
            backend,
            types,
            row: geo[0],
            words: [geo[1], geo[2]],
            ring_step,
        })
    }
}

/// What a KV row of `multi` depends on beyond its tokens and position: SHA-256 of what a
/// session file must match to be restored into its engine (the header: model,
/// hyperparameters, KV backend, formats and ring step) and the compute backends' names.
/// Rows of two engines with the same fingerprint are the same bits for the same tokens,
/// so one may take the other's ([`MultiEngine::export_rows`]).
pub fn kv_fingerprint(multi: &MultiEngine) -> [u8; 32] {
    let engine = multi.engine();
    let mut bytes = Vec::new();
    if let Ok(h) = Header::of(engine) {
        h.write(&mut bytes);
    }
    bytes.extend_from_slice(engine.backend_names().join("\n").as_bytes());
    Sha256::digest(&bytes).into()
}

/// A bounds-checked cursor over a file's bytes: a short read names the field it was in.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| format!("it ends inside {what}"))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn take<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let s = self.bytes(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
}

/// Saves the first `history.len()` positions of `engine`'s sequence, which must hold
/// exactly those tokens, to `path` (atomically).
pub fn save(engine: &mut Engine, history: &[u32], path: &Path) -> Result<(), SessionError> {
    save_with(engine, history, None, path)
}

/// [`save`] with the conversation `chat` beside the tokens (what `minfer chat` saves).
pub fn save_with(
    engine: &mut Engine,
    history: &[u32],
    chat: Option<&SavedChat>,
    path: &Path,
) -> Result<(), SessionError> {
    if history.len() > engine.seq_len() {
        return Err(SessionError::History(format!(
            "{} tokens to save but the KV holds {}",
            history.len(),
            engine.seq_len()
        )));
    }
    if engine.is_recurrent() && !engine.keeps(history.len()) {
        return Err(SessionError::History(format!(
            "the recurrent state holds {} positions: a session of `{}` saves exactly those, \
             not {} tokens",
            engine.written(),
            engine.arch(),
            history.len()
        )));
    }
    save_rows(engine, 0, history, chat, path)
}

/// Restores `path` into `engine`: its KV rows become positions `0..n` of the current
/// sequence, and the stored history (`n` tokens) is returned. A refused file leaves the
/// engine as it was.
pub fn load(engine: &mut Engine, path: &Path) -> Result<Vec<u32>, SessionError> {
    load_with(engine, path).map(|r| r.tokens)
}

/// [`load`], also giving back the conversation the file carries (if any).
pub fn load_with(engine: &mut Engine, path: &Path) -> Result<Restored, SessionError> {
    restore(engine, path, false)
}

/// [`load_with`] for a file that must carry a conversation: one without is refused
/// ([`SessionError::NoConversation`]) before the engine is touched.
pub fn load_chat(engine: &mut Engine, path: &Path) -> Result<(Vec<u32>, SavedChat), SessionError> {
    let r = restore(engine, path, true)?;
    match r.chat {
        Some(c) => Ok((r.tokens, c)),
        None => Err(SessionError::NoConversation {
            path: path.to_path_buf(),
        }),
    }
}

fn restore(engine: &mut Engine, path: &Path, need_chat: bool) -> Result<Restored, SessionError> {
    let n_ctx = engine.n_ctx();
    let Checked {
        history,
        words,
        state,
        chat,
        ring_step,
    } = read_checked(engine, path, n_ctx)?;
    if need_chat && chat.is_none() {
        return Err(SessionError::NoConversation {
            path: path.to_path_buf(),
        });
    }
    let written = engine
        .write_kv_rows(0, history.len(), &words)
        .and_then(|()| write_state(engine, 0, &state));
    if let Err(e) = written {
        // Rows may be half rewritten: the sequence no longer holds any of them.
        engine.set_seq_len(0);
        return Err(e.into());
    }
    engine.set_restored_len(history.len(), ring_step);
    Ok(Restored {
        tokens: history,
        chat,
    })
}

/// [`save`] for one slot of a [`MultiEngine`].
pub fn save_slot(
    multi: &mut MultiEngine,
    slot: usize,
    history: &[u32],
    path: &Path,
) -> Result<(), SessionError> {
    let held = multi.slot_len(slot)?;
    if history.len() > held {
        return Err(SessionError::History(format!(
            "{} tokens to save but slot {slot} holds {held}",
            history.len()
        )));
    }
    if multi.engine().is_recurrent() && !multi.keeps(slot, history.len()) {
        return Err(SessionError::History(format!(
            "slot {slot}'s recurrent state holds other positions than the {} tokens to save \
             (a session of a recurrent model saves exactly what the state holds)",
            history.len()
        )));
    }
    let base = slot * multi.slot_ctx();
    save_rows(multi.engine_mut(), base, history, None, path)
}

/// [`load`] into one slot of a [`MultiEngine`] (its share of the context is the limit).
pub fn load_slot(
    multi: &mut MultiEngine,
    slot: usize,
    path: &Path,
) -> Result<Vec<u32>, SessionError> {
    multi.slot_len(slot)?;
    let (cap, base) = (multi.slot_ctx(), slot * multi.slot_ctx());
    let Checked {
        history,
        words,
        state,
        ring_step,
        ..
    } = read_checked(multi.engine_mut(), path, cap)?;
    let engine = multi.engine_mut();
    let written = engine
        .write_kv_rows(base, history.len(), &words)
        .and_then(|()| write_state(engine, slot, &state));
    if let Err(e) = written {
        // Rows may be half rewritten: the slot no longer holds any of them.
        multi.set_slot_len(slot, 0);
        return Err(e.into());
    }
    multi.set_restored_len(slot, history.len(), ring_step);
    Ok(history)
}

fn save_rows(
    engine: &mut Engine,
    base: usize,
    history: &[u32],
    chat: Option<&SavedChat>,
    path: &Path,
) -> Result<(), SessionError> {
    let header = Header::of(engine)?;
    let mut words = Vec::new();
    engine.read_kv_rows(base, history.len(), &mut words)?;
    // The sequence's state slot: its index is its first row over the rows a slot owns.
    let state = if engine.is_recurrent() {
        engine.read_state_slot(base / engine.seq_rows())?
    } else {
        Vec::new()
    };
    let mut out = Vec::with_capacity(64 + 4 * (history.len() + words.len()));
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    header.write(&mut out);
    out.extend_from_slice(&(history.len() as u64).to_le_bytes());
    for t in history {
        out.extend_from_slice(&t.to_le_bytes());
    }
    for w in &words {
        out.extend_from_slice(&w.to_le_bytes());
    }
    write_state_section(&state, &mut out);
    write_chat(chat, &mut out)?;
    let sum: [u8; 32] = Sha256::digest(&out).into();
    out.extend_from_slice(&sum);
    write_atomic(path, &out)
}

/// Appends the conversation section (see the module's table).
fn write_chat(chat: Option<&SavedChat>, out: &mut Vec<u8>) -> Result<(), SessionError> {
    let Some(c) = chat else {
        out.push(0);
        return Ok(());
    };
    let too_long = |what: &str, n: usize| {
        SessionError::History(format!("{what} of {n} bytes is too long to save"))
    };
    out.push(1);
    out.extend_from_slice(&(c.dropped as u64).to_le_bytes());
    match &c.system {
        None => out.push(0),
        Some(s) => {
            out.push(1);
            let n = u32::try_from(s.len()).map_err(|_| too_long("the system message", s.len()))?;
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
    }
    let count = u32::try_from(c.messages.len())
        .map_err(|_| SessionError::History(format!("{} messages", c.messages.len())))?;
    out.extend_from_slice(&count.to_le_bytes());
    for m in &c.messages {
        let r = u16::try_from(m.role.len()).map_err(|_| too_long("a role", m.role.len()))?;
        out.extend_from_slice(&r.to_le_bytes());
        out.extend_from_slice(m.role.as_bytes());
        let n =
            u32::try_from(m.content.len()).map_err(|_| too_long("a message", m.content.len()))?;
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(m.content.as_bytes());
    }
    Ok(())
}

/// Appends the recurrent state section (see the module's table).
fn write_state_section(state: &[SlotState], out: &mut Vec<u8>) {
    out.extend_from_slice(&(state.len() as u32).to_le_bytes());
    for (layer, conv, ssm) in state {
        out.extend_from_slice(&(*layer as u32).to_le_bytes());
        out.extend_from_slice(&(conv.len() as u64).to_le_bytes());
        out.extend_from_slice(&(ssm.len() as u64).to_le_bytes());
        for x in conv.iter().chain(ssm) {
            out.extend_from_slice(&x.to_bits().to_le_bytes());
        }
    }
}

/// Reads the recurrent state section: per layer (index, conv values, matrix values).
fn read_state_section(r: &mut Reader) -> Result<Vec<SlotState>, String> {
    let count = u32::from_le_bytes(r.take("the recurrent layer count")?);
    // Not preallocated: the count is only as good as the bytes that follow it.
    let mut state = Vec::new();
    for _ in 0..count {
        let layer = u32::from_le_bytes(r.take("a recurrent layer")?) as usize;
        // Both counts come before the values.
        let nc = u64::from_le_bytes(r.take("a recurrent layer's conv size")?);
        let nm = u64::from_le_bytes(r.take("a recurrent layer's matrix size")?);
        let conv = read_floats(r, nc, "a recurrent layer's conv windows")?;
        let ssm = read_floats(r, nm, "a recurrent layer's matrices")?;
        state.push((layer, conv, ssm));
    }
    Ok(state)
}

/// `n` f32 values stored as their bits.
fn read_floats(r: &mut Reader, n: u64, what: &str) -> Result<Vec<f32>, String> {
    let bytes = usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_mul(4))
        .ok_or_else(|| format!("{n} values in {what}"))?;
    Ok(r.bytes(bytes, what)?
        .chunks_exact(4)
        .map(|c| f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect())
}

/// Writes a restored state into the engine's state slot `slot` (nothing for a model
/// without recurrent layers).
fn write_state(engine: &mut Engine, slot: usize, state: &[SlotState]) -> Result<(), EngineError> {
    if engine.is_recurrent() {
        engine.write_state_slot(slot, state)?;
    }
    Ok(())
}

/// Reads the conversation section, which must end the body exactly.
fn read_chat(r: &mut Reader) -> Result<Option<SavedChat>, String> {
    let text = |r: &mut Reader, n: usize, what: &str| -> Result<String, String> {
        let b = r.bytes(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    };
    let chat = match r.take::<1>("the conversation")? {
        [0] => None,
        [1] => {
            let dropped = u64::from_le_bytes(r.take("the conversation")?);
            let dropped = usize::try_from(dropped)
                .map_err(|_| format!("{dropped} tokens dropped by shifts"))?;
            let system = match r.take::<1>("the system message")? {
                [0] => None,
                [1] => {
                    let n = u32::from_le_bytes(r.take("the system message")?) as usize;
                    Some(text(r, n, "the system message")?)
                }
                [x] => return Err(format!("system message flag {x}")),
            };
            let count = u32::from_le_bytes(r.take("the message count")?);
            // Not preallocated: the count is only as good as the bytes that follow it.
            let mut messages = Vec::new();
            for _ in 0..count {
                let n = u16::from_le_bytes(r.take("a message role")?) as usize;
                let role = text(r, n, "a message role")?;
                let n = u32::from_le_bytes(r.take("a message")?) as usize;
                let content = text(r, n, "a message")?;
                messages.push(ChatMessage::new(role, content));
            }
            Some(SavedChat {
                system,
                messages,
                dropped,
            })
        }
        [x] => return Err(format!("conversation flag {x}")),
    };
    if r.at != r.buf.len() {
        return Err(format!(
            "{} bytes follow the conversation",
            r.buf.len() - r.at
        ));
    }
    Ok(chat)
}

/// Writes `bytes` to a temporary beside `path`, syncs it and renames it over `path`; on
/// any failure the temporary is removed and `path` is untouched.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), SessionError> {
    let io = |source| SessionError::Io {
        path: path.to_path_buf(),
        source,
    };
    let name = path
        .file_name()
        .ok_or_else(|| SessionError::History(format!("{} names no file", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let r = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    // The rename is durable once the directory is synced (best effort: not every
    // platform opens directories).
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// A file that passed every check: its history, KV words, recurrent state and
/// conversation.
struct Checked {
    history: Vec<u32>,
    words: Vec<u32>,
    /// The sequence's recurrent state (empty for a model without recurrent layers).
    state: Vec<SlotState>,
    chat: Option<SavedChat>,
    /// The ring step the rows were saved with (0: every row kept).
    ring_step: usize,
}

/// Reads and checks `path` against `engine` for a sequence of at most `cap` positions:
/// what it holds, or the refusal. The engine is changed only by creating its KV and
/// state regions if no step has run yet (their shape is part of the check).
fn read_checked(engine: &mut Engine, path: &Path, cap: usize) -> Result<Checked, SessionError> {
    let p = || path.to_path_buf();
    let buf = std::fs::read(path).map_err(|source| SessionError::Io { path: p(), source })?;
    let damaged = |what: String| SessionError::Damaged { path: p(), what };
    if buf.len() < MAGIC.len() || buf[..MAGIC.len()] != MAGIC {
        if buf.len() < MAGIC.len() && MAGIC.starts_with(&buf) {
            return Err(damaged(format!("truncated to {} bytes", buf.len())));
        }
        return Err(SessionError::BadMagic { path: p() });
    }
    let mut r = Reader { buf: &buf, at: 8 };
    let version = u32::from_le_bytes(r.take("the version").map_err(damaged)?);
    if !(OLDEST_VERSION..=VERSION).contains(&version) {
        return Err(SessionError::Version {
            path: p(),
            found: version,
        });
    }
    if buf.len() < 12 + 32 {
        return Err(damaged(format!("truncated to {} bytes", buf.len())));
    }
    let (body, sum) = buf.split_at(buf.len() - 32);
    if Sha256::digest(body).as_slice() != sum {
        return Err(damaged(
            "checksum mismatch: the file is truncated or corrupted".into(),
        ));
    }
    let mut r = Reader { buf: body, at: 12 };
    let stored = Header::read(&mut r, version).map_err(damaged)?;
    let mine = Header::of(engine)?;
    if stored.arch != mine.arch
        || stored.hparams != mine.hparams
        || stored.floats != mine.floats
        || stored.rope != mine.rope
    {
        return Err(SessionError::OtherModel {
            path: p(),
            what: format!(
                "{} {:?}, this engine runs {} {:?}",
                stored.arch, stored.hparams, mine.arch, mine.hparams
            ),
        });
    }
    if stored.digest != mine.digest {
        return Err(SessionError::OtherModel {
            path: p(),
            what: "same architecture and shape, other weights or quantisation".into(),
        });
    }
    if stored.backend != mine.backend {
        return Err(SessionError::OtherFormat {
            path: p(),
            what: format!(
                "KV rows of backend {}, this engine keeps them on backend {}",
                stored.backend, mine.backend
            ),
        });
    }
    if stored.types != mine.types {
        let name = |c: u8| KvType::from_code(c).map_or(format!("code {c}"), |t| t.to_string());
        let mt = engine.kv_types();
        return Err(SessionError::OtherFormat {
            path: p(),
            what: format!(
                "KV stored as K {} / V {}, this engine uses K {} / V {} (set --cache-type-k/--cache-type-v to match)",
                name(stored.types[0]),
                name(stored.types[1]),
                mt[0],
                mt[1]
            ),
        });
    }
    if stored.ring_step > 0 && mine.ring_step == 0 && engine.swa().windowed() {
        return Err(SessionError::OtherFormat {
            path: p(),
            what: "the sliding-window layers' rows were saved from a KV ring, this engine keeps every row (--swa-full)".into(),
        });
    }
    if stored.row != mine.row || stored.words != mine.words {
        return Err(damaged(format!(
            "rows of {} in {:?} words, this engine stores {} in {:?}",
            stored.row, stored.words, mine.row, mine.words
        )));
    }
    let n = u64::from_le_bytes(r.take("the token count").map_err(damaged)?);
    let n = usize::try_from(n).map_err(|_| damaged(format!("{n} tokens")))?;
    // Recurrent layers keep state, not rows.
    let per_token = (mine.words[0] + mine.words[1]) as usize * engine.kv_layers() + 1;
    let rest = body.len() - r.at;
    // Version 1 ends with the KV rows; version 2 adds at least the conversation flag.
    let tail = usize::from(version >= 2);
    let kv_bytes = n.checked_mul(per_token).and_then(|w| w.checked_mul(4));
    let fits = match kv_bytes {
        Some(b) if version >= 2 => b.checked_add(tail).is_some_and(|need| need <= rest),
        Some(b) => b == rest,
        None => false,
    };
    if !fits {
        return Err(damaged(format!(
            "{n} tokens need {} more bytes, the file has {rest}",
            n.saturating_mul(per_token)
                .saturating_mul(4)
                .saturating_add(tail)
        )));
    }
    if n > cap {
        return Err(SessionError::ContextTooSmall {
            path: p(),
            needed: n,
            n_ctx: cap,
        });
    }
    let words_of = |b: &[u8]| -> Vec<u32> {
        b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let history = words_of(r.bytes(4 * n, "the token history").map_err(damaged)?);
    let n_vocab = engine.n_vocab();
    if let Some(&t) = history.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(damaged(format!(
            "token {t} is outside the vocabulary of {n_vocab}"
        )));
    }
    let kv_end = r.at + 4 * n * (per_token - 1);
    let words = words_of(&body[r.at..kv_end]);
    let mut c = Reader {
        buf: body,
        at: kv_end,
    };
    let state = if version >= 4 {
        read_state_section(&mut c).map_err(damaged)?
    } else {
        Vec::new()
    };
    let geometry = engine.state_geometry()?;
    let shape: Vec<(usize, usize, usize)> = state
        .iter()
        .map(|(l, c, m)| (*l, c.len(), m.len()))
        .collect();
    if shape != geometry {
        let what = if version < 4 {
            format!(
                "format version {version} stores no recurrent state, which `{}` keeps beside \
                 its KV rows (run the prompt again)",
                engine.arch()
            )
        } else {
            format!(
                "recurrent state of (layer, conv, matrix) values {shape:?}, this engine keeps \
                 {geometry:?}"
            )
        };
        return Err(SessionError::RecurrentState { path: p(), what });
    }
    let chat = if version >= 2 {
        read_chat(&mut c).map_err(damaged)?
    } else {
        None
    };
    Ok(Checked {
        history,
        words,
        state,
        chat,
        ring_step: usize::try_from(stored.ring_step).unwrap_or(usize::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_names_the_field_it_ran_out_in() {
        let mut r = Reader {
            buf: &[1, 2, 3],
            at: 0,
        };
        assert_eq!(r.take::<2>("a").unwrap(), [1, 2]);
        let e = r.take::<2>("the token history").unwrap_err();
        assert!(e.contains("the token history"), "{e}");
    }
}
