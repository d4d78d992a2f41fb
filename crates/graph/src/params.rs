//! Graph parameters (§3.7): the entire reuse identity (invariant 2). Positions and
//! `n_past` are deliberately absent — they are data (invariant 1).
/// Whether the graph processes a prompt or one decode step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GraphType {
    /// One (or a few) tokens per step against the KV cache.
    Decode,
    /// A prompt chunk.
    Prefill,
}

impl GraphType {
    /// Lower-case name used by the JSON export.
    pub fn name(self) -> &'static str {
        match self {
            GraphType::Decode => "decode",
            GraphType::Prefill => "prefill",
        }
    }
}

/// Context parameters that shape the topology.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CParams {
    /// KV region length in rows.
    pub n_ctx: usize,
    /// Attention mode Flash instead of Gqa.
    pub flash_attn: bool,
    /// A GPU backend participates (assignment is topology).
    pub gpu: bool,
    /// Decode QKV fusion enabled.
    pub fuse_qkv: bool,
    /// Decode FFN fusion enabled.
    pub fuse_ffn: bool,
    /// Attention nodes take an explicit span input.
    pub explicit_span: bool,
    /// Sliding-window layers keep a KV ring ([`crate::KvRing`]) sized from these;
    /// `None`: every layer keeps `n_ctx` rows.
    pub ring: Option<crate::RingParams>,
    /// The graph returns the final-normed hidden rows (what embeddings pool) instead of
    /// the logits.
    pub embeddings: bool,
    /// The graph ends in the model's rank (classifier) head: each output row becomes
    /// its `n_cls_out` scores instead of a hidden row (only an encoder with a head
    /// honours it; the runtime sets it only for such a model).
    pub rank: bool,
    /// Recurrent state slots of a model with recurrent layers (sequences that may run
    /// at once: 1 for one sequence, the slot count of a batched engine); each token's
    /// slot is data (the `state_slots` input), the count sizes the state regions.
    pub state_slots: usize,
    /// Tokens per chunk of the recurrent layers' chunked DeltaNet form (0: token by
    /// token; see [`crate::RecurrentMeta::chunk`]).
    pub delta_chunk: usize,
}

/// The topology flags of [`CParams`] that follow from the participating backends
/// (design §5.3): never set by hand. With a GPU backend participating, the decode fusions
/// are the ones a GPU backend claims (the host's claims are ignored, so no fused node
/// pulls decode work off the device); with none, the ones the host backends claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BackendCaps {
    /// A GPU backend participates.
    pub gpu: bool,
    /// A participating backend executes the decode QKV fusions (see above which).
    pub fuse_qkv: bool,
    /// A participating backend executes the decode FFN fusion (see above which).
    pub fuse_ffn: bool,
}

impl BackendCaps {
    /// The flags of `backends`: each fusion needs a backend of the deciding kind (GPU when
    /// one participates, host otherwise) that claims it.
    pub fn of<'a>(backends: impl IntoIterator<Item = &'a dyn crate::BackendImpl>) -> Self {
        let mut device = BackendCaps {
            gpu: true,
            ..BackendCaps::default()
        };
        let mut host = BackendCaps::default();
        let mut any_gpu = false;
        for b in backends {
            let caps = if b.is_gpu() {
                any_gpu = true;
                &mut device
            } else {
                &mut host
            };
            caps.fuse_qkv |= b.supports_fused(crate::FusedOp::DecodeQkv);
            caps.fuse_ffn |= b.supports_fused(crate::FusedOp::DecodeFfn);
        }
        if any_gpu {
            device
        } else {
            host
        }
    }

    /// Writes these flags into `cp`.
    pub fn apply(self, cp: &mut CParams) {
        cp.gpu = self.gpu;
        cp.fuse_qkv = self.fuse_qkv;
        cp.fuse_ffn = self.fuse_ffn;
    }
}

/// Everything the builder's output depends on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GraphParams {
    /// Tokens per step.
    pub n_tokens: usize,
    /// Output rows (tail rows, G3); part of the topology.
    pub n_out: usize,
    /// Prefill or decode.
    pub gtype: GraphType,
    /// Context parameters.
    pub cparams: CParams,
    /// Bumped when weights change (reload, adapters); 1 until then.
    pub weights_version: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::RefBackend;
    use crate::BackendImpl;

    #[test]
    fn flags_follow_the_backends_capabilities() {
        let cpu = RefBackend::cpu();
        let dev = RefBackend::test_device();
        let as_dyn = |v: &[&dyn BackendImpl]| BackendCaps::of(v.iter().copied());
        // No GPU: the host backends' claims decide (the reference backends claim the
        // FFN fusion only), and a host that claims none gets none.
        assert_eq!(
            as_dyn(&[&cpu, &dev]),
            BackendCaps {
                gpu: false,
                fuse_qkv: false,
                fuse_ffn: true
            }
        );
        let plain = RefBackend::cpu().with_fusion(false);
        assert_eq!(as_dyn(&[&plain]), BackendCaps::default());
        // With a GPU, the host's claims are ignored.
        let gpu_plain = RefBackend::test_device().as_gpu(true).with_fusion(false);
        let caps = as_dyn(&[&cpu, &gpu_plain]);
        assert!(caps.gpu && !caps.fuse_ffn && !caps.fuse_qkv);
        let gpu = RefBackend::test_device().as_gpu(true);
        assert_eq!(
            as_dyn(&[&cpu, &gpu]),
            BackendCaps {
                gpu: true,
                fuse_qkv: false,
                fuse_ffn: true
            }
        );
        let plain_gpu = RefBackend::test_device().as_gpu(true).with_fusion(false);
        let caps = as_dyn(&[&cpu, &plain_gpu]);
        assert!(caps.gpu && !caps.fuse_ffn && !caps.fuse_qkv);
        let mut cp = CParams {
            n_ctx: 8,
            flash_attn: false,
            gpu: false,
            fuse_qkv: false,
            fuse_ffn: false,
            explicit_span: true,
            ring: None,
            embeddings: false,
            rank: false,
            state_slots: 1,
            delta_chunk: 0,
        };
        caps.apply(&mut cp);
        assert!(cp.gpu && !cp.fuse_ffn && cp.explicit_span);
    }
}
