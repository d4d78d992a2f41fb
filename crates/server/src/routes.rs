//! The router: authentication and logging middleware, and the small endpoints.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::body::read_body;
use crate::error::ApiError;
use crate::security;
use crate::worker::Summary;
use crate::{AppState, RequestLog, StreamLogged};

type St = State<Arc<AppState>>;

/// Every route, behind the body limit, the API key check and the request log.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.body_limit;
    Router::new()
        .route("/health", get(health))
        // llama-server's other name for its health check, public as `/health` is.
        .route("/v1/health", get(health))
        .route("/version", get(version))
        .route("/slots/{id}", post(crate::slots::slot_action))
        .route("/metrics", get(metrics))
        .merge(crate::api::openai::routes())
        .merge(crate::api::llama::routes())
        .merge(crate::api::ollama::routes())
        .merge(crate::api::anthropic::routes())
        .merge(crate::api::responses::routes())
        .merge(crate::api::embed::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(crate::api::llama::llama_errors))
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), gate))
        .with_state(state)
}

/// Whether the request presents the server's key (always, without one): as
/// `Authorization: Bearer KEY` (the scheme in any case), as a bare `Authorization: KEY`
/// (llama-server's clients send that too), or as `x-api-key: KEY` (Anthropic's).
fn authorized(st: &AppState, req: &Request) -> bool {
    let Some(key) = &st.api_key else {
        return true;
    };
    let h = req.headers();
    let auth = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|v| match v.split_at_checked(7) {
            Some((scheme, k)) if scheme.eq_ignore_ascii_case("bearer ") => k,
            _ => v,
        });
    let x_key = h.get("x-api-key").and_then(|v| v.to_str().ok());
    [auth, x_key]
        .into_iter()
        .flatten()
        .any(|k| same_key(k.trim().as_bytes(), key.as_bytes()))
}

/// Compares a presented key with the server's in time that depends only on their
/// lengths, so the time a refusal takes does not tell how much of a guess was right.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Routes whose POST body is JSON.
const JSON_ROUTES: &[&str] = &[
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completions",
    "/tokenize",
    "/detokenize",
    "/completion",
    "/infill",
    "/apply-template",
    "/api/chat",
    "/api/generate",
    "/api/show",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/responses",
    "/v1/embeddings",
    "/embedding",
    "/embeddings",
    "/api/embed",
    "/api/embeddings",
    "/v1/rerank",
    "/rerank",
    "/v1/reranking",
    "/reranking",
];

/// Checks the Host, the Origin and the key, reads the body within the body timeout,
/// runs the handler, adds the CORS headers, counts and logs the request.
async fn gate(State(st): St, req: Request, next: Next) -> Response {
    let mut log = RequestLog::new(req.method().as_str(), req.uri().path());
    let path = req.uri().path().to_string();
    let mut origin = None;
    let mut resp = match admit(&st, req, &mut origin).await {
        Ok(Ok(mut req)) => {
            req.extensions_mut().insert(log.clone());
            next.run(req).await
        }
        Ok(Err(preflight)) => preflight,
        // Refusals before the handler speak the route's API too.
        Err(e) => shaped(&path, e),
    };
    security::decorate(&mut resp, origin);
    st.metrics.request(resp.status().as_u16());
    if resp.extensions().get::<StreamLogged>().is_none() {
        log.status = resp.status().as_u16();
        log.summary = resp.extensions().get::<Summary>().copied();
        log.emit("");
    }
    resp
}

/// The request to run (its body read), or the answer to a preflight, or why not.
/// `origin` is set to the allowed cross-origin caller, if any, so that even refusals
/// carry the CORS headers its page needs to read them.
async fn admit(
    st: &AppState,
    req: Request,
    origin: &mut Option<HeaderValue>,
) -> Result<Result<Request, Response>, ApiError> {
    // Browsers send preflights without credentials: no key is asked for them.
    if let Some(preflight) = st.policy.admit(req.method(), req.headers(), origin)? {
        return Ok(Err(preflight));
    }
    if !matches!(req.uri().path(), "/health" | "/v1/health") && !authorized(st, &req) {
        return Err(ApiError::invalid_api_key());
    }
    if !st.ready.load(std::sync::atomic::Ordering::Acquire)
        && !UNGATED_WHILE_LOADING.contains(&req.uri().path())
    {
        return Err(ApiError::loading());
    }
    if req.method() != Method::POST || !JSON_ROUTES.contains(&req.uri().path()) {
        return Ok(Ok(req));
    }
    security::require_json(req.method(), req.headers())?;
    let (parts, body) = req.into_parts();
    let bytes = read_body(&parts.headers, body, st.body_limit, st.body_timeout).await?;
    Ok(Ok(Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    )))
}

/// `e` in the error shape of the API that `path` belongs to: Anthropic's on its
/// `/v1/messages` routes, ollama's `{"error": "..."}` on `/api/*`, llama-server's
/// `{"error": {"code", "message", "type"}}` on its own paths, else OpenAI's. The
/// router's own refusals (no route, a wrong method, a body that is not JSON or too
/// large, a missing key) go through it, so a client can read them as its API's errors.
fn shaped(path: &str, e: ApiError) -> Response {
    if crate::api::anthropic::is_anthropic_path(path) {
        crate::api::anthropic::AnthropicError(e).into_response()
    } else if path.starts_with("/api/") {
        crate::api::ollama::OllamaError(e).into_response()
    } else if crate::api::llama::is_llama_path(path) {
        crate::api::llama::LlamaError(e).into_response()
    } else {
        e.into_response()
    }
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path();
    let msg = format!("no route for {} {path}", req.method());
    shaped(path, ApiError::new(StatusCode::NOT_FOUND, msg))
}

async fn method_not_allowed(req: Request) -> Response {
    let path = req.uri().path();
    let msg = format!("{} is not allowed on {path}", req.method());
    shaped(path, ApiError::new(StatusCode::METHOD_NOT_ALLOWED, msg))
}

async fn health(State(st): St) -> Response {
    if !st.ready.load(std::sync::atomic::Ordering::Acquire) {
        // llama-server's answer while it loads; probes and gateways wait for a 200.
        return ApiError::loading().into_response();
    }
    // The backends the engine runs on and the adapter of the first with a device.
    let backends = minfer_runtime::backends::in_use();
    let adapter = backends.iter().find_map(|b| b.device.clone());
    Json(json!({"status": "ok", "backends": backends, "adapter": adapter})).into_response()
}

/// The server's name and version (vLLM's `/version`, with the name added).
async fn version() -> Json<Value> {
    Json(json!({"name": "minfer", "version": env!("CARGO_PKG_VERSION")}))
}

/// Routes that answer while the default model loads.
const UNGATED_WHILE_LOADING: &[&str] = &["/health", "/version", "/metrics"];

async fn metrics(State(st): St) -> Response {
    if let Some(refusal) = crate::api::llama::metrics_refusal(&st) {
        return refusal;
    }
    (
        [
            (
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4".to_string(),
            ),
            (
                header::HeaderName::from_static("process-start-time-unix"),
                st.metrics.started_unix().to_string(),
            ),
        ],
        st.metrics.render(),
    )
        .into_response()
}
