//! The cross-encoder classifier head of a BERT reranker (`pooling_type` 4, rank), as
//! llama.cpp builds it: a pooled row (the runtime reads the first token's, `[CLS]`)
//! passes the optional dense layer `cls.weight` (+ `cls.bias`) and tanh, then the
//! optional classifier `cls.output.weight` (+ `cls.output.bias`), giving `n_cls_out`
//! scores. No sigmoid follows: the scores are the raw logits llama-server reports as
//! `relevance_score`. Both parts are optional (llama.cpp loads either alone); a file with
//! neither has no head and cannot rank.

use minfer_gguf::{GgufFile, MetaValue};
use minfer_graph::{GraphBuilder, NodeId};

use super::{affine, Affine, ARCH};
use crate::error::ModelError;

/// The dense layer before the tanh.
const DENSE: &str = "cls";
/// The classifier after it.
const OUT: &str = "cls.output";

/// A loaded rank head.
pub(super) struct RankHead {
    dense: Option<Affine>,
    out: Option<Affine>,
    width: usize,
}

/// Scores of the classifier: one per label of `<arch>.classifier.output_labels`, else 1
/// (a reranker's single relevance logit).
fn n_labels(file: &GgufFile) -> usize {
    match file.get(&format!("{ARCH}.classifier.output_labels")) {
        Some(MetaValue::Array(_, v)) if !v.is_empty() => v.len(),
        _ => 1,
    }
}

/// The head of `file` (`None` without `cls.weight` and `cls.output.weight`); a present
/// part of the wrong shape is refused by name.
pub(super) fn load(file: &GgufFile, n_embd: usize) -> Result<Option<RankHead>, ModelError> {
    let part = |name: &str, out_dim: usize| -> Result<Option<Affine>, ModelError> {
        let w = format!("{name}.weight");
        match file.tensor(&w) {
            Some(_) => affine(file, &w, &format!("{name}.bias"), n_embd, out_dim).map(Some),
            None => Ok(None),
        }
    };
    let n_cls_out = n_labels(file);
    let dense = part(DENSE, n_embd)?;
    let out = part(OUT, n_cls_out)?;
    if dense.is_none() && out.is_none() {
        return Ok(None);
    }
    // Without a classifier the dense row itself is the output (llama.cpp's rule for
    // single-layer heads); its first value is the score.
    let width = if out.is_some() { n_cls_out } else { n_embd };
    Ok(Some(RankHead { dense, out, width }))
}

impl RankHead {
    /// Values per output row: `n_cls_out` with a classifier, else `n_embd`.
    pub(super) fn width(&self) -> usize {
        self.width
    }

    /// The head over `rows` (`[n_embd, n]`): `[width, n]`.
    pub(super) fn build(&self, b: &mut GraphBuilder, rows: NodeId) -> NodeId {
        let mut cur = rows;
        if let Some((w, bias)) = &self.dense {
            cur = b.matmul(cur, w, bias.as_ref());
            b.set_name(cur, "cls_dense");
            cur = b.tanh(cur);
            b.set_name(cur, "cls_tanh");
        }
        if let Some((w, bias)) = &self.out {
            cur = b.matmul(cur, w, bias.as_ref());
        }
        b.set_name(cur, "result_embd_pooled");
        cur
    }

    /// The head's weights, each once.
    pub(super) fn weights(&self) -> impl Iterator<Item = &minfer_graph::WeightRef> {
        self.dense
            .iter()
            .chain(&self.out)
            .flat_map(|(w, bias)| std::iter::once(w).chain(bias))
    }
}
