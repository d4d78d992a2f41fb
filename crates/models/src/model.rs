//! The model trait and the one implementation every architecture shares: validated
//! hyperparameters and weights plus the architecture's Q/K/V block and skeleton terms.

use minfer_graph::{ComputeGraph, GraphParams, RopeStyle, WeightRef};

use crate::common::{
    self, gate_up_concat_name, qkv_concat_name, QkvBlock, Terms, FUSED_FFN_MAX_NF,
};
use crate::hparams::HParams;
use crate::weights::{Ffn, Weights};

/// A weight a GPU backend builds by concatenating GGUF tensors along the output axis,
/// for the decode fusions; the fused nodes reference it by `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcatWeight {
    /// Registry name the fused node uses, e.g. `blk.0.attn_qkv.weight`.
    pub name: String,
    /// GGUF tensors, in row order of the concatenation.
    pub parts: Vec<String>,
}

/// A loaded model: its hyperparameters, its weights by name, and its graph.
///
/// `build_graph` is a pure function of `params` (design invariant 2): equal params give
/// node-for-node identical graphs, so a cached graph may be reused.
pub trait ModelDef: Send + Sync {
    /// The `general.architecture` this model was loaded as.
    fn arch(&self) -> &'static str;

    /// Hyperparameters read from the file.
    fn hparams(&self) -> &HParams;

    /// The graph for `params` (validate them with [`crate::params::check`]; the params
    /// constructors in [`crate::params`] do). Its inputs are `token_ids`, `positions`,
    /// and `tail_ids` when `n_out < n_tokens`; its one output is `[n_vocab, n_out]` logits.
    fn build_graph(&self, params: &GraphParams) -> ComputeGraph;

    /// Every GGUF tensor the graph references, with type and GGUF shape, each once.
    fn weights(&self) -> Vec<WeightRef>;

    /// Names of every GGUF tensor the graph references, each once.
    fn weight_names(&self) -> Vec<String> {
        self.weights().into_iter().map(|w| w.name).collect()
    }

    /// Concatenated weights the decode fusions may reference (built by GPU backends).
    fn concat_weights(&self) -> Vec<ConcatWeight> {
        Vec::new()
    }

    /// Whether this is an encoder (BERT): bidirectional attention and no generation
    /// head. Its graph's output is every token's hidden state whatever
    /// `CParams::embeddings` says, it may have a `token_types` input (filled with 0), and
    /// a text must run whole in one step (its tokens read each other both ways).
    fn is_encoder(&self) -> bool {
        false
    }

    /// Values per output row of the model's rank (classifier) head when it has one: what
    /// a graph built with `CParams::rank` returns per row instead of a hidden row (a
    /// reranker's relevance logit first). `None`: no head, the model cannot rank.
    fn rank_width(&self) -> Option<usize> {
        None
    }

    /// Whether the lm head is the token embedding (`output.weight` absent).
    fn tied_output(&self) -> bool;

    /// Parameters one token's forward pass uses: every weight, a routed-expert tensor
    /// counted only for the experts a token uses. The total for a dense model.
    fn active_params(&self) -> u64 {
        self.weights()
            .iter()
            .map(|w| (w.shape[0] * w.shape[1]) as u64)
            .sum()
    }

    /// Transformer blocks.
    fn n_layer(&self) -> usize {
        self.hparams().n_layer
    }

    /// Key/value heads.
    fn n_head_kv(&self) -> usize {
        self.hparams().n_head_kv
    }

    /// Head dimension.
    fn n_embd_head(&self) -> usize {
        self.hparams().head_dim
    }

    /// Width of one KV row (`n_head_kv * head_dim`), the KV region's row stride.
    fn n_kv_embd(&self) -> usize {
        self.hparams().n_kv_embd()
    }

    /// Vocabulary rows of the logits.
    fn n_vocab(&self) -> usize {
        self.hparams().n_vocab
    }

