//! The engine runtime: the step loop that composes `deepinfer-sched` (with `deepinfer-kv`),
//! the model graphs, `deepinfer-sample` and `deepinfer-recipe`; the offline API
//! ([`Engine::generate`], [`Engine::generate_stream`] with per-request abort); the OpenAI
//! chat and Batch API layers; and the embedded default model.

pub mod batch;
pub mod bench;
pub mod chat;
pub mod default_model;
mod device;
pub mod draft_calibration;
pub mod engine;
mod eplb;
pub mod expert_load;
pub mod online;
mod prefix_cache;
pub mod request;

pub use batch::{BatchSummary, SAMPLE_BATCH, run_batch};
pub use chat::{ChatError, ChatFrontend, PreparedChat};
pub use default_model::{default_model_dir, load_default, materialize_default};
pub use engine::{
    DRAFT_POSITIONS, Engine, EngineConfig, EngineError, KvCacheMemory, KvPool, Metrics,
    STEP_HISTORY, SpecBudget, StepRecord, StepTimes, StreamEvent, available_host_memory,
    default_block_size,
};
pub use expert_load::{EplbReport, eplb_report};
pub use online::{EventSink, OnlineEngine, OnlineStats, SubmitError};
pub use request::{
    FinishReason, GenParams, GrammarConstraint, Output, Request, RequestId, Timing, TokenLogprob,
    ToolCallOut, Usage,
};
