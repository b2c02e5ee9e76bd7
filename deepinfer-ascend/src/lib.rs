//! # deepinfer-ascend
//!
//! Ascend NPU decode kernels: tiling planner, Ascend C sources, source lint, CPU emulator of the
//! tiled algorithms, and a host runtime that loads AscendCL at run time.
#![doc = include_str!("../README.md")]

pub mod backend;
pub mod chip;
pub mod emu;
pub mod error;
pub mod kernels;
pub mod lint;
pub mod mx;
pub mod runner;
pub mod runtime;
pub mod tiling;

pub use backend::{ASCEND_OPS, AscendBackend, AscendTensor};
pub use chip::{Chip, ChipSpec};
pub use error::{AscendError, Result};
pub use runner::{KernelRunner, Mode};

/// The crate's version, as packaged.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
