//! The Responses routes: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`,
//! `GET /v1/responses/{id}/input_items`, `POST /v1/responses/{id}/cancel` and `POST
//! /v1/responses/input_tokens` (each also without the `/v1` prefix).

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::Sse as SseBody;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures_util::stream::{self, StreamExt};
use minfer_tokenizer::ChatMessage;
use serde_json::json;

use super::items::{input_items, page};
use super::output::Builder;
use super::request::{check_results, parse, Parsed};
use super::response::{base, entry, finished, Kept};
use super::store::{CAPACITY, TTL};
use super::stream::Stream;
use crate::answer::AnswerSplitter;
use crate::api::fields::Object;
use crate::api::prepare::prepare;
use crate::body::Body;
use crate::error::ApiError;
use crate::generate::{self, render_chat, ChatPrompt};
use crate::job::Event;
use crate::{AppState, Model, RequestLog, StreamLogged};

type St = State<Arc<AppState>>;

/// The Responses routes, for the server's router to merge.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/responses", post(create))
        .route("/responses", post(create))
        .route("/v1/responses/{id}", get(retrieve).delete(delete))
        .route("/responses/{id}", get(retrieve).delete(delete))
        .route("/v1/responses/{id}/input_items", get(list_input_items))
        .route("/responses/{id}/input_items", get(list_input_items))
        .route("/v1/responses/{id}/cancel", post(cancel))
        .route("/responses/{id}/cancel", post(cancel))
        .route("/v1/responses/input_tokens", post(input_tokens))
        .route("/responses/input_tokens", post(input_tokens))
}

/// A request's conversation, rendered.
struct Rendered {
    /// The history it continues and adds to (`previous_response_id`'s, then the new
    /// input).
    history: Vec<ChatMessage>,
    /// The model it names, or the one its previous response used.
    model: Arc<Model>,
    /// The prompt: `instructions` first, then the history, through the template.
    prompt: ChatPrompt,
}

/// Renders the conversation of request `p` (body `obj`).
fn render(s: &AppState, obj: &Object, p: &Parsed) -> Result<Rendered, ApiError> {
    let mut history: Vec<ChatMessage> = Vec::new();
    let mut model = p.g.model.clone();
    if let Some(prev) = &p.previous {
        let e = s
            .responses
            .get(prev)
            .ok_or_else(|| forgotten(prev, "previous_response_id"))?;
        history = e.history;
        model = model.or(Some(e.model));
    }
    history.extend(p.input.iter().cloned());
    check_results(&history)?;
    let mut msgs = Vec::with_capacity(history.len() + 1);
    if let Some(i) = &p.instructions {
        msgs.push(ChatMessage::new("system", i.clone()));
    }
    msgs.extend(history.iter().cloned());
    let m = s.model(model.as_deref())?;
    let kwargs = crate::api::thinking::template_kwargs(obj).map_err(ApiError::naming_field)?;
    let tools = p.g.tools.as_ref().filter(|t| t.enabled()).map(|t| &t.defs);
    let prompt = render_chat(s, &m, &msgs, tools, &kwargs)?;
    Ok(Rendered {
        history,
        model: m,
        prompt,
    })
}

/// `POST /v1/responses/input_tokens`: the prompt tokens the request would run, as
/// OpenAI's endpoint and llama-server count them.
async fn input_tokens(State(st): St, b: Body) -> Result<Response, ApiError> {
    let n = prepare(&st, b, move |s, obj| {
        let p = parse(&obj)?;
        Ok(render(s, &obj, &p)?.prompt.ids.len())
    })
    .await?;
    Ok(Json(json!({"object": "response.input_tokens", "input_tokens": n})).into_response())
}

fn forgotten(id: &str, field: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "Response with id `{id}` not found: this server keeps responses in memory, at \
             most {CAPACITY} of them for {} minutes each, only those created with `store` \
             true, and none once deleted",
            TTL.as_secs() / 60
        ),
    )
    .with_param(field)
}

