//! The router: authentication and logging middleware, and the small endpoints.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::openai::{self, Kind};
use crate::params::{self, opt_bool, opt_str};
use crate::worker::Summary;
use crate::{AppState, RequestLog, StreamLogged};

type St = State<Arc<AppState>>;
type Body = Result<Bytes, BytesRejection>;

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
        .route("/metrics", get(metrics))
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

/// Checks the key, runs the handler, counts and logs the request.
async fn gate(State(st): St, mut req: Request, next: Next) -> Response {
    let mut log = RequestLog::new(req.method().as_str(), req.uri().path());
    let resp = if req.uri().path() != "/health" && !authorized(&st, &req) {
        ApiError::new(StatusCode::UNAUTHORIZED, "missing or invalid API key").into_response()
    } else {
        req.extensions_mut().insert(log.clone());
        next.run(req).await
    };
    st.worker.metrics.request(resp.status().as_u16());
    if resp.extensions().get::<StreamLogged>().is_none() {
        log.status = resp.status().as_u16();
        log.summary = resp.extensions().get::<Summary>().copied();
        log.emit("");
    }
    resp
}

/// The body bytes, or 413 past the limit.
fn body(b: Body, limit: usize) -> Result<Bytes, ApiError> {
    b.map_err(|rej| {
        if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body exceeds the limit of {limit} bytes"),
            )
        } else {
            ApiError::new(rej.status(), rej.body_text())
        }
    })
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
    Json(json!({"status": "ok"}))
}

async fn models(State(st): St) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_id, "object": "model", "created": st.created, "owned_by": "minfer",
            "meta": {"n_vocab": st.tok.n_vocab(), "slot_ctx": st.slot_ctx, "slots": st.n_slots},
        }],
    }))
}

async fn chat(
    State(st): St,
    Extension(log): Extension<RequestLog>,
    b: Body,
) -> Result<Response, ApiError> {
    let obj = params::parse_object(&body(b, st.body_limit)?)?;
    let (msgs, g) = params::parse_chat(&obj)?;
    let (prompt, inject) = openai::chat_prompt(&st, &msgs)?;
    openai::generate(Arc::clone(&st), Kind::Chat, prompt, g, inject, log).await
}

async fn completions(
    State(st): St,
    Extension(log): Extension<RequestLog>,
    b: Body,
) -> Result<Response, ApiError> {
    let obj = params::parse_object(&body(b, st.body_limit)?)?;
    let (p, g) = params::parse_completion(&obj)?;
    let (prompt, inject) = openai::completion_prompt(&st, p)?;
    openai::generate(Arc::clone(&st), Kind::Text, prompt, g, inject, log).await
}

async fn tokenize(State(st): St, b: Body) -> Result<Json<Value>, ApiError> {
    let obj = params::parse_object(&body(b, st.body_limit)?)?;
    params::check_fields(&obj, params::TOKENIZE_FIELDS)?;
    let content = opt_str(&obj, "content")?
        .ok_or_else(|| ApiError::bad_request("field `content` is required"))?;
    let add_special = opt_bool(&obj, "add_special")?.unwrap_or(false);
    let parse_special = opt_bool(&obj, "parse_special")?.unwrap_or(true);
    let with_pieces = opt_bool(&obj, "with_pieces")?.unwrap_or(false);
    let ids = st.tok.encode(content, add_special, parse_special);
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| {
                let bytes = st.tok.token_bytes(id, true).unwrap_or_default();
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
    Ok(Json(json!({ "tokens": tokens })))
}

async fn detokenize(State(st): St, b: Body) -> Result<Json<Value>, ApiError> {
    let obj = params::parse_object(&body(b, st.body_limit)?)?;
    params::check_fields(&obj, params::DETOKENIZE_FIELDS)?;
    let ids = match obj.get("tokens") {
        None | Some(Value::Null) => {
            return Err(ApiError::bad_request("field `tokens` is required"))
        }
        Some(v) => params::token_list(v, "tokens")?,
    };
    let content = st
        .tok
        .decode(&ids, false)
        .map_err(|e| ApiError::bad_request(format!("field `tokens`: {e}")))?;
    Ok(Json(json!({ "content": content })))
}

async fn slots(State(st): St) -> Json<Value> {
    let info = st
        .worker
        .slots
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    Json(json!(info))
}

async fn metrics(State(st): St) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.worker.metrics.render(),
    )
        .into_response()
}