    /// Training context length.
    fn n_ctx_train(&self) -> usize {
        self.hparams().n_ctx_train
    }

    /// Rope pairing.
    fn rope_style(&self) -> RopeStyle {
        self.hparams().rope_style
    }

    /// Each layer's sliding window in positions (`None`: a global layer). The graph rings
    /// the KV of windowed layers under `CParams::ring`, and the runtime's reuse rule
    /// follows from the windows.
    fn layer_windows(&self) -> Vec<Option<usize>> {
        vec![None; self.n_layer()]
    }

    /// Which layers carry recurrent state (one fixed-size state per sequence, updated
    /// in place by every token) instead of KV rows at positions. Such state cannot be
    /// rewound by moving a position: the runtime reuses it only as an exact
    /// continuation (see [`Self::is_recurrent`]).
    fn recurrent_layers(&self) -> Vec<bool> {
        vec![false; self.n_layer()]
    }

    /// Whether any layer is recurrent (a hybrid or recurrent model).
    fn is_recurrent(&self) -> bool {
        self.recurrent_layers().contains(&true)
    }

    /// The f32 values of one sequence's recurrent state, every recurrent layer's
    /// together (its conv window and delta-rule matrices): what a sequence holds besides
    /// KV rows, whatever its length. 0 for a model without recurrent layers.
    fn recurrent_state_floats(&self) -> usize {
        0
    }
}

/// A decoder-only model: the shared skeleton with an architecture's Q/K/V block.
pub(crate) struct Decoder {
    arch: &'static str,
    hp: HParams,
    w: Weights,
    qkv: QkvBlock,
    terms: Terms,
}

impl Decoder {
    /// Wraps validated hyperparameters and weights (the plain skeleton).
    pub fn new(arch: &'static str, hp: HParams, w: Weights, qkv: QkvBlock) -> Self {
        Decoder {
            arch,
            hp,
            w,
            qkv,
            terms: Terms::default(),
        }
    }

    /// The same model with the skeleton's optional `terms` on.
    pub fn with_terms(mut self, terms: Terms) -> Self {
        self.terms = terms;
        self
    }
}

impl ModelDef for Decoder {
    fn arch(&self) -> &'static str {
        self.arch
    }

    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build_graph(&self, params: &GraphParams) -> ComputeGraph {
        common::build(&self.hp, &self.w, &self.terms, params, self.qkv)
    }

    fn weights(&self) -> Vec<WeightRef> {
        self.w.all()
    }

    fn concat_weights(&self) -> Vec<ConcatWeight> {
        let mut out = Vec::new();
        for (il, l) in self.w.layers.iter().enumerate() {
            if l.qkv_concat_feasible() {
                out.push(ConcatWeight {
                    name: qkv_concat_name(il),
                    parts: vec![l.wq.name.clone(), l.wk.name.clone(), l.wv.name.clone()],
                });
            }
            // The fused FFN is SwiGLU only (see `common::build`).
            if let Some(d) = l.gate_up_concat() {
                if !self.terms.gelu && self.hp.n_ff <= FUSED_FFN_MAX_NF {
                    out.push(ConcatWeight {
                        name: gate_up_concat_name(il),
                        parts: vec![d.gate.name.clone(), d.up.name.clone()],
                    });
                }
            }
        }
        out
    }

    fn tied_output(&self) -> bool {
        self.w.tied
    }

    fn layer_windows(&self) -> Vec<Option<usize>> {
        (0..self.w.layers.len())
            .map(|il| self.terms.layer(il, &self.hp).window)
            .collect()
    }

    fn active_params(&self) -> u64 {
        let n = |w: &WeightRef| (w.shape[0] * w.shape[1]) as u64;
        let mut total: u64 = self.w.all().iter().map(n).sum();
        for l in &self.w.layers {
            if let Ffn::Moe(m) = &l.ffn {
                total -= m.all().into_iter().map(n).sum::<u64>();
                total += m.active_params();
            }
        }
        total
    }
}
