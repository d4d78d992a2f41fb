//! Graph parameters for the two call sites (design §4.5, §11.1): a prompt chunk and a
//! decode step. The graph type follows the token count — `Prefill` when `nt > 1`,
//! `Decode` otherwise — and `weights_version` is 1 until weights can be reloaded.

use minfer_graph::{CParams, GraphParams, GraphType};

use crate::error::ModelError;

/// The weights version every call site uses while there is no reload path.
pub const WEIGHTS_VERSION: u64 = 1;

/// CParams for an all-CPU run: no GPU, so no decode fusion, Gqa attention, implicit spans.
pub fn cpu_cparams(n_ctx: usize) -> CParams {
    CParams {
        n_ctx,
        flash_attn: false,
        gpu: false,
        fuse_qkv: false,
        fuse_ffn: false,
        explicit_span: false,
        ring: None,
        embeddings: false,
        rank: false,
        state_slots: 1,
        delta_chunk: 0,
    }
}

/// CParams for an all-CPU multi-sequence run over a KV arena of `n_ctx` rows: as
/// [`cpu_cparams`], plus the `span` and `cells` inputs that place each token's KV.
pub fn cpu_batch_cparams(n_ctx: usize) -> CParams {
    CParams {
        explicit_span: true,
        ..cpu_cparams(n_ctx)
    }
}

/// Params for `n_tokens` tokens producing logits for the last `n_out` of them.
pub fn graph_params(
    n_tokens: usize,
    n_out: usize,
    cparams: CParams,
) -> Result<GraphParams, ModelError> {
    let p = GraphParams {
        n_tokens,
        n_out,
        gtype: if n_tokens > 1 {
            GraphType::Prefill
        } else {
            GraphType::Decode
        },
        cparams,
        weights_version: WEIGHTS_VERSION,
    };
    check(&p)?;
    Ok(p)
}

/// Params for a prompt chunk of `n_tokens` with logits for its last `n_out` tokens.
pub fn prefill(n_tokens: usize, n_out: usize, cparams: CParams) -> Result<GraphParams, ModelError> {
    graph_params(n_tokens, n_out, cparams)
}

/// Params for one decode step (one token, one row of logits).
pub fn decode(cparams: CParams) -> Result<GraphParams, ModelError> {
    graph_params(1, 1, cparams)
}

/// The `tail_ids` input for `n_out < n_tokens`: the last `n_out` token rows, in order.
pub fn tail_ids(n_tokens: usize, n_out: usize) -> Vec<i32> {
    (n_tokens.saturating_sub(n_out)..n_tokens)
        .map(|i| i32::try_from(i).unwrap_or(i32::MAX))
        .collect()
}

/// Whether a graph can be built for `p`: `1 <= n_out <= n_tokens <= n_ctx`, and the
/// graph type is the one the token count implies.
pub fn check(p: &GraphParams) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::BadParams(m));
    if p.n_tokens == 0 {
        return bad("n_tokens is 0".into());
    }
    if p.n_out == 0 || p.n_out > p.n_tokens {
        return bad(format!(
            "n_out {} must be in 1..={} (n_tokens)",
            p.n_out, p.n_tokens
        ));
    }
    if p.n_tokens > p.cparams.n_ctx {
        return bad(format!(
            "n_tokens {} exceeds the KV length n_ctx {}",
            p.n_tokens, p.cparams.n_ctx
        ));
    }
    if i32::try_from(p.cparams.n_ctx).is_err() {
        return bad(format!(
            "n_ctx {} does not fit the I32 position input",
            p.cparams.n_ctx
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_type_follows_the_token_count() {
        let p = prefill(7, 1, cpu_cparams(16)).unwrap();
        assert_eq!((p.gtype, p.n_tokens, p.n_out), (GraphType::Prefill, 7, 1));
        assert_eq!(p.weights_version, 1);
        let d = decode(cpu_cparams(16)).unwrap();
        assert_eq!((d.gtype, d.n_tokens, d.n_out), (GraphType::Decode, 1, 1));
        assert_eq!(
            prefill(1, 1, cpu_cparams(4)).unwrap().gtype,
            GraphType::Decode
        );
    }

    #[test]
    fn impossible_params_are_refused_with_the_reason() {
        let e = prefill(4, 5, cpu_cparams(16)).unwrap_err().to_string();
        assert!(e.contains("n_out 5 must be in 1..=4"), "{e}");
        let e = prefill(4, 0, cpu_cparams(16)).unwrap_err().to_string();
        assert!(e.contains("n_out 0"), "{e}");
        let e = prefill(0, 0, cpu_cparams(16)).unwrap_err().to_string();
        assert!(e.contains("n_tokens is 0"), "{e}");
        let e = prefill(32, 1, cpu_cparams(16)).unwrap_err().to_string();
        assert!(e.contains("exceeds the KV length n_ctx 16"), "{e}");
    }

    #[test]
    fn batch_cparams_differ_only_in_explicit_spans() {
        let b = cpu_batch_cparams(32);
        assert!(b.explicit_span);
        assert_eq!(
            CParams {
                explicit_span: false,
                ..b
            },
            cpu_cparams(32)
        );
    }

    #[test]
    fn tail_ids_are_the_last_rows() {
        assert_eq!(tail_ids(5, 2), vec![3, 4]);
        assert_eq!(tail_ids(3, 3), vec![0, 1, 2]);
        assert_eq!(tail_ids(1, 1), vec![0]);
    }
}
