//! How to build an engine ([`EngineOptions`]) and the bounds the engine refuses
//! options outside of, by name.

use minfer_graph::{BackendOptions, KvType, SchedulerOptions};

use super::EngineError;

/// The largest [`EngineOptions::delta_chunk`]: a chunk's scratch grows with its square,
/// and chunks past 32 tokens were already slower than 16 (BENCHMARKS.md), so larger
/// values only guard against absurd ones.
pub const MAX_DELTA_CHUNK: usize = 256;

/// Most worker threads an engine accepts.
const MAX_THREADS: usize = 1024;

/// How to build an engine.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Worker threads of the CPU backend.
    pub n_threads: usize,
    /// Context length; `None` means the smaller of the model's and 4096.
    pub n_ctx: Option<usize>,
    /// Backend fence by name (`--backend`, or `MINFER_BACKENDS` as the caller resolved
    /// it), e.g. `cpu`; `None`: every compiled backend.
    pub backend: Option<String>,
    /// Largest prefill chunk, in tokens.
    pub n_batch: usize,
    /// Storage format of the K rows (`--cache-type-k`).
    pub cache_type_k: KvType,
    /// Storage format of the V rows (`--cache-type-v`).
    pub cache_type_v: KvType,
    /// Whether a [`crate::MultiEngine`] runs its slots' entries together in one graph
    /// execution (`MINFER_BATCH`, as the caller resolved it); results are the same either
    /// way.
    pub batching: bool,
    /// What the scheduler reports besides executing (per-op profile, split report).
    pub scheduler: SchedulerOptions,
    /// The backends' tuning knobs (fusions, repacking, graphics API, device graphs), as
    /// the caller resolved them; device graphs are left off while `scheduler` traces or
    /// profiles, which needs each launch on its own.
    pub backend_options: BackendOptions,
    /// Keep every row of sliding-window layers (`--swa-full`) instead of a ring of the
    /// window plus a step ([`crate::swa`]): more memory, and any prefix stays reusable.
    pub swa_full: bool,
    /// State checkpoints a sequence of a recurrent model keeps (`--ctx-checkpoints`, 0:
    /// none), so a reused prefix goes on from inside it ([`crate::checkpoint`]).
    pub ctx_checkpoints: usize,
    /// Tokens per chunk of the recurrent layers' chunked delta rule in prefill
    /// (`--delta-chunk`; 0: token by token, the default). Faster or not depending on the
    /// host (see BENCHMARKS.md), and equal to token-by-token decode up to rounding only,
    /// so a prefix reused from a checkpoint is no longer bit for bit a fresh prefill.
    pub delta_chunk: usize,
}

impl Default for EngineOptions {
    /// Physical cores, default context, no fence, 512-token prefill chunks, F32 KV,
    /// batching on, no profile or split report, the backends' default options,
    /// [`crate::checkpoint::DEFAULT_CTX_CHECKPOINTS`] state checkpoints.
    fn default() -> Self {
        EngineOptions {
            n_threads: minfer_cpu::threadpool::physical_cores(),
            n_ctx: None,
            backend: None,
            n_batch: 512,
            cache_type_k: KvType::F32,
            cache_type_v: KvType::F32,
            batching: true,
            scheduler: SchedulerOptions::default(),
            backend_options: BackendOptions::default(),
            swa_full: false,
            ctx_checkpoints: crate::checkpoint::DEFAULT_CTX_CHECKPOINTS,
            delta_chunk: 0,
        }
    }
}

impl EngineOptions {
    /// The options the backends are built with: [`Self::backend_options`], with device
    /// graphs off while the scheduler traces or profiles.
    pub fn backend_config_options(&self) -> BackendOptions {
        let mut o = self.backend_options;
        o.device_graphs &= !(self.scheduler.profile || self.scheduler.graph_trace);
        o
    }

    /// Refuses, by name, options no engine can run with: no or absurdly many threads, an
    /// empty prefill batch, a delta-rule chunk past [`MAX_DELTA_CHUNK`].
    pub(super) fn check(&self) -> Result<(), EngineError> {
        if self.n_threads == 0 || self.n_threads > MAX_THREADS {
            return Err(EngineError::Param {
                name: "threads (-t)",
                message: format!("{} is not in 1..={MAX_THREADS}", self.n_threads),
            });
        }
        if self.n_batch == 0 {
            return Err(EngineError::Param {
                name: "batch size",
                message: "must be at least 1".into(),
            });
        }
        if self.delta_chunk > MAX_DELTA_CHUNK {
            return Err(EngineError::Param {
                name: "delta chunk (--delta-chunk)",
                message: format!("{} is not in 0..={MAX_DELTA_CHUNK}", self.delta_chunk),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_graphs_stay_off_while_the_scheduler_traces_or_profiles() {
        let mut o = EngineOptions::default();
        assert!(o.backend_config_options().device_graphs);
        o.scheduler.profile = true;
        assert!(!o.backend_config_options().device_graphs);
        o.scheduler = SchedulerOptions {
            graph_trace: true,
            ..SchedulerOptions::default()
        };
        assert!(!o.backend_config_options().device_graphs);
        o.scheduler = SchedulerOptions::default();
        o.backend_options.device_graphs = false;
        assert!(!o.backend_config_options().device_graphs);
    }
}
