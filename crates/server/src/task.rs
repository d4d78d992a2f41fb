//! Whole-text work the worker runs between two decode steps, in one idle slot: the
//! embeddings of a batch of inputs (a cross-encoder's rank scores among them), and the
//! yes/no relevance judgement of rerank. Each text runs as the slot's sequence from
//! position 0 and nothing of it is kept (the slot's cached prefix is forgotten), so no
//! other slot's KV is touched.
//!
//! A task runs to the end once started: decoding slots wait for it, as they wait for a
//! long prompt's prefill. With every slot busy it waits for one to free.

use std::time::Instant;

use minfer_runtime::embed::Pooling;
use minfer_runtime::{EngineError, MultiEngine, SeqStep};
use tokio::sync::oneshot;

use crate::error::ApiError;

/// What a task computes.
#[derive(Debug, Clone)]
pub enum TaskKind {
    /// One embedding per input (a vector, or one per token with [`Pooling::None`]).
    Embed {
        /// The inputs' tokens, each non-empty and inside a slot.
        inputs: Vec<Vec<u32>>,
        /// The pooling; `None`: the model's own, else mean.
        pooling: Option<Pooling>,
        /// Scale each vector to unit length.
        normalize: bool,
    },
    /// softmax(logit(`yes`), logit(`no`))'s `yes` share at the last token of each prompt.
    Judge {
        /// The judge prompts' tokens.
        prompts: Vec<Vec<u32>>,
        /// The "yes" token.
        yes: u32,
        /// The "no" token.
        no: u32,
    },
}

/// One input's embedding rows (one row when pooled, one per token otherwise).
pub type Rows = Vec<Vec<f32>>;

/// What a finished task answers.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskOutput {
    /// Per input, its rows; with the pooling that made them.
    Embeddings(Vec<Rows>, Pooling),
    /// Per prompt, the probability of "yes".
    Scores(Vec<f64>),
}

/// A task and where its answer goes.
#[derive(Debug)]
pub struct Task {
    /// The work.
    pub kind: TaskKind,
    /// When the client is given up on (then 504).
    pub deadline: Instant,
    /// The answer; a dropped receiver cancels nothing once running.
    pub reply: oneshot::Sender<Result<TaskOutput, ApiError>>,
}

/// Runs `kind` in `slot` of `engine` (the worker's side); the slot's rows are
/// overwritten. A failure names the input.
pub(crate) fn compute(
    engine: &mut MultiEngine,
    slot: usize,
    kind: &TaskKind,
    deadline: Instant,
) -> Result<TaskOutput, ApiError> {
    let late = || {
        ApiError::new(
            axum::http::StatusCode::GATEWAY_TIMEOUT,
            "the request timed out",
        )
    };
    let named = |i: usize, e: EngineError| match e {
        EngineError::ContextOverflow { .. } | EngineError::BadToken { .. } => {
            ApiError::bad_request(format!("input {i}: {e}"))
        }
        EngineError::Param {
            name: "input" | "pooling",
            ..
        } => ApiError::bad_request(format!("input {i}: {e}")),
        other => ApiError::internal(format!("inference failed on input {i}: {other}")),
    };
    match kind {
        TaskKind::Embed {
            inputs,
            pooling,
            normalize,
        } => {
            let pooling = pooling.unwrap_or_else(|| Pooling::default_for(engine.engine()));
            let mut all = Vec::with_capacity(inputs.len());
            for (i, toks) in inputs.iter().enumerate() {
                if Instant::now() >= deadline {
                    return Err(late());
                }
                all.push(
                    engine
                        .embed(slot, toks, pooling, *normalize)
                        .map_err(|e| named(i, e))?,
                );
            }
            Ok(TaskOutput::Embeddings(all, pooling))
        }
        TaskKind::Judge { prompts, yes, no } => {
            let mut scores = Vec::with_capacity(prompts.len());
            for (i, toks) in prompts.iter().enumerate() {
                if Instant::now() >= deadline {
                    return Err(late());
                }
                engine.reset_slot(slot).map_err(|e| named(i, e))?;
                let entry = SeqStep {
                    slot,
                    tokens: toks.clone(),
                    pos0: 0,
                    n_out: 1,
                };
                let logits = engine.step(&[entry]).map_err(|e| named(i, e))?;
                let row = logits.first().map(Vec::as_slice).unwrap_or_default();
                let (Some(&y), Some(&n)) = (row.get(*yes as usize), row.get(*no as usize)) else {
                    return Err(ApiError::internal(
                        "the yes/no tokens are outside the logits",
                    ));
                };
                scores.push(yes_share(y, n));
            }
            Ok(TaskOutput::Scores(scores))
        }
    }
}

/// softmax over the two logits, the share of `yes`: 1 / (1 + e^(no - yes)).
pub fn yes_share(yes: f32, no: f32) -> f64 {
    1.0 / (1.0 + (no as f64 - yes as f64).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_yes_share_is_the_two_way_softmax() {
        assert!((yes_share(0.0, 0.0) - 0.5).abs() < 1e-12);
        let (y, n) = (2.5f32, -1.0f32);
        let want = (y as f64).exp() / ((y as f64).exp() + (n as f64).exp());
        assert!((yes_share(y, n) - want).abs() < 1e-12);
        assert!(yes_share(-50.0, 50.0) < 1e-40);
    }
}
