//! llama-server's slot routes: `POST /slots/{id}?action=save|restore|erase` with
//! `{"filename": ...}`, saving and restoring a slot's KV session under
//! `--slot-save-path DIR`. The HTTP side checks the request and the name; the worker,
//! which owns the engine, does the work between two steps and answers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::Json;
use minfer_runtime::session::{self, SessionError};
use minfer_runtime::{KvHistory, MultiEngine};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::AppState;

/// What to do with a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotAction {
    /// Save the slot's history and KV rows to the file.
    Save(PathBuf),
    /// Replace the slot's contents with the file's.
    Restore(PathBuf),
    /// Forget the slot's contents.
    Erase,
}

/// One slot action for the worker, with the channel its answer goes back on.
#[derive(Debug)]
pub struct SlotOp {
    /// Slot index.
    pub slot: usize,
    /// The action.
    pub action: SlotAction,
    /// The file name as the client gave it (echoed in the answer).
    pub filename: String,
    /// Where the answer goes.
    pub reply: tokio::sync::oneshot::Sender<Result<Value, ApiError>>,
}

/// Refuses a name that is empty, hidden, or could leave the save directory (`..`, an
/// absolute path, any separator), so every accepted name is a plain file inside it.
pub fn check_filename(name: &str) -> Result<(), ApiError> {
    let bad = |why: &str| {
        Err(ApiError::bad_request(format!(
            "invalid filename {name:?}: {why}; give a plain file name inside --slot-save-path"
        )))
    };
    if name.is_empty() || name.len() > 255 {
        return bad("it must be 1 to 255 bytes");
    }
    if name.contains(['/', '\\']) || Path::new(name).is_absolute() {
        return bad("it contains a path separator");
    }
    if name.contains("..") || name.starts_with('.') {
        return bad("it must not start with a dot or contain '..'");
    }
    if name.chars().any(|c| c.is_control() || c == ':') {
        return bad("it contains a control character or ':'");
    }
    Ok(())
}

/// The route: checks the slot id, the action and the file name, and has the worker run it.
pub async fn slot_action(
    State(st): State<Arc<AppState>>,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let (s, name) = (Arc::clone(&st), q.get("model").cloned());
    let model = st.blocking.run(move || s.model(name.as_deref())).await??;
    let n = model.n_slots;
    let slot: usize = id
        .parse()
        .ok()
        .filter(|&s| s < n)
        .ok_or_else(|| ApiError::bad_request(format!("slot id {id:?} is not in 0..{n}")))?;
    // A JSON content type forces a browser's preflight, so another site's page cannot
    // save, restore or erase a slot with a plain form post.
    crate::security::require_json(&Method::POST, &headers)?;
    let action = q.get("action").map(String::as_str).unwrap_or("");
    let file = || -> Result<(PathBuf, String), ApiError> {
        let dir = st.slot_save_path.as_ref().ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "slot save and restore need the server started with --slot-save-path DIR",
            )
        })?;
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))?;
        let name = v
            .get("filename")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad_request("\"filename\" (a string) is required"))?;
        check_filename(name)?;
        Ok((dir.join(name), name.to_string()))
    };
    let (action, filename) = match action {
        "save" => file().map(|(p, n)| (SlotAction::Save(p), n))?,
        "restore" => file().map(|(p, n)| (SlotAction::Restore(p), n))?,
        "erase" => (SlotAction::Erase, String::new()),
        other => {
            return Err(ApiError::bad_request(format!(
                "action {other:?} is not one of save, restore, erase"
            )))
        }
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    model.worker.slot_op(SlotOp {
        slot,
        action,
        filename,
        reply: tx,
    })?;
    let answer = rx
        .await
        .map_err(|_| ApiError::internal("the inference worker has stopped"))??;
    Ok(Json(answer))
}

/// A session refusal as an HTTP error: a missing file is 404, everything else the
/// client can fix is 400.
fn session_error(e: SessionError) -> ApiError {
    match &e {
        SessionError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            ApiError::new(StatusCode::NOT_FOUND, e.to_string())
        }
        SessionError::Engine(_) => ApiError::internal(e.to_string()),
        _ => ApiError::bad_request(e.to_string()),
    }
}

/// Runs `op` on an idle slot whose KV holds `cached` (the worker's side), updating
/// `cached` to what the slot holds afterwards. The answer follows llama-server's fields.
pub(crate) fn apply(
    engine: &mut MultiEngine,
    cached: &mut KvHistory,
    op: &SlotOp,
) -> Result<Value, ApiError> {
    let t0 = Instant::now();
    let ms = || t0.elapsed().as_secs_f64() * 1e3;
    let slot = op.slot;
    match &op.action {
        SlotAction::Save(path) => {
            // What the KV holds: a finished request's last sampled token is never run.
            let held = engine
                .slot_len(slot)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            cached.truncate(held);
            session::save_slot(engine, slot, cached.tokens(), path).map_err(session_error)?;
            let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            Ok(json!({
                "id_slot": slot,
                "filename": op.filename,
                "n_saved": cached.len(),
                "n_written": bytes,
                "timings": { "save_ms": ms() },
            }))
        }
        SlotAction::Restore(path) => {
            let history = session::load_slot(engine, slot, path).map_err(session_error)?;
            let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            let n = history.len();
            *cached = KvHistory::from_tokens(history);
            Ok(json!({
                "id_slot": slot,
                "filename": op.filename,
                "n_restored": n,
                "n_read": bytes,
                "timings": { "restore_ms": ms() },
            }))
        }
        SlotAction::Erase => {
            let n = cached.len();
            engine
                .reset_slot(slot)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            cached.clear();
            Ok(json!({ "id_slot": slot, "n_erased": n }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_leave_the_directory_are_refused() {
        for bad in [
            "",
            "..",
            "../x.kv",
            "a/../../b",
            "/etc/passwd",
            "sub/x.kv",
            "a\\b",
            ".hidden",
            "x..kv",
            "c:x",
            "a\nb",
        ] {
            assert!(check_filename(bad).is_err(), "{bad:?} was accepted");
        }
        for good in ["chat.kv", "slot-0_v1.bin", "session"] {
            assert!(check_filename(good).is_ok(), "{good:?} was refused");
        }
        assert!(check_filename(&"a".repeat(256)).is_err());
    }
}
