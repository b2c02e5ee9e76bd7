//! # deepinfer-sched
//!
//! Continuous-batching scheduler. Part of the deepinfer workspace; see the crate README.
#![doc = include_str!("../README.md")]

pub mod cost_model;
pub mod eplb;
mod error;
mod request;
pub mod router;
mod scheduler;
#[cfg(feature = "testing")]
pub mod testing;

pub use cost_model::{
    CoefficientBounds, CostCoefficients, CostModelError, PrefillCostModel, StepFeatures, StepSample,
};
pub use eplb::{
    EplbConfig, EplbError, ExpertLoad, MoeLb, Placement, rebalance, rebalance_incremental,
};
pub use error::SchedError;
pub use request::{
    DecodeRow, FinishReason, Finished, NewRequest, PlanFix, PrefillChunk, RequestId, RowOutput,
    StepOutput, StepPlan, UpdateResult,
};
pub use router::{CacheEvent, PrefillRoute, Router, RouterConfig, RouterError};
pub use scheduler::{PLACEHOLDER_TOKEN, SchedStats, Scheduler, SchedulerConfig, SpecMode};

/// The crate's version, as packaged.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
