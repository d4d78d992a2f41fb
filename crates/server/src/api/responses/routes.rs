//! The Responses routes: `POST /v1/responses`, `GET /v1/responses/{id}` and `POST
//! /v1/responses/input_tokens` (each also without the `/v1` prefix).

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::Sse as SseBody;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures_util::stream::{self, StreamExt};
use minfer_tokenizer::ChatMessage;
use serde_json::json;

use super::output::Builder;
use super::request::{check_results, parse, Parsed};
use super::response::{base, entry, finished};
use super::store::{CAPACITY, TTL};
use super::stream::Stream;
use crate::answer::{self, AnswerSplitter};
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
        .route("/v1/responses/{id}", get(retrieve))
        .route("/responses/{id}", get(retrieve))
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
    let kwargs = crate::api::thinking::template_kwargs(obj)?;
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
             most {CAPACITY} of them for {} minutes each, and only those created with \
             `store` true",
            TTL.as_secs() / 60
        ),
    )
    .with_param(field)
}

async fn retrieve(State(st): St, Path(id): Path<String>) -> Result<Response, ApiError> {
    let e = st
        .responses
        .get(&id)
        .ok_or_else(|| forgotten(&id, "response_id"))?;
    Ok(Json(e.response).into_response())
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
    let (m, prompt, g, fault, history, head) = prepare(&st, b, move |s, obj| {
        let p = parse(&obj)?;
        let Rendered {
            history,
            model: m,
            prompt: cp,
        } = render(s, &obj, &p)?;
        let head = base(&rid, created, &m.id, &p, &obj);
        let mut g = p.g;
        cp.shape(&mut g);
        let history = p.store.then_some(history);
        Ok((m, cp.ids, g, cp.fault, history, head))
    })
    .await?;
    let model = m.id.clone();
    let tools = g.shown_tools();
    let splitter = AnswerSplitter::new(g.reasoning, tools);
    let mut gen = generate::start(&st, m, prompt, &g, fault, log.start).await?;
    let unenforced = std::mem::take(&mut gen.unenforced);
    let mut builder = Builder::new(&serial);
    if !g.stream {
        let (text, _, sum) = gen.collect_one().await?;
        let a = answer::split(&text, g.reasoning, tools);
        let mut outs = Vec::new();
        if !a.reasoning.is_empty() {
            outs.push(answer::Out::Reasoning(a.reasoning));
        }
        if !a.text.is_empty() {
            outs.push(answer::Out::Text(a.text));
        }
        outs.extend(a.calls.into_iter().map(answer::Out::Call));
        builder.push(outs);
        builder.finish();
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
        builder,
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
