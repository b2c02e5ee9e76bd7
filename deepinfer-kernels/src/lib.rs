//! # deepinfer-kernels
//!
//! Compute backend: the Backend trait, CPU reference kernels, CUDA kernels. Part of the deepinfer workspace; see the crate README.
#![doc = include_str!("../README.md")]

/// The crate's version, as packaged.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
