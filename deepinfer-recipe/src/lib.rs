//! # deepinfer-recipe
//!
//! Prompt rendering, API protocols, streaming output parsing and structured outputs. Part of the deepinfer workspace; see the crate README.
#![doc = include_str!("../README.md")]

/// The crate's version, as packaged.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
