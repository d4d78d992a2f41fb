//! OpenAI's routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models` (and one
//! model, `/v1/models/{id}`) and
//! llama-server's `/v1/chat/completions/input_tokens` (each also without the `/v1`
//! prefix).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{json, Value};

use super::request::{continuation, parse_chat, parse_completion};
use super::response::{generate, Kind};
use crate::api::fields::Object;
use crate::api::prepare::prepare;
use crate::body::Body;
use crate::error::ApiError;
use crate::generate::{completion_prompt, render_chat_with, ChatPrompt};
use crate::params::GenRequest;
use crate::{AppState, Model, RequestLog};

type St = State<Arc<AppState>>;

/// OpenAI's routes, for the server's router to merge.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/models/{*id}", get(model))
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/chat/completions/input_tokens", post(input_tokens))
        .route("/chat/completions/input_tokens", post(input_tokens))
        .route("/v1/completions", post(completions))
}

/// Every served model; the loaded ones with their `meta`.
async fn models(State(st): St) -> Json<Value> {
    let data: Vec<Value> = st
        .models
        .ids()
        .into_iter()
        .map(|id| model_object(&st, id))
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

/// `GET /v1/models/{id}` (OpenAI's retrieve, which clients call to check that a model
/// exists): the model object of a served model, named as a request's `model` may name
/// it exactly (id, file stem, catalog name); another name is a 404 `model_not_found`.
async fn model(
    State(st): St,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    match st.models.find(&name) {
        Some(id) => Ok(Json(model_object(&st, id))),
        None => Err(ApiError::model_not_found(
            &name,
            &st.models.ids().join(", "),
        )),
    }
}

/// One served model in OpenAI's shape, with `meta` when it is loaded.
fn model_object(st: &AppState, id: &str) -> Value {
    let mut v = json!({
        "id": id, "object": "model", "created": st.created, "owned_by": "minfer",
    });
    if let Some(m) = st.models.loaded(id) {
        v["meta"] = json!({
            "n_vocab": m.tok.n_vocab(), "slot_ctx": m.slot_ctx, "slots": m.n_slots,
        });
    }
    v
}

/// A chat request read and its prompt rendered: the model it names, the prompt, and its
/// generation settings.
fn render(s: &AppState, obj: &Object) -> Result<(Arc<Model>, ChatPrompt, GenRequest), ApiError> {
    let (msgs, mut g) = parse_chat(obj).map_err(ApiError::naming_field)?;
    s.sampling_defaults()
        .apply_to(&mut g.sampling, obj, crate::sampling_defaults::LLAMA_NAMES);
    if obj.get("reasoning_format").is_none_or(Value::is_null) {
        g.reasoning.split = s.reasoning_split();
    }
    let kwargs = crate::api::thinking::template_kwargs(obj)?;
    let how = continuation(obj)?;
    let m = s.model(g.model.as_deref())?;
    let tools = g.tools.as_ref().filter(|t| t.enabled()).map(|t| &t.defs);
    let p = render_chat_with(s, &m, &msgs, tools, &kwargs, how)?;
    Ok((m, p, g))
}

async fn chat(
    State(st): St,
    Extension(log): Extension<RequestLog>,
    b: Body,
) -> Result<Response, ApiError> {
    // Rendering and tokenising a large conversation is CPU work: off the async threads.
    let (m, prompt, g, inject) = prepare(&st, b, move |s, obj| {
        let (m, p, mut g) = render(s, &obj)?;
        p.shape(&mut g);
        Ok((m, p.ids, g, p.fault))
    })
    .await?;
    generate(Arc::clone(&st), Kind::Chat, m, vec![prompt], g, inject, log).await
}

/// `POST /v1/chat/completions/input_tokens` (llama-server's): the prompt tokens a chat
/// request would run, its messages and tools rendered by the template.
async fn input_tokens(State(st): St, b: Body) -> Result<Response, ApiError> {
    let n = prepare(&st, b, move |s, obj| Ok(render(s, &obj)?.1.ids.len())).await?;
    Ok(Json(json!({"object": "response.input_tokens", "input_tokens": n})).into_response())
}

async fn completions(
    State(st): St,
    Extension(log): Extension<RequestLog>,
    b: Body,
) -> Result<Response, ApiError> {
    let (m, prompts, g, inject) = prepare(&st, b, move |s, obj| {
        let (ps, mut g) = parse_completion(&obj).map_err(ApiError::naming_field)?;
        s.sampling_defaults().apply_to(
            &mut g.sampling,
            &obj,
            crate::sampling_defaults::LLAMA_NAMES,
        );
        let m = s.model(g.model.as_deref())?;
        let mut prompts = Vec::with_capacity(ps.len());
        let mut inject = None;
        for p in ps {
            let (prompt, fault) = completion_prompt(s, &m, p)?;
            prompts.push(prompt);
            inject = inject.or(fault);
        }
        Ok((m, prompts, g, inject))
    })
    .await?;
    generate(Arc::clone(&st), Kind::Text, m, prompts, g, inject, log).await
}
