//! The router: authentication and logging middleware, and the small endpoints.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{json, Value};

use crate::body::{body, read_body, Body};
use crate::error::ApiError;
use crate::openai::{self, Kind};
use crate::params::{self, opt_bool, opt_str};
use crate::security;
use crate::worker::Summary;
use crate::{AppState, RequestLog, StreamLogged};

type St = State<Arc<AppState>>;

/// Every route, behind the body limit, the API key check and the request log.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.body_limit;
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/slots", get(slots))
        .route("/slots/{id}", post(crate::slots::slot_action))
        .route("/metrics", get(metrics))
        .merge(crate::llama_api::routes())
        .merge(crate::ollama::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), gate))
        .with_state(state)
}

fn authorized(st: &AppState, req: &Request) -> bool {
    let Some(key) = &st.api_key else {
        return true;
    };
    let h = req.headers();
    let bearer = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let x_key = h.get("x-api-key").and_then(|v| v.to_str().ok());
    bearer.or(x_key).is_some_and(|k| k.trim() == key)
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
];

/// Checks the Host, the Origin and the key, reads the body within the body timeout,
/// runs the handler, adds the CORS headers, counts and logs the request.
async fn gate(State(st): St, req: Request, next: Next) -> Response {
    let mut log = RequestLog::new(req.method().as_str(), req.uri().path());
    let mut origin = None;
    let mut resp = match admit(&st, req, &mut origin).await {
        Ok(Ok(mut req)) => {
            req.extensions_mut().insert(log.clone());
            next.run(req).await
        }
        Ok(Err(preflight)) => preflight,
        Err(e) => e.into_response(),
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
    if req.uri().path() != "/health" && !authorized(st, &req) {
        return Err(ApiError::invalid_api_key());
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

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {} {}", req.method(), req.uri().path()),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

async fn health() -> Json<Value> {
    // The backends the engine runs on and the adapter of the first with a device.
    let backends = minfer_runtime::backends::in_use();
    let adapter = backends.iter().find_map(|b| b.device.clone());
    Json(json!({"status": "ok", "backends": backends, "adapter": adapter}))
}

/// Every served model; the loaded ones with their `meta`.
async fn models(State(st): St) -> Json<Value> {
    let data: Vec<Value> = st
        .models
        .ids()
        .into_iter()
        .map(|id| {
            let mut v = json!({
                "id": id, "object": "model", "created": st.created, "owned_by": "minfer",
            });
            if let Some(m) = st.models.loaded(id) {
                v["meta"] = json!({
                    "n_vocab": m.tok.n_vocab(), "slot_ctx": m.slot_ctx, "slots": m.n_slots,
                });
            }
            v
        })
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

/// A JSON answer built off the async threads.
fn json_response(bytes: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}

fn to_json(v: &Value) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(v).map_err(|e| ApiError::internal(format!("encoding the answer: {e}")))
}

async fn chat(
    State(st): St,
    Extension(log): Extension<RequestLog>,
    b: Body,
) -> Result<Response, ApiError> {
    let bytes = body(b, st.body_limit)?;
    let s = Arc::clone(&st);
    // Rendering and tokenising a large conversation is CPU work: off the async threads.
    let (m, prompt, g, inject) = st
        .blocking
        .run(move || -> Result<_, ApiError> {
            let obj = params::parse_object(&bytes)?;
            let (msgs, g) = params::parse_chat(&obj)?;
            let m = s.model(g.model.as_deref())?;
            let tools = g.tools.as_ref().filter(|t| t.enabled()).map(|t| &t.defs);
            let (prompt, inject) = openai::chat_prompt_with_tools(&s, &m, &msgs, tools)?;
            Ok((m, prompt, g, inject))
        })
        .await??;
    openai::generate(Arc::clone(&st), Kind::Chat, m, prompt, g, inject, log).await
}

async fn completions(
    State(st): St,
    Extension(log): Extension<RequestLog>,
    b: Body,
) -> Result<Response, ApiError> {
    let bytes = body(b, st.body_limit)?;
    let s = Arc::clone(&st);
    let (m, prompt, g, inject) = st
        .blocking
        .run(move || -> Result<_, ApiError> {
            let obj = params::parse_object(&bytes)?;
            let (p, g) = params::parse_completion(&obj)?;
            let m = s.model(g.model.as_deref())?;
            let (prompt, inject) = openai::completion_prompt(&s, &m, p)?;
            Ok((m, prompt, g, inject))
        })
        .await??;
    openai::generate(Arc::clone(&st), Kind::Text, m, prompt, g, inject, log).await
}

async fn tokenize(State(st): St, b: Body) -> Result<Response, ApiError> {
    let bytes = body(b, st.body_limit)?;
    let s = Arc::clone(&st);
    let out = st
        .blocking
        .run(move || -> Result<_, ApiError> {
            let obj = params::parse_object(&bytes)?;
            params::check_fields(&obj, params::TOKENIZE_FIELDS)?;
            let content = opt_str(&obj, "content")?
                .ok_or_else(|| ApiError::bad_request("field `content` is required"))?;
            let add_special = opt_bool(&obj, "add_special")?.unwrap_or(false);
            let parse_special = opt_bool(&obj, "parse_special")?.unwrap_or(true);
            let with_pieces = opt_bool(&obj, "with_pieces")?.unwrap_or(false);
            let m = s.model(opt_str(&obj, "model")?)?;
            let ids = m.tok.encode(content, add_special, parse_special);
            let tokens: Vec<Value> = if with_pieces {
                ids.iter()
                    .map(|&id| {
                        let bytes = m.tok.token_bytes(id, true).unwrap_or_default();
                        let piece = match std::str::from_utf8(bytes) {
                            Ok(s) => json!(s),
                            Err(_) => json!(bytes),
                        };
                        json!({"id": id, "piece": piece})
                    })
                    .collect()
            } else {
                ids.iter().map(|&id| json!(id)).collect()
            };
            to_json(&json!({ "tokens": tokens }))
        })
        .await??;
    Ok(json_response(out))
}

async fn detokenize(State(st): St, b: Body) -> Result<Response, ApiError> {
    let bytes = body(b, st.body_limit)?;
    let s = Arc::clone(&st);
    let out = st
        .blocking
        .run(move || -> Result<_, ApiError> {
            let obj = params::parse_object(&bytes)?;
            params::check_fields(&obj, params::DETOKENIZE_FIELDS)?;
            let ids = match obj.get("tokens") {
                None | Some(Value::Null) => {
                    return Err(ApiError::bad_request("field `tokens` is required"))
                }
                Some(v) => params::token_list(v, "tokens")?,
            };
            let m = s.model(opt_str(&obj, "model")?)?;
            let content = m
                .tok
                .decode(&ids, false)
                .map_err(|e| ApiError::bad_request(format!("field `tokens`: {e}")))?;
            to_json(&json!({ "content": content }))
        })
        .await??;
    Ok(json_response(out))
}

/// The default model's slots (`?model=NAME` for another's); llama-server's 501 with
/// `--no-slots`.
async fn slots(
    State(st): St,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<Response, ApiError> {
    if let Some(refusal) = crate::llama_api::slots_refusal(&st) {
        return Ok(refusal);
    }
    let s = Arc::clone(&st);
    let m = st
        .blocking
        .run(move || s.model(q.get("model").map(String::as_str)))
        .await??;
    let info = m
        .worker
        .slots
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    Ok(Json(json!(info)).into_response())
}

async fn metrics(State(st): St) -> Response {
    if let Some(refusal) = crate::llama_api::metrics_refusal(&st) {
        return refusal;
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}
