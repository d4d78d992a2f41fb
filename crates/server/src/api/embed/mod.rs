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
/// strings, an array of token ids, or an array of token-id arrays (OpenAI's shapes),
/// and llama-server's: a prompt mixing ids and strings (`[12, "text", 34]`, an array
/// holding any number is one such prompt) and prompt objects (`{"prompt_string"}`, or
/// `{"content"}` of text parts). Each becomes its tokens; an empty input, an empty list
/// or an id outside the vocabulary is refused, naming it.
pub fn inputs(v: &Value, name: &str, tok: &Tokenizer) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = |what: String| ApiError::bad_request(format!("field `{name}` {what}"));
    let list = match v {
        Value::Array(a) if a.is_empty() => return Err(bad("is an empty list".into())),
        Value::Array(a) if a.len() > MAX_INPUTS => {
            return Err(bad(format!(
                "holds {} inputs: at most {MAX_INPUTS} per request",
                a.len()
            )))
        }
        Value::Array(a) if !a.iter().any(Value::is_number) => a
            .iter()
            .enumerate()
            .map(|(i, x)| input(x, &format!("[{i}] "), name, tok))
            .collect::<Result<_, _>>()?,
        _ => vec![input(v, "", name, tok)?],
    };
    Ok(list)
}

/// One input (`at` places it in field `name` for errors): a string, token ids mixed
/// with strings, or a prompt object.
fn input(v: &Value, at: &str, name: &str, tok: &Tokenizer) -> Result<Vec<u32>, ApiError> {
    let bad = |what: String| ApiError::bad_request(format!("field `{name}` {at}{what}"));
    let n_vocab = tok.n_vocab();
    let text = |s: &str, bos: bool| -> Result<Vec<u32>, ApiError> {
        if s.is_empty() {
            return Err(bad("is an empty string: there is nothing to embed".into()));
        }
        Ok(tok.encode(s, bos, false))
    };
    match v {
        Value::String(s) => text(s, true),
        Value::Array(t) if t.is_empty() => Err(bad("is an empty list".into())),
        Value::Array(t) => {
            let mut out = Vec::new();
            for (j, x) in t.iter().enumerate() {
                match x {
                    // BOS only where the prompt starts with text (llama-server's rule).
                    Value::String(s) => out.extend(text(s, j == 0)?),
                    _ => out.push(
                        x.as_u64()
                            .and_then(|x| u32::try_from(x).ok())
                            .filter(|&x| (x as usize) < n_vocab)
                            .ok_or_else(|| {
                                bad(format!("holds {x}: token ids must be below {n_vocab}"))
                            })?,
                    ),
                }
            }
            Ok(out)
        }
        Value::Object(o) => {
            if let Some(s) = o.get("prompt_string").and_then(Value::as_str) {
                return text(s, true);
            }
            let parts = o.get("content").and_then(Value::as_array).ok_or_else(|| {
                bad("is an object without `prompt_string` or `content` text parts".into())
            })?;
            let mut joined = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => joined.push_str(t),
                    _ => {
                        return Err(bad(
                            "holds a content part that is not text: only text is embedded".into(),
                        ))
                    }
                }
            }
            text(&joined, true)
        }
        _ => Err(bad(
            "must be a string, an array of strings, an array of token ids or an array of \
             token-id arrays"
                .into(),
        )),
    }
}

/// Cuts each input to `max` tokens (`truncate`), or refuses the first longer one,
/// naming it and the limit.
pub fn fit(inputs: &mut [Vec<u32>], max: usize, truncate: bool) -> Result<(), ApiError> {
    for (i, t) in inputs.iter_mut().enumerate() {
        if t.len() > max {
            if !truncate {
                return Err(ApiError::bad_request(format!(
                    "input {i} is too large to process: {} tokens, more than the {max} of \
                     this model's context (a slot); shorten it or let the server truncate it",
                    t.len()
                )));
            }
            t.truncate(max);
        }
    }
    Ok(())
}

/// Cuts `v` to its first `n` values and scales them back to unit length (ollama's
/// `dimensions`, for models trained so that a prefix of the vector is itself an
/// embedding); `n` of 0 or at least `v`'s length leaves `v` whole. A zero prefix stays
/// zero (its norm is floored, as ollama floors it, rather than divided by).
pub fn first_dims(v: &mut Vec<f32>, n: usize) {
    if n == 0 || n >= v.len() {
        return;
    }
    v.truncate(n);
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    let scale = (1.0 / norm.max(1e-12)) as f32;
    for x in v.iter_mut() {
        *x *= scale;
    }
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
    fn llama_server_s_mixed_prompts_and_prompt_objects_are_read() {
        let tok = crate::api::llama::tests::tiny_tokenizer();
        let text = |s: &str| tok.encode(s, true, false);
        let one = |v: Value| inputs(&v, "input", &tok);
        let ab = text("ab");
        // One mixed prompt: ids and text (BOS only before text that starts it).
        let mixed = one(serde_json::json!([5, "ab", 6])).unwrap();
        assert_eq!(mixed.len(), 1);
        let mut want = vec![5];
        want.extend(tok.encode("ab", false, false));
        want.push(6);
        assert_eq!(mixed[0], want);
        // Several prompts, each a string, ids, mixed or an object.
        let many = one(serde_json::json!([
            "ab", [5, 6], [5, "ab"], {"prompt_string": "ab"},
            {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        ]))
        .unwrap();
        assert_eq!(many.len(), 5);
        assert_eq!(many[0], ab);
        assert_eq!(many[1], [5, 6]);
        assert_eq!((many[3].clone(), many[4].clone()), (ab.clone(), ab));
        for (bad, at) in [
            (
                serde_json::json!([{"content": [{"type": "image_url"}]}]),
                "[0] holds a content part",
            ),
            (serde_json::json!([{"x": 1}]), "[0] is an object"),
            (serde_json::json!(["a", ""]), "[1] is an empty string"),
            (serde_json::json!([[]]), "[0] is an empty list"),
        ] {
            let e = one(bad).unwrap_err();
            assert!(e.message.contains(at), "{at}: {}", e.message);
        }
    }

    #[test]
    fn dimensions_keep_a_prefix_scaled_to_unit_length() {
        let mut v = vec![0.6, 0.0, 0.8, 0.0];
        first_dims(&mut v, 2);
        assert_eq!(v, [1.0, 0.0]);
        let mut v = vec![3.0, 4.0, 12.0];
        first_dims(&mut v, 2);
        assert!(
            (v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6,
            "{v:?}"
        );
        // 0 or a size at or past the vector's keeps it whole, unscaled.
        for n in [0, 3, 9] {
            let mut v = vec![3.0, 4.0, 12.0];
            first_dims(&mut v, n);
            assert_eq!(v, [3.0, 4.0, 12.0], "{n}");
        }
        // A zero prefix stays zero instead of becoming NaN.
        let mut v = vec![0.0, 0.0, 1.0];
        first_dims(&mut v, 2);
        assert_eq!(v, [0.0, 0.0]);
    }

    #[test]
    fn inputs_are_truncated_or_refused_by_index() {
        let mut v = vec![vec![1, 2, 3], vec![4; 9]];
        let e = fit(&mut v.clone(), 4, false).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("input 1 is too large") && e.contains("9 tokens"),
            "{e}"
        );
        fit(&mut v, 4, true).unwrap();
        assert_eq!(v, [vec![1, 2, 3], vec![4; 4]]);
    }
}
