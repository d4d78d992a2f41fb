//! llama-server's native routes: `/completion`, `/infill`, `/props`, `/apply-template`,
//! `/tokenize`, `/detokenize`, `/slots` and `/lora-adapters`.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{json, Map, Value};

use super::request::{infill_prompt, parse_options, prompt_list, Options};
use super::response::{json_response, run, run_batch, settings_json, to_json, LlamaError};
use super::switches::not_supported;
use crate::api::fields::{field, opt_bool, opt_str, token_list, Object};
use crate::api::openai;
use crate::api::prepare::prepare;
use crate::body::Body;
use crate::error::ApiError;
use crate::generate;
use crate::sampling_defaults::LLAMA_NAMES;
use crate::{AppState, Model, RequestLog};

/// The model a native request's `model` field selects (the default without one).
/// Every native handler reaches its model through this one function, which may load
/// the model: call it off the async threads.
pub(super) fn served(st: &AppState, obj: &Object) -> Result<Arc<Model>, ApiError> {
    st.model(opt_str(obj, "model")?)
}

pub(super) type St = State<Arc<AppState>>;

/// llama-server's native routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/completion", post(completion))
        // llama-server's native route under its other name (its OpenAI one is
        // `/v1/completions` only).
        .route("/completions", post(completion))
        .route("/infill", post(infill))
        .route("/props", get(props).post(change_props))
        .route("/apply-template", post(apply_template))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/slots", get(slots))
        .route("/lora-adapters", get(lora_adapters))
}

/// The default model's slots (`?model=NAME` for another's); llama-server's 501 with
/// `--no-slots`, and with `?fail_on_no_slot=...` (any value) its 503 "no slot
/// available" when every slot is busy, so a load balancer can pick another server.
pub(super) async fn slots(
    State(st): St,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<Response, LlamaError> {
    if let Some(refusal) = super::slots_refusal(&st) {
        return Ok(refusal);
    }
    let fail_on_no_slot = q.get("fail_on_no_slot").is_some_and(|v| !v.is_empty());
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
    if fail_on_no_slot && info.iter().all(|s| s.is_processing) {
        // llama-server's `unavailable_error`, without a retry hint: it names no time.
        return Err(ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "no slot available",
        )
        .into());
    }
    Ok(Json(json!(info)).into_response())
}

/// The LoRA adapters loaded: none (minfer serves no adapters), as llama-server lists them.
pub(super) async fn lora_adapters() -> Json<Value> {
    Json(json!([]))
}

/// `POST /props`: llama-server changes global properties only when started with
/// `--props`, which minfer has not; its 501 says so.
pub(super) async fn change_props() -> Response {
    not_supported(
        "This server does not support changing global properties. Start it with `--props`",
    )
}

pub(super) async fn completion(
    State(st): St,
    Extension(log): Extension<RequestLog>,
    b: Body,
) -> Result<Response, LlamaError> {
    let (m, mut prompts, opts, fault) = prepare(&st, b, move |s, obj| {
        let p = field(&obj, "prompt")
            .ok_or_else(|| ApiError::bad_request("field `prompt` is required"))?;
        let m = served(s, &obj)?;
        let prompts = prompt_list(p, "prompt", &m.tok)?;
        let fault = p.as_str().and_then(|t| generate::fault_of(s, t));
        let mut opts = parse_options(&obj, &m.tok)?;
        s.sampling_defaults()
            .apply_to(&mut opts.g.sampling, &obj, LLAMA_NAMES);
        Ok((m, prompts, opts, fault))
    })
    .await?;
    if prompts.len() > 1 {
        return Ok(run_batch(st, m, prompts, opts, log).await?);
    }
    let prompt = prompts.pop().unwrap_or_default();
    Ok(run(st, m, prompt, opts, fault, log).await?)
}

pub(super) async fn infill(
    State(st): St,
    Extension(log): Extension<RequestLog>,
    b: Body,
) -> Result<Response, LlamaError> {
    let (m, prompt, opts) = prepare(&st, b, move |s, obj| {
        let m = served(s, &obj)?;
        let mut opts = parse_options(&obj, &m.tok)?;
        s.sampling_defaults()
            .apply_to(&mut opts.g.sampling, &obj, LLAMA_NAMES);
        let prompt = infill_prompt(&m, &obj, m.answer_limit(opts.g.max_tokens))?;
        Ok((m, prompt, opts))
    })
    .await?;
    Ok(run(st, m, prompt, opts, None, log).await?)
}

