//! llama-server's error shape on its own paths. Handlers shared with other APIs (the
//! slot routes, rerank, health) answer errors in OpenAI's shape; on llama-server's paths
//! [`llama_errors`] rewrites those bodies into llama-server's
//! `{"error": {"code", "message", "type"}}`, so a llama-server client reads every
//! refusal of its routes the same way, whichever handler answered it.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{json, Value};

use super::response::llama_type;

/// llama-server's own paths (its native API, not its OpenAI-compatible `/v1/*` one),
/// whose errors take its shape.
const LLAMA_PATHS: &[&str] = &[
    "/health",
    "/v1/health",
    "/completion",
    "/completions",
    "/infill",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/props",
    "/slots",
    "/embedding",
    "/embeddings",
    "/rerank",
    "/reranking",
    "/metrics",
    "/lora-adapters",
];

/// Whether `path` is one of llama-server's own routes (`/slots/{id}` included), whose
/// errors are answered in llama-server's shape.
pub fn is_llama_path(path: &str) -> bool {
    LLAMA_PATHS.contains(&path) || path.starts_with("/slots/")
}

/// Largest error body rewritten; errors are a few hundred bytes, anything larger is
/// passed on as it is.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Middleware: on llama-server's paths, an error answered in OpenAI's shape (an `error`
/// object with a `param` key) is rewritten into llama-server's, keeping the status, the
/// message, the headers and the context counts. Successful answers (streams included)
/// pass untouched, so only small JSON error bodies are ever buffered.
pub async fn llama_errors(req: Request, next: Next) -> Response {
    let llama = is_llama_path(req.uri().path());
    let resp = next.run(req).await;
    let status = resp.status();
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !llama || !(status.is_client_error() || status.is_server_error()) || !json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_ERROR_BODY).await else {
        // Past the limit or unreadable: the body is gone, so say what happened.
        parts.headers.remove(header::CONTENT_LENGTH);
        let v = llama_body(status.as_u16(), "the error could not be read", None);
        return Response::from_parts(parts, Body::from(v.to_string()));
    };
    let Some(v) = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| reshaped(status.as_u16(), &v))
    else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(v.to_string()))
}

/// llama-server's error body for `status`, `message` and, for a prompt over the
/// context, its token counts.
fn llama_body(status: u16, message: &str, context: Option<(&Value, &Value)>) -> Value {
    let mut v = json!({"error": {
        "code": status,
        "message": message,
        "type": llama_type(status, context.is_some()),
    }});
    if let Some((prompt, ctx)) = context {
        v["error"]["n_prompt_tokens"] = prompt.clone();
        v["error"]["n_ctx"] = ctx.clone();
    }
    v
}

/// `v` in llama-server's shape when it is an error in OpenAI's (`None` otherwise: it is
/// llama-server's already, or another shape that is left alone).
pub(super) fn reshaped(status: u16, v: &Value) -> Option<Value> {
    let e = v.get("error")?.as_object()?;
    if !e.contains_key("param") {
        return None;
    }
    let message = e.get("message")?.as_str()?;
    let context = e.get("n_prompt_tokens").zip(e.get("n_ctx"));
    Some(llama_body(status, message, context))
}
