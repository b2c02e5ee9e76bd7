//! # deepinfer-engine
//!
//! DeepSeek V4.1 / V4 model graphs, the engine step loop and the CLI. Part of the deepinfer workspace; see the crate README.
#![doc = include_str!("../README.md")]

/// The crate's version, as packaged.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