/// The default model's properties (`?model=NAME` for another's).
pub(super) async fn props(
    State(st): St,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<Json<Value>, LlamaError> {
    let s = Arc::clone(&st);
    let m = st
        .blocking
        .run(move || s.model(q.get("model").map(String::as_str)))
        .await??;
    let mut defaults = Options::defaults();
    st.sampling_defaults()
        .apply(&mut defaults.g.sampling, |_| false);
    // The backends the engine runs on and the adapter in use, as `/health` reports them.
    let backends = minfer_runtime::backends::in_use();
    let adapter = backends.iter().find_map(|b| b.device.clone());
    let mut params = settings_json(&m, &defaults);
    // Without `--seed` the default seed is drawn per request: llama-server reports it as
    // -1 (u32::MAX).
    if st.sampling_defaults().seed.is_none() {
        params["seed"] = json!(u32::MAX);
    }
    if let Some(p) = params.as_object_mut() {
        p.remove("n_ctx");
        p.remove("model");
    }
    Ok(Json(json!({
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": m.slot_ctx,
            "speculative": false,
            "is_processing": false,
            "params": params,
            "prompt": "",
        },
        "total_slots": m.n_slots,
        "model_path": m.path.display().to_string(),
        "model_alias": m.id,
        "n_ctx": m.slot_ctx,
        "chat_template": m.template.source(),
        "chat_template_caps": {},
        "modalities": {"vision": false, "audio": false},
        "infill": m.fim.is_ok(),
        "build_info": format!("minfer {}", env!("CARGO_PKG_VERSION")),
        "is_sleeping": false,
        "backends": backends,
        "adapter": adapter,
    })))
}

pub(super) async fn apply_template(State(st): St, b: Body) -> Result<Response, LlamaError> {
    let out = prepare(&st, b, move |s, obj| {
        let m = served(s, &obj)?;
        // The prompt a chat request of this body would run: its messages, tools,
        // template variables and continuation; its sampling fields do not matter here.
        let mut chat = Map::new();
        for k in [
            "messages",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "chat_template_kwargs",
            "enable_thinking",
            "continue_final_message",
            "add_generation_prompt",
        ] {
            if let Some(v) = obj.get(k) {
                chat.insert(k.into(), v.clone());
            }
        }
        let (msgs, g) = openai::parse_chat(&chat)?;
        let kwargs = crate::api::thinking::template_kwargs(&chat)?;
        let tools = g.tools.as_ref().filter(|t| t.enabled()).map(|t| &t.defs);
        let how = openai::continuation(&chat)?;
        let rendered = generate::render_text(&m, &msgs, tools, &kwargs, how)?;
        Ok(json!({ "prompt": rendered.text }))
    })
    .await?;
    Ok(Json(out).into_response())
}

/// `POST /tokenize`: `content`'s token ids (with their pieces under `with_pieces`).
/// As llama-server does, unknown fields are ignored and a body without `content` has
/// no tokens.
pub(super) async fn tokenize(State(st): St, b: Body) -> Result<Response, LlamaError> {
    let out = prepare(&st, b, move |s, obj| {
        let content = opt_str(&obj, "content")?.unwrap_or_default();
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
    .await?;
    Ok(json_response(out))
}

/// `POST /detokenize`: the text of `tokens`, special tokens rendered as their text
/// (llama-server's pieces with `special = true`). Unknown fields are ignored and a body
/// without `tokens` is the empty text, as in llama-server.
pub(super) async fn detokenize(State(st): St, b: Body) -> Result<Response, LlamaError> {
    let out = prepare(&st, b, move |s, obj| {
        let ids = match obj.get("tokens") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => token_list(v, "tokens")?,
        };
        let m = s.model(opt_str(&obj, "model")?)?;
        let content = m
            .tok
            .decode(&ids, true)
            .map_err(|e| ApiError::bad_request(format!("field `tokens`: {e}")))?;
        to_json(&json!({ "content": content }))
    })
    .await?;
    Ok(json_response(out))
}
