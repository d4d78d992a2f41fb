//! The minfer runtime: the engine that drives a model's graph through the reuse cache,
//! the sampler chain, stop strings, perplexity, the generation loop and conversations.

pub mod backends;
pub mod checkpoint;
pub mod constraint;
pub mod conversation;
pub mod digest;
pub mod embed;
pub mod engine;
pub mod generate;
pub mod history;
pub mod multi;
pub mod perplexity;
pub mod sampling;
pub mod session;
pub mod shift;
pub mod speculative;
pub mod stop;
pub mod swa;
#[doc(hidden)]
pub mod testing;
pub mod turn;

pub use checkpoint::{CheckpointStats, RecurrentSnapshot, SlotSnapshot};
pub use constraint::{
    CompiledGrammar, Constraint, ConstraintError, Grammar, GrammarVocab, Prefetch,
};
pub use conversation::Conversation;
pub use engine::{BackendInfo, Engine, EngineError, EngineOptions, TraceSink, TracedStep};
pub use generate::{
    generate, generate_reusing, generate_speculative, greedy_tokens, FinishReason, GenerateOptions,
    GenerationStats,
};
pub use history::{KvHistory, Reuse};
pub use minfer_graph::{BackendOptions, Fusions, GpuApi, KvType, SchedulerOptions};
pub use multi::{MultiEngine, SeqStep};
pub use perplexity::PplAccumulator;
pub use sampling::{Sampler, SamplerError, SamplingParams, LOGIT_BIAS_BAN, LOGIT_BIAS_MAX};
pub use session::SessionError;
pub use shift::{generate_shifting, generate_shifting_with, ShiftedGeneration};
pub use speculative::{
    DraftAsk, DraftModel, DraftSource, MultiDraft, NgramLookup, SpecStats, Speculator,
};
pub use stop::{StopEvent, StopScanner};
pub use turn::{ConversationError, ConversationOptions, OverflowPolicy, TurnStats};
