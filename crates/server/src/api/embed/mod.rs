//! Embeddings and rerank: OpenAI's `/v1/embeddings`, ollama's `/api/embed` and
//! `/api/embeddings`, llama-server's `/embedding` and `/embeddings`, and the Jina-shaped
//! `/v1/rerank` and `/rerank`. Inputs are read and tokenised here (as `minfer embed`
//! does: the model's BOS added, special-token text kept as text), then run as one
//! [`crate::task::Task`] by the model's worker; `routes` renders each API's answer.

mod rerank;
mod routes;

pub use routes::routes;

use std::sync::Arc;
use std::time::Instant;

use minfer_tokenizer::Tokenizer;
use serde_json::Value;

use crate::error::ApiError;
use crate::task::{Task, TaskKind, TaskOutput};
use crate::{AppState, Model};

/// Most inputs one request may carry (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// Reads `v` (field `name`) as the inputs of one request: a string, an array of
/// strings, an array of token ids, or an array of token-id arrays. Each becomes its
/// tokens; an empty input, an empty list or an id outside the vocabulary is refused.
pub fn inputs(v: &Value, name: &str, tok: &Tokenizer) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = |what: String| ApiError::bad_request(format!("field `{name}` {what}"));
    let n_vocab = tok.n_vocab();
    let ids = |a: &[Value], at: String| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .filter(|&x| (x as usize) < n_vocab)
                    .ok_or_else(|| bad(format!("{at}holds {x}: token ids must be below {n_vocab}")))
            })
            .collect()
    };
    let text = |s: &str, at: String| -> Result<Vec<u32>, ApiError> {
        if s.is_empty() {
            return Err(bad(format!(
                "{at}is an empty string: there is nothing to embed"
            )));
        }
        Ok(tok.encode(s, true, false))
    };
    let list = match v {
        Value::String(s) => vec![text(s, String::new())?],
        Value::Array(a) if a.is_empty() => return Err(bad("is an empty list".into())),
        Value::Array(a) if a.len() > MAX_INPUTS => {
            return Err(bad(format!(
                "holds {} inputs: at most {MAX_INPUTS} per request",
                a.len()
            )))
        }
        Value::Array(a) if a.iter().all(Value::is_number) => vec![ids(a, String::new())?],
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::String(s) => text(s, format!("[{i}] ")),
                Value::Array(t) if t.is_empty() => Err(bad(format!("[{i}] is an empty list"))),
                Value::Array(t) => ids(t, format!("[{i}] ")),
                _ => Err(bad(format!(
                    "[{i}] must be a string or an array of token ids"
                ))),
            })
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(bad(
                "must be a string, an array of strings, an array of token ids or an array of \
                 token-id arrays"
                    .into(),
            ))
        }
    };
    Ok(list)
}

/// Cuts each input to `max` tokens (`truncate`), or refuses the first longer one,
/// naming it and the limit.
pub fn fit(inputs: &mut [Vec<u32>], max: usize, truncate: bool) -> Result<(), ApiError> {
    for (i, t) in inputs.iter_mut().enumerate() {
        if t.len() > max {
            if !truncate {
                return Err(ApiError::bad_request(format!(
                    "input {i} is {} tokens, more than the {max} of this model's context \
                     (a slot); shorten it or let the server truncate it",
                    t.len()
                )));
            }
            t.truncate(max);
        }
    }
    Ok(())
}

/// Runs `kind` on `m`'s worker and waits for its answer (within the request timeout).
pub async fn run(st: &AppState, m: &Arc<Model>, kind: TaskKind) -> Result<TaskOutput, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    m.worker.submit_task(Task {
        kind,
        deadline: Instant::now() + st.timeout,
        reply: tx,
    })?;
    rx.await
        .map_err(|_| ApiError::internal("the inference worker has stopped"))?
}

/// The little-endian bytes of `v` in standard base64 (OpenAI's `encoding_format`).
pub fn base64_f32(v: &[f32]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for k in 0..4 {
            if k <= c.len() {
                out.push(ABC[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        // 1.0f32 is 00 00 80 3f; 2.0f32 is 00 00 00 40.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, 2.0]), "AACAPwAAAEA=");
        assert_eq!(base64_f32(&[]), "");
    }

    #[test]
    fn inputs_are_truncated_or_refused_by_index() {
        let mut v = vec![vec![1, 2, 3], vec![4; 9]];
        let e = fit(&mut v.clone(), 4, false).unwrap_err();
        assert!(e.to_string().contains("input 1 is 9 tokens"), "{e}");
        fit(&mut v, 4, true).unwrap();
        assert_eq!(v, [vec![1, 2, 3], vec![4; 4]]);
    }
}
