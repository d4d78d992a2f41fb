//! `POST /v1/rerank` and `/rerank` (llama-server's and Jina's shape): each document is
//! scored by the model's yes/no judgement, as Qwen3-Reranker is used. The model reads
//! its judge prompt (a system turn asking whether the Document meets the Query under the
//! Instruct, answering only "yes" or "no") and the score is softmax(logit("yes"),
//! logit("no")) for "yes" at the last position. It suits Qwen3-Reranker and other chat
//! models trained to answer that prompt; a model without single "yes"/"no" tokens, or a
//! server started without `--rerank`, is refused by name.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use minfer_tokenizer::Tokenizer;
use serde_json::{json, Value};

use super::{run, MAX_INPUTS};
use crate::api::fields::{check_fields, field, opt_bool, opt_str, opt_usize, string_list};
use crate::api::prepare::prepare;
use crate::body::Body;
use crate::error::ApiError;
use crate::task::{TaskKind, TaskOutput};
use crate::AppState;

/// The instruction a request that gives none is judged under (Qwen3-Reranker's default).
pub const DEFAULT_INSTRUCTION: &str =
    "Given a web search query, retrieve relevant passages that answer the query";

const SYSTEM: &str = "<|im_start|>system\nJudge whether the Document meets the requirements \
based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \
\"no\".<|im_end|>\n<|im_start|>user\n";
const ANSWER: &str = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

/// The id of `word` when the tokenizer spells it as exactly one token.
fn single(tok: &Tokenizer, word: &str) -> Option<u32> {
    match tok.encode(word, false, false).as_slice() {
        [id] => Some(*id),
        _ => None,
    }
}

/// The judge prompt of one document: the fixed turns parse their special tokens, the
/// client's text never does. The client's part is cut at its end to fit `max` tokens.
pub fn judge_prompt(
    tok: &Tokenizer,
    instruction: &str,
    query: &str,
    doc: &str,
    max: usize,
) -> Result<Vec<u32>, ApiError> {
    let head = tok.encode(SYSTEM, false, true);
    let tail = tok.encode(ANSWER, false, true);
    let mut body = tok.encode(
        &format!("<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"),
        false,
        false,
    );
    let room = max.checked_sub(head.len() + tail.len()).filter(|&r| r > 0);
    let room = room.ok_or_else(|| {
        ApiError::bad_request(format!(
            "the judge prompt does not fit this model's context of {max} tokens a slot"
        ))
    })?;
    body.truncate(room);
    Ok([head, body, tail].concat())
}

/// The route.
pub(super) async fn rerank(State(st): State<Arc<AppState>>, b: Body) -> Result<Response, ApiError> {
    if !st.rerank {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "rerank is off: start the server with --rerank (and a Qwen3-Reranker-style model)",
        ));
    }
    let (m, prompts, docs, top_n, with_docs, yes, no) = prepare(&st, b, |s, obj| {
        check_fields(
            &obj,
            &[
                "model",
                "query",
                "documents",
                "top_n",
                "return_documents",
                "instruction",
            ],
        )?;
        let m = s.model(opt_str(&obj, "model")?)?;
        let query = opt_str(&obj, "query")?
            .filter(|q| !q.is_empty())
            .ok_or_else(|| {
                ApiError::bad_request("field `query` is required (a non-empty string)")
            })?;
        if field(&obj, "documents").is_none() {
            return Err(ApiError::bad_request("field `documents` is required"));
        }
        let docs = string_list(field(&obj, "documents"), "documents", "an array of strings")?;
        if docs.is_empty() || docs.len() > MAX_INPUTS {
            return Err(ApiError::bad_request(format!(
                "field `documents` holds {} documents: must be 1 to {MAX_INPUTS}",
                docs.len()
            )));
        }
        let (Some(yes), Some(no)) = (single(&m.tok, "yes"), single(&m.tok, "no")) else {
            return Err(ApiError::bad_request(format!(
                "model {} has no single \"yes\" and \"no\" tokens: rerank scores a \
                 Qwen3-Reranker-style yes/no judgement",
                m.id
            )));
        };
        let instruction = opt_str(&obj, "instruction")?.unwrap_or(DEFAULT_INSTRUCTION);
        let prompts = docs
            .iter()
            .map(|d| judge_prompt(&m.tok, instruction, query, d, m.slot_ctx))
            .collect::<Result<Vec<_>, _>>()?;
        let top_n = opt_usize(&obj, "top_n")?.unwrap_or(docs.len());
        let with_docs = opt_bool(&obj, "return_documents")?.unwrap_or(false);
        Ok((m, prompts, docs, top_n, with_docs, yes, no))
    })
    .await?;
    let n_tokens: usize = prompts.iter().map(Vec::len).sum();
    let out = run(&st, &m, TaskKind::Judge { prompts, yes, no }).await?;
    let TaskOutput::Scores(scores) = out else {
        return Err(ApiError::internal("the worker answered with embeddings"));
    };
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order.truncate(top_n);
    let results: Vec<Value> = order
        .into_iter()
        .map(|i| {
            let mut r = json!({"index": i, "relevance_score": scores[i]});
            if with_docs {
                r["document"] = json!({"text": docs[i]});
            }
            r
        })
        .collect();
    Ok(Json(json!({
        "model": m.id,
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "results": results,
    }))
    .into_response())
}
