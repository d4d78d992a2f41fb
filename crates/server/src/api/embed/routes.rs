//! The embedding routes of each API, reading their own fields and rendering their own
//! answers over [`super::inputs`] and [`super::run`].

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use minfer_runtime::embed::Pooling;
use serde_json::{json, Value};

use super::{first_dims, fit, inputs, run};
use crate::api::fields::{
    check_fields, field, opt_bool, opt_i64, opt_str, out_of_range, unsupported, wrong,
};
use crate::api::llama::LlamaError;
use crate::api::ollama::OllamaError;
use crate::api::prepare::prepare;
use crate::body::Body;
use crate::error::ApiError;
use crate::task::{Rows, TaskKind, TaskOutput};
use crate::AppState;

type St = State<Arc<AppState>>;

/// The embedding and rerank routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/embeddings", post(openai))
        .route("/api/embed", post(ollama_embed))
        .route("/api/embeddings", post(ollama_legacy))
        .route("/embedding", post(llama))
        .route("/embeddings", post(llama))
        .route("/v1/rerank", post(super::rerank::rerank))
        .route("/rerank", post(super::rerank::rerank))
        // llama-server's README names the route `/reranking`.
        .route("/v1/reranking", post(super::rerank::rerank))
        .route("/reranking", post(super::rerank::rerank))
}

/// The vectors of an embedding task (one row per input unless pooling is none).
fn vectors(out: TaskOutput) -> Result<(Vec<Rows>, Pooling), ApiError> {
    match out {
        TaskOutput::Embeddings(v, p) => Ok((v, p)),
        TaskOutput::Scores(_) => Err(ApiError::internal("the worker answered with scores")),
    }
}

/// One vector per input: what every API but llama-server's returns, refused with
/// pooling none.
fn pooled(v: Vec<Rows>, p: Pooling) -> Result<Vec<Vec<f32>>, ApiError> {
    if p == Pooling::None {
        return Err(ApiError::bad_request(
            "the server pools with `none` (one vector per token), which this API cannot \
             return; use POST /embedding, or start the server with another --pooling",
        ));
    }
    Ok(v.into_iter()
        .map(|mut r| r.pop().unwrap_or_default())
        .collect())
}

async fn openai(State(st): St, b: Body) -> Result<Response, ApiError> {
    let (m, toks, base64) = prepare(&st, b, |s, obj| {
        check_fields(
            &obj,
            &["input", "model", "encoding_format", "dimensions", "user"],
        )?;
        if field(&obj, "dimensions").is_some() {
            return Err(unsupported(
                "dimensions",
                "the model's vectors have one size; omit it to get them whole",
            )
            .with_param("dimensions"));
        }
        let base64 = match opt_str(&obj, "encoding_format")? {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => {
                return Err(wrong(
                    "encoding_format",
                    &format!("\"float\" or \"base64\", not {other:?}"),
                ))
            }
        };
        let m = s.model(opt_str(&obj, "model")?)?;
        let v = field(&obj, "input")
            .ok_or_else(|| ApiError::bad_request("field `input` is required"))?;
        let mut toks = inputs(v, "input", &m.tok)?;
        fit(&mut toks, m.slot_ctx, false)?;
        Ok((m, toks, base64))
    })
    .await?;
    let n_tokens: usize = toks.iter().map(Vec::len).sum();
    let kind = TaskKind::Embed {
        inputs: toks,
        pooling: st.pooling,
        normalize: true,
    };
    let (v, p) = vectors(run(&st, &m, kind).await?)?;
    let data: Vec<Value> = pooled(v, p)?
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let embedding = if base64 {
                json!(super::base64_f32(e))
            } else {
                json!(e)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": m.id,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
    .into_response())
}

