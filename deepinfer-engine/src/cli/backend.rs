//! `--backend cpu|cuda`: which compute backend a subcommand runs on.

use deepinfer_kernels::CpuConfig;

/// `--backend` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// The CPU reference kernels.
    Cpu,
    /// The CUDA kernels on GPU 0 (a build with the `cuda` feature; the CUDA driver and
    /// libnvrtc at run time).
    Cuda,
}

/// The CUDA backend on GPU 0. `cpu` configures its host path (operations without a device
/// kernel) and, when batch-invariant, keeps every `matmul` on the fixed-order GEMV kernels
/// instead of cuBLAS.
#[cfg(feature = "cuda")]
pub fn cuda(
    cpu: CpuConfig,
) -> Result<deepinfer_kernels::cuda::CudaBackend, Box<dyn std::error::Error + Send + Sync>> {
    Ok(deepinfer_kernels::cuda::CudaBackend::with_cpu_config(
        0, cpu,
    )?)
}

/// Without the `cuda` feature: one readable error.
#[cfg(not(feature = "cuda"))]
pub fn cuda(cpu: CpuConfig) -> Result<NoCuda, Box<dyn std::error::Error + Send + Sync>> {
    let _ = cpu;
    Err("--backend cuda: this deepinfer was built without the `cuda` feature (cargo build --release -p deepinfer-engine --features cuda)".into())
}

/// Stands in for the CUDA backend's type in builds without the `cuda` feature (never made).
#[cfg(not(feature = "cuda"))]
pub type NoCuda = deepinfer_kernels::CpuBackend;
