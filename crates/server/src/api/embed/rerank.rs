//! `POST /v1/rerank` and `/rerank` (llama-server's and Jina's shape), two ways:
//!
//! - A cross-encoder (a BERT reranker such as bge-reranker: a classifier head, pooled
//!   with rank, from its `pooling_type` or `--pooling rank`) scores each (query,
//!   document) pair joined as llama-server joins it ([`PairEnd::Server`]: `[CLS] query
//!   [SEP] document` for a WordPiece vocabulary); the score is the head's raw logit, as
//!   llama-server reports it (no sigmoid).
//! - Otherwise, with `--rerank`, the model's yes/no judgement, as Qwen3-Reranker is used:
//!   the model reads its judge prompt (a system turn asking whether the Document meets
//!   the Query under the Instruct, answering only "yes" or "no") and the score is
//!   softmax(logit("yes"), logit("no")) for "yes" at the last position.
//!
//! A model that can do neither (no head with rank pooling; an encoder, or a model without
//! single "yes"/"no" tokens, with `--rerank`) is refused with a 400 naming why; a server
//! with neither a cross-encoder nor `--rerank` answers 501.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use minfer_runtime::embed::Pooling;
use minfer_tokenizer::{PairEnd, Tokenizer};
use serde_json::{json, Value};

use super::{run, MAX_INPUTS};
use crate::api::fields::{check_fields, field, opt_bool, opt_str, opt_usize, string_list};
use crate::api::prepare::prepare;
use crate::body::Body;
use crate::error::ApiError;
use crate::models::Model;
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

/// How a model scores a document.
enum Scorer {
    /// Its classifier head over the joined pair (a cross-encoder).
    Head,
    /// Its yes/no judgement: the ids of "yes" and "no".
    Judge(u32, u32),
}

/// How `m` reranks on this server, or why it cannot.
fn scorer(st: &AppState, m: &Model) -> Result<Scorer, ApiError> {
    if st.pooling.unwrap_or(m.pooling) == Pooling::Rank {
        if m.rank_width.is_none() {
            return Err(ApiError::bad_request(format!(
                "model {} cannot rerank with pooling rank: it has no classifier head \
                 (`cls.output.weight` or `cls.weight`)",
                m.id
            )));
        }
        return Ok(Scorer::Head);
    }
    if !st.rerank {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "rerank is off: serve a cross-encoder reranker (a classifier head with pooling \
             rank), or start the server with --rerank (and a Qwen3-Reranker-style model)",
        ));
    }
    if m.encoder {
        return Err(ApiError::bad_request(format!(
            "model {} is an encoder without a classifier head pooled with rank: it cannot \
             rerank (a cross-encoder reranker has `cls.output.weight`; serve it with \
             --pooling rank if its file states another pooling)",
            m.id
        )));
    }
    match (single(&m.tok, "yes"), single(&m.tok, "no")) {
        (Some(yes), Some(no)) => Ok(Scorer::Judge(yes, no)),
        _ => Err(ApiError::bad_request(format!(
            "model {} has no single \"yes\" and \"no\" tokens: rerank scores a \
             Qwen3-Reranker-style yes/no judgement",
            m.id
        ))),
    }
}

/// The route.
pub(super) async fn rerank(State(st): State<Arc<AppState>>, b: Body) -> Result<Response, ApiError> {
    let (m, prompts, docs, top_n, with_docs, how, tei) = prepare(&st, b, |s, obj| {
        check_fields(
            &obj,
            &[
                "model",
                "query",
                "documents",
                "texts",
                "top_n",
                "return_documents",
                "return_text",
                "instruction",
            ],
        )?;
        let m = s.model(opt_str(&obj, "model")?)?;
        let query = opt_str(&obj, "query")?
            .filter(|q| !q.is_empty())
            .ok_or_else(|| {
                ApiError::bad_request("field `query` is required (a non-empty string)")
            })?;
        // `texts` is text-embeddings-inference's name for the documents, and asks for
        // its answer: a bare array of `{index, score}`, as llama-server gives it.
        let tei = field(&obj, "texts").is_some();
        if tei && field(&obj, "documents").is_some() {
            return Err(ApiError::bad_request(
                "fields `documents` and `texts` are both given: send one",
            ));
        }
        let name = if tei { "texts" } else { "documents" };
        if field(&obj, name).is_none() {
            return Err(ApiError::bad_request("field `documents` is required"));
        }
        let docs = string_list(field(&obj, name), name, "an array of strings")?;
        if docs.is_empty() || docs.len() > MAX_INPUTS {
            return Err(ApiError::bad_request(format!(
                "field `{name}` holds {} documents: must be 1 to {MAX_INPUTS}",
                docs.len()
            )));
        }
        let how = scorer(s, &m)?;
        let instruction = opt_str(&obj, "instruction")?.unwrap_or(DEFAULT_INSTRUCTION);
        let prompts = docs
            .iter()
            .map(|d| match how {
                Scorer::Head => Ok(m.tok.encode_pair(query, d, PairEnd::Server)),
                Scorer::Judge(..) => judge_prompt(&m.tok, instruction, query, d, m.slot_ctx),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let top_n = opt_usize(&obj, "top_n")?.unwrap_or(docs.len());
        let echo = if tei {
            "return_text"
        } else {
            "return_documents"
        };
        let with_docs = opt_bool(&obj, echo)?.unwrap_or(false);
        Ok((m, prompts, docs, top_n, with_docs, how, tei))
    })
    .await?;
    let n_tokens: usize = prompts.iter().map(Vec::len).sum();
    let kind = match how {
        // The head's first value is the relevance logit; never normalised.
        Scorer::Head => TaskKind::Embed {
            inputs: prompts,
            pooling: Some(Pooling::Rank),
            normalize: false,
        },
        Scorer::Judge(yes, no) => TaskKind::Judge { prompts, yes, no },
    };
    let scores: Vec<f64> = match run(&st, &m, kind).await? {
        TaskOutput::Scores(scores) => scores,
        TaskOutput::Embeddings(rows, _) => rows
            .iter()
            .map(|r| {
                r.first()
                    .and_then(|v| v.first())
                    .map_or(f64::NAN, |&x| x as f64)
            })
            .collect(),
    };
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    order.truncate(top_n);
    let results: Vec<Value> = order
        .into_iter()
        .map(|i| match tei {
            true if with_docs => json!({"index": i, "score": scores[i], "text": docs[i]}),
            true => json!({"index": i, "score": scores[i]}),
            false if with_docs => {
                json!({"index": i, "relevance_score": scores[i], "document": {"text": docs[i]}})
            }
            false => json!({"index": i, "relevance_score": scores[i]}),
        })
        .collect();
    if tei {
        return Ok(Json(results).into_response());
    }
    Ok(Json(json!({
        "model": m.id,
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "results": results,
    }))
    .into_response())
}
