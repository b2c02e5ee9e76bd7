//! Errors of the scheduler core.

use deepinfer_kv::KvError;
use deepinfer_spec::SpecError;
use thiserror::Error;

use crate::cost_model::CostModelError;
use crate::request::RequestId;

/// Errors from [`crate::Scheduler`].
#[derive(Debug, Error, Clone, PartialEq)]
pub enum SchedError {
    /// A budget or limit of the configuration is zero.
    #[error("{0} must be positive")]
    ZeroBudget(&'static str),
    /// Any other bad configuration.
    #[error("invalid scheduler configuration: {0}")]
    InvalidConfig(String),
    /// A request id already known to the scheduler.
    #[error("duplicate request id {0}")]
    DuplicateRequest(RequestId),
    /// A request with an empty prompt.
    #[error("request {0} has an empty prompt")]
    EmptyPrompt(RequestId),
    /// The prompt does not fit the model's context.
    #[error("request {id}: prompt of {len} tokens exceeds the context limit of {limit}")]
    PromptTooLong {
        /// Request.
        id: RequestId,
        /// Prompt length.
        len: usize,
        /// `max_model_len`.
        limit: usize,
    },
    /// The prompt cannot fit the whole KV pool even with nothing else running.
    #[error("request {id}: prompt of {len} tokens exceeds the KV pool of {pool_tokens} tokens")]
    PromptExceedsPool {
        /// Request.
        id: RequestId,
        /// Prompt length.
        len: usize,
        /// Tokens the pool holds.
        pool_tokens: usize,
    },
    /// A request id the scheduler does not track (or no longer tracks).
    #[error("unknown request {0}")]
    UnknownRequest(RequestId),
    /// `update` was called with no step in flight.
    #[error("no step in flight")]
    NoStepInFlight,
    /// `schedule` was called with three steps already in flight.
    #[error("three steps already in flight; call update first")]
    TooManyInFlight,
    /// The output given to `update` does not match the oldest step in flight.
    #[error("step output mismatch: {0}")]
    OutputMismatch(String),
    /// From the block manager.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// From the draft planner.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// From the cost model.
    #[error(transparent)]
    Cost(#[from] CostModelError),
}