/// ollama's `/api/embed`: unit vectors, cut to their first `dimensions` values and
/// scaled back to unit length; no input (absent, `""` or `[]`) answers no vectors, as
/// ollama's does.
async fn ollama_embed(State(st): St, b: Body) -> Result<Response, OllamaError> {
    let t0 = Instant::now();
    let (m, toks, dims) = prepare(&st, b, |s, obj| {
        check_fields(
            &obj,
            &[
                "model",
                "input",
                "truncate",
                "options",
                "keep_alive",
                "dimensions",
            ],
        )?;
        // ollama's rule: 0 (its default) or a size at or past the model's keeps the
        // whole vector; a negative size means nothing and is refused.
        let dims = match opt_i64(&obj, "dimensions")? {
            None | Some(0) => None,
            Some(n) => Some(usize::try_from(n).map_err(|_| {
                out_of_range("dimensions", n, "a positive integer (0: the whole vector)")
            })?),
        };
        let m = crate::api::ollama::served(s, opt_str(&obj, "model")?)?;
        let truncate = opt_bool(&obj, "truncate")?.unwrap_or(true);
        let mut toks = match field(&obj, "input") {
            None => Vec::new(),
            Some(Value::String(t)) if t.is_empty() => Vec::new(),
            Some(Value::Array(a)) if a.is_empty() => Vec::new(),
            Some(v) => inputs(v, "input", &m.tok)?,
        };
        fit(&mut toks, m.slot_ctx, truncate)?;
        Ok((m, toks, dims))
    })
    .await?;
    let model = crate::api::ollama::tag_name(&m.id);
    if toks.is_empty() {
        return Ok(Json(json!({"model": model, "embeddings": []})).into_response());
    }
    let n_tokens: usize = toks.iter().map(Vec::len).sum();
    let kind = TaskKind::Embed {
        inputs: toks,
        pooling: st.pooling,
        normalize: true,
    };
    let (v, p) = vectors(run(&st, &m, kind).await?)?;
    let mut embeddings = pooled(v, p)?;
    if let Some(n) = dims {
        for e in &mut embeddings {
            first_dims(e, n);
        }
    }
    Ok(Json(json!({
        "model": model,
        "embeddings": embeddings,
        "total_duration": t0.elapsed().as_nanos() as u64,
        "load_duration": 0,
        "prompt_eval_count": n_tokens,
    }))
    .into_response())
}

/// ollama's older route: one `prompt`, its vector as the model computes it (ollama does
/// not normalise here); an empty prompt answers an empty vector, as ollama's does.
async fn ollama_legacy(State(st): St, b: Body) -> Result<Response, OllamaError> {
    let prepared = prepare(&st, b, |s, obj| {
        check_fields(&obj, &["model", "prompt", "options", "keep_alive"])?;
        let m = crate::api::ollama::served(s, opt_str(&obj, "model")?)?;
        let prompt = opt_str(&obj, "prompt")?.unwrap_or("");
        if prompt.is_empty() {
            return Ok((m, None));
        }
        let mut toks = inputs(&json!(prompt), "prompt", &m.tok)?;
        fit(&mut toks, m.slot_ctx, true)?;
        Ok((m, Some(toks)))
    })
    .await?;
    let (m, Some(toks)) = prepared else {
        return Ok(Json(json!({"embedding": []})).into_response());
    };
    let kind = TaskKind::Embed {
        inputs: toks,
        pooling: st.pooling,
        normalize: false,
    };
    let (v, p) = vectors(run(&st, &m, kind).await?)?;
    let embedding = pooled(v, p)?.pop().unwrap_or_default();
    Ok(Json(json!({ "embedding": embedding })).into_response())
}

/// llama-server's `/embedding`: `[{index, embedding}]` with each embedding a list of
/// rows (one pooled row, or one per token with pooling none, never normalised then).
async fn llama(State(st): St, b: Body) -> Result<Response, LlamaError> {
    let (m, toks, normalize) = prepare(&st, b, |s, obj| {
        let m = s.model(opt_str(&obj, "model")?)?;
        let v = field(&obj, "content")
            .or_else(|| field(&obj, "input"))
            .ok_or_else(|| ApiError::bad_request("field `content` is required"))?;
        let normalize = match opt_i64(&obj, "embd_normalize")? {
            None | Some(2) => true,
            Some(-1) => false,
            Some(n) => {
                return Err(unsupported(
                    "embd_normalize",
                    &format!("{n} is not served: give 2 (Euclidean, the default) or -1 (none)"),
                ))
            }
        };
        let mut toks = inputs(v, "content", &m.tok)?;
        fit(&mut toks, m.slot_ctx, false)?;
        Ok((m, toks, normalize))
    })
    .await?;
    // As llama-server: per-token rows are never normalised.
    let pooling = st.pooling;
    let kind = TaskKind::Embed {
        inputs: toks,
        pooling,
        normalize: normalize && pooling != Some(Pooling::None),
    };
    let (v, _) = vectors(run(&st, &m, kind).await?)?;
    let list: Vec<Value> = v
        .into_iter()
        .enumerate()
        .map(|(i, rows)| json!({"index": i, "embedding": rows}))
        .collect();
    Ok(Json(Value::Array(list)).into_response())
}
