//! The CPU backend: the reference implementation of every operation, multi-threaded with rayon.

mod attention;
mod buf;
mod experts;
pub mod gemm;
mod gemm_tiled;
mod hc;
mod impl_backend;
mod layout;
mod moe;
mod rows;
mod tensor;

use std::sync::Arc;

pub use tensor::CpuTensor;

use crate::error::{KernelError, Result};

/// Options of the CPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuConfig {
    /// Batch-invariant mode: every GEMM uses the fixed-order dot path, so a row's output is
    /// bit-identical whatever else is in the batch and whatever the thread count. All other
    /// CPU ops are row-local with a fixed order in both modes.
    pub batch_invariant: bool,
    /// Worker threads; `None` uses rayon's global pool.
    pub threads: Option<usize>,
}

/// The CPU backend (f32 compute; bf16 / f16 / FP8 / FP4 weights decoded on the fly).
#[derive(Debug, Clone)]
pub struct CpuBackend {
    config: CpuConfig,
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// Default options: fast mode, rayon's global pool.
    pub fn new() -> Self {
        Self {
            config: CpuConfig::default(),
            pool: None,
        }
    }

    /// A backend with explicit options (builds its own thread pool if `threads` is set).
    pub fn with_config(config: CpuConfig) -> Result<Self> {
        let pool = match config.threads {
            Some(n) => Some(Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n.max(1))
                    .build()
                    .map_err(|e| KernelError::Device(format!("thread pool: {e}")))?,
            )),
            None => None,
        };
        Ok(Self { config, pool })
    }

    /// A batch-invariant backend on rayon's global pool.
    pub fn batch_invariant() -> Self {
        Self {
            config: CpuConfig {
                batch_invariant: true,
                threads: None,
            },
            pool: None,
        }
    }

    /// The options in force.
    pub fn config(&self) -> CpuConfig {
        self.config
    }

    /// Runs `f` on this backend's pool.
    pub(crate) fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }
}
