//! The Messages routes: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::Sse as SseBody;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use futures_util::stream::{self, StreamExt};
use serde_json::json;

use super::request::parse;
use super::response::{message, AnthropicError};
use super::stream::{start_event, Blocks, Stream};
use crate::answer::{self, AnswerSplitter};
use crate::api::prepare::prepare;
use crate::body::Body;
use crate::generate::{self, render_chat};
use crate::job::Event;
use crate::{AppState, RequestLog, StreamLogged};

type St = State<Arc<AppState>>;

/// The Messages routes, for the server's router to merge.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
}

/// Whether a path belongs to this API (its errors, even the router's own, are
/// answered in Anthropic's shape).
pub fn is_anthropic_path(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

async fn messages(
    State(st): St,
    Extension(mut log): Extension<RequestLog>,
    b: Body,
) -> Result<Response, AnthropicError> {
    let (m, prompt, g, fault) = prepare(&st, b, move |s, obj| {
        let mut p = parse(&obj, false)?;
        s.sampling_defaults().apply_to(
            &mut p.g.sampling,
            &obj,
            crate::sampling_defaults::ANTHROPIC_NAMES,
        );
        let m = s.model(p.g.model.as_deref())?;
        let tools = p.g.tools.as_ref().filter(|t| t.enabled()).map(|t| &t.defs);
        let cp = render_chat(s, &m, &p.msgs, tools, &p.kwargs)?;
        let mut g = p.g;
        cp.shape(&mut g);
        // `max_tokens` is required and agents send large ones: it is a ceiling here,
        // capped to what the slot has left after the prompt.
        let room = m.slot_ctx.saturating_sub(cp.ids.len());
        if room > 0 {
            g.max_tokens = g.max_tokens.map(|n| n.min(room));
        }
        Ok((m, cp.ids, g, cp.fault))
    })
    .await?;
    let id = format!("msg_{}", st.next_serial());
    let model = m.id.clone();
    let tools = g.shown_tools();
    let splitter = AnswerSplitter::new(g.reasoning, tools);
    let mut gen = generate::start(&st, m, prompt, &g, fault, log.start).await?;
    let unenforced = std::mem::take(&mut gen.unenforced);
    if !g.stream {
        let (text, _, sum) = gen.collect_one().await?;
        let outs = answer::split_ordered(&text, g.reasoning, tools);
        let mut resp = Json(message(&id, &model, &outs, &sum, &g.stop)).into_response();
        resp.extensions_mut().insert(sum);
        return Ok(generate::mark_unenforced(resp, &unenforced));
    }
    // A failure before the first token is a plain error, not a 200 stream.
    let first = gen.next().await;
    if let Event::Error(e) = first {
        return Err(e.into());
    }
    log.status = 200;
    log.emit_on_drop = true;
    let head = start_event(&id, &model, gen.prompt_tokens);
    let state = Stream {
        gen,
        first: Some(first),
        blocks: Blocks::new(id, g.stop.clone(), splitter),
        log,
        done: false,
    };
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
    let body = stream::iter([head]).chain(events);
    let mut resp = SseBody::new(body.map(Ok::<_, Infallible>)).into_response();
    resp.extensions_mut().insert(StreamLogged);
    Ok(generate::mark_unenforced(resp, &unenforced))
}

async fn count_tokens(State(st): St, b: Body) -> Result<Response, AnthropicError> {
    let n = prepare(&st, b, move |s, obj| {
        let p = parse(&obj, true)?;
        let m = s.model(p.g.model.as_deref())?;
        let tools = p.g.tools.as_ref().filter(|t| t.enabled()).map(|t| &t.defs);
        Ok(render_chat(s, &m, &p.msgs, tools, &p.kwargs)?.ids.len())
    })
    .await?;
    Ok(Json(json!({"input_tokens": n})).into_response())
}
