//! # deepinfer-engine
//!
//! DeepSeek V4.1 / V4 model graphs, the engine step loop and the CLI. Part of the deepinfer workspace; see the crate README.
#![doc = include_str!("../README.md")]

pub mod checkpoint;
#[cfg(feature = "cli")]
pub mod cli;
pub mod config;
pub mod engram;
pub mod model;
pub mod names;
pub mod plan;
pub mod quant;
#[cfg(feature = "runtime")]
pub mod runtime;
#[cfg(feature = "server")]
pub mod server;
mod splitmix;
pub mod weights;

pub use config::{ModelConfig, ModelKind};
pub use model::{BatchItem, Draft, Logits, Model, ModelError, SeqState, StateFormatError, Trace};

/// The crate's version, as packaged.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