/// `GET /v1/responses/{id}`: the kept response, as answered. `stream=true` is a 400:
/// OpenAI streams again only a response created with `background: true`, which this
/// server has not (an answer in JSON would leave an event reader waiting for events).
async fn retrieve(
    State(st): St,
    Path(id): Path<String>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Response, ApiError> {
    let e = st
        .responses
        .get(&id)
        .ok_or_else(|| forgotten(&id, "response_id"))?;
    if q.iter().any(|(k, v)| k == "stream" && v != "false") {
        return Err(ApiError::bad_request(format!(
            "Response `{id}` cannot be streamed again: only a response created with \
             `background: true` can be, and this server has no background mode; retrieve it \
             without `stream`"
        ))
        .with_param("stream"));
    }
    Ok(Json(e.response).into_response())
}

/// `DELETE /v1/responses/{id}`: forgets the response (OpenAI's `response.deleted`
/// object); an id not kept, or already deleted, is a 404.
async fn delete(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    if !st.responses.remove(&id) {
        return Err(forgotten(&id, "response_id"));
    }
    Ok(Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response())
}

/// `GET /v1/responses/{id}/input_items`: the request's input items, one page of them
/// (see [`page`]).
async fn list_input_items(
    State(st): St,
    Path(id): Path<String>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<Response, ApiError> {
    let e = st
        .responses
        .get(&id)
        .ok_or_else(|| forgotten(&id, "response_id"))?;
    Ok(Json(page(&e.input_items, &q)?).into_response())
}

/// `POST /v1/responses/{id}/cancel`: OpenAI cancels only responses created with
/// `background: true`, which this server refuses, so a kept response is a 400 saying so
/// (it has ended anyway) and any other id a 404.
async fn cancel(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    if st.responses.get(&id).is_none() {
        return Err(forgotten(&id, "response_id"));
    }
    Err(ApiError::bad_request(format!(
        "Response `{id}` cannot be cancelled: only a response created with `background: \
         true` can be, and this server has no background mode (every response has ended \
         by the time its id is known)"
    ))
    .with_param("response_id"))
}

async fn create(
    State(st): St,
    Extension(mut log): Extension<RequestLog>,
    b: Body,
) -> Result<Response, ApiError> {
    let serial = st.next_serial();
    let id = format!("resp_{serial}");
    let created = crate::openai::now_secs();
    let rid = id.clone();
    let rserial = serial.clone();
    let (m, prompt, g, fault, history, head) = prepare(&st, b, move |s, obj| {
        let mut p = parse(&obj)?;
        s.sampling_defaults().apply_to(
            &mut p.g.sampling,
            &obj,
            crate::sampling_defaults::RESPONSES_NAMES,
        );
        let Rendered {
            history,
            model: m,
            prompt: cp,
        } = render(s, &obj, &p)?;
        let head = base(&rid, created, &m.id, &p, &obj);
        let mut g = p.g;
        cp.shape(&mut g);
        let history = p.store.then(|| Kept {
            history,
            input_items: input_items(obj.get("input").unwrap_or(&json!(null)), &rserial),
        });
        Ok((m, cp.ids, g, cp.fault, history, head))
    })
    .await?;
    let model = m.id.clone();
    let tools = g.shown_tools();
    let splitter = AnswerSplitter::new(g.reasoning, tools);
    let mut gen = generate::start(&st, m, prompt, &g, fault, log.start)
        .await
        .map_err(|e| e.naming_prompt("input"))?;
    let unenforced = std::mem::take(&mut gen.unenforced);
    if !g.stream {
        let (text, _, sum) = gen.collect_one().await?;
        let builder = Builder::whole(&serial, &text, g.reasoning, tools);
        let r = finished(&head, &builder, &sum);
        if let Some(h) = history {
            st.responses.put(id, entry(r.clone(), h, &builder, &model));
        }
        let mut resp = Json(r).into_response();
        resp.extensions_mut().insert(sum);
        return Ok(generate::mark_unenforced(resp, &unenforced));
    }
    let first = gen.next().await;
    if let Event::Error(e) = first {
        return Err(e);
    }
    log.status = 200;
    log.emit_on_drop = true;
    let mut state = Stream {
        st: Arc::clone(&st),
        gen,
        first: Some(first),
        base: head,
        builder: Builder::new(&serial),
        splitter,
        history,
        model,
        log,
        seq: 0,
        done: false,
    };
    let head = state.head();
    let events = stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let ev = match s.first.take() {
            Some(ev) => ev,
            None => s.gen.next().await,
        };
        let out = s.frames(ev);
        Some((stream::iter(out), s))
    })
    .flatten();
    let body = stream::iter(head).chain(events);
    let mut resp = SseBody::new(body.map(Ok::<_, Infallible>)).into_response();
    resp.extensions_mut().insert(StreamLogged);
    Ok(generate::mark_unenforced(resp, &unenforced))
}
