#![doc = include_str!("../README.md")]

pub mod backend;
pub mod bandwidth;
pub mod comm;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod cuda_sources;
pub mod dtype;
pub mod error;
pub mod quant;
pub mod rope;
pub mod sampling;

pub use backend::{
    Backend, ExpertWeights, HcMixes, RouteParams, RouteScore, SharedBytes, TensorInfo, Unary,
};
pub use comm::{CommError, Communicator, DispatchPlan, LocalComm, LocalGroup, combine, dispatch};
pub use cpu::{CpuBackend, CpuConfig, CpuTensor};
pub use dtype::DType;
pub use error::{KernelError, Result};
pub use quant::{FakeQuant, QuantFormat, QuantMatrix, ScaleFormat};
pub use rope::{RopeParams, YarnParams};
pub use sampling::SampleRow;

/// The crate's version, as packaged.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
