//! # deepinfer-spec
//!
//! Speculative-decoding verification budget planner. Part of the deepinfer workspace; see the crate README.
#![doc = include_str!("../README.md")]

mod acceptance;
mod calibration;
mod candidates;
mod error;
mod fixed;
mod median;
mod metrics;
mod outcome;
mod plan;
mod planner;
mod split;
mod step_time;
#[cfg(feature = "testing")]
pub mod testing;

pub use acceptance::{
    AcceptanceStats, PositionAcceptance, tokens_per_step_geometric, tokens_per_step_linear,
};
pub use calibration::{DEFAULT_BINS, PositionCalibration, TemperatureScaling, calibration_report};
pub use error::SpecError;
pub use fixed::fixed_length;
pub use median::RunningMedian;
pub use metrics::{auroc, brier, ece};
pub use outcome::Outcome;
pub use plan::{CurvePoint, Plan};
pub use planner::{Planner, PlannerConfig, Search};
pub use split::{SplitScratch, split, split_into};
pub use step_time::{DEFAULT_MIN_SAMPLES, DEFAULT_WINDOW, StepTimeModel, TableShape};

/// The crate's version, as packaged.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
