//! The CUDA backend (feature `cuda`): cudarc with the driver and NVRTC loaded at run time, so
//! it builds without a CUDA toolkit. Kernels (`kernels/*.cu`) are compiled by NVRTC for the
//! device's architecture at first use and cached per file.
//!
//! **Verified on SM90, compile-checked for SM100**: every kernel compiles for `sm_90a` and
//! `sm_100f` without errors or register spills (CI), and every operation matches the CPU
//! backend on an NVIDIA H200 (`sm_90a`, `tests/cuda_device.rs`, run by
//! `scripts/device-check.sh` on a device machine). The SM100-only paths (the 256-bit-load GEMV
//! of `kernels/gemv_wide.cu`) have not run on a device.
//!
//! `CudaBackend` exposes the operations as typed methods on device buffers (GEMV / GEMM
//! against f32, bf16, FP8 and FP4 weights, RMSNorm, softmax, embedding gather, RoPE, SwiGLU,
//! MoE routing, sink attention, indexer scores, top-k, compressor pooling, hyper-connection
//! mixes, grouped expert GEMM, paged block copy, quantise / dequantise, sampling), and
//! implements the [`crate::Backend`] trait on [`CudaTensor`]s in [`impl_backend`]: most trait
//! operations launch those kernels; the rest (some layout ops, hash routing, fake
//! quantisation, f16 weights, ..) round-trip through the host and the CPU backend, and that
//! module lists which.

/// Launches kernel `$entry` of the source file `$file` with launch configuration `$cfg` and
/// the kernel arguments in order (references to buffers and scalars); evaluates to
/// `Result<()>`. The launch is unsafe: every call site is preceded by a `// SAFETY:` comment
/// saying why the arguments match the kernel's parameters and the buffers are large enough
/// for `$cfg`.
macro_rules! launch {
    ($self:expr, $file:expr, $entry:expr, $cfg:expr, [$($arg:expr),* $(,)?]) => {{
        let entry: &str = $entry;
        let f = $self.function($file, entry)?;
        let mut b = $self.stream.launch_builder(&f);
        $( b.arg($arg); )*
        // SAFETY: the call site states that the arguments match `entry` and `$cfg`.
        unsafe { b.launch($cfg) }
            .map(|_| ())
            .map_err(|e| $crate::error::KernelError::Device(format!("launch {entry}: {e:?}")))
    }};
}

/// Launches the one-thread-per-element kernel `$entry` of `elementwise.cu` over `$n` outputs
/// into a new f32 buffer `$y`, with the argument list `$args` (which must mention `&mut $y`).
macro_rules! elementwise {
    ($self:ident, $entry:expr, $n:expr, $y:ident, [$($arg:expr),* $(,)?]) => {{
        let mut $y = $self.stream.alloc_zeros::<f32>($n).map_err(dev("alloc"))?;
        // SAFETY: each call site passes exactly the parameter list of `$entry` (see the
        // comment there), with buffers of `$n` elements; one thread per element.
        launch!($self, "elementwise", $entry, grid1($n), [$($arg),*])?;
        $y
    }};
}

pub mod impl_backend;
pub mod nvrtc;
mod ops;
mod paths;

pub use impl_backend::CudaTensor;
pub use ops::CudaQuant;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};

use crate::cuda_sources::KernelSource;
use crate::error::{KernelError, Result, invalid, shape_err};
use crate::sampling::SampleRow;

fn dev<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> KernelError + '_ {
    move |e| KernelError::Device(format!("{what}: {e:?}"))
}

/// One thread per element, blocks of 256.
fn grid1(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u64).div_ceil(256).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Checks the operands of `y[m, n] = x[m, k] · w[n, k]ᵀ`: `x_len == m * k`, `w_len == n * k`.
fn check_xw(
    op: &'static str,
    x_len: usize,
    w_len: usize,
    m: usize,
    n: usize,
    k: usize,
) -> Result<()> {
    if x_len != m * k || w_len != n * k {
        return Err(shape_err(
            op,
            format!("x {x_len} w {w_len} for {m}×{n}×{k}"),
        ));
    }
    Ok(())
}

/// NVRTC target for a compute capability: arch-specific features on Hopper (`sm_90a`) and the
/// Blackwell family (`sm_100f`), plain `sm_XY` elsewhere.
pub fn arch_for(major: i32, minor: i32) -> String {
    match (major, minor) {
        (9, 0) => "sm_90a".into(),
        (10, _) => "sm_100f".into(),
        _ => format!("sm_{major}{minor}"),
    }
}

/// A CUDA device with its default stream and compiled-kernel cache.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    cc: (i32, i32),
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// cuBLAS, created at the first GEMM; `None` inside when libcublas cannot be loaded.
    blas: std::sync::OnceLock<Option<cudarc::cublas::CudaBlas>>,
    /// Runs the trait operations that have no device kernel yet (see [`impl_backend`]).
    cpu: crate::cpu::CpuBackend,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("ordinal", &self.ctx.ordinal())
            .field("arch", &self.arch)
            .finish()
    }
}

impl CudaBackend {
    /// Opens device `ordinal`. Without a loadable `libcuda`, or when the driver reports no
    /// device, this returns [`KernelError::Device`] (cudarc would panic without the check).
    pub fn new(ordinal: usize) -> Result<Self> {
        // SAFETY: only probes whether the driver library can be dlopen'ed.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(KernelError::Device(
                "no CUDA driver: libcuda could not be loaded".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(dev("CUDA context"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(dev("compute capability"))?;
        let stream = ctx.default_stream();
        Ok(Self {
            ctx,
            stream,
            arch: arch_for(major, minor),
            cc: (major, minor),
            modules: Mutex::new(HashMap::new()),
            blas: std::sync::OnceLock::new(),
            cpu: crate::cpu::CpuBackend::new(),
        })
    }

    /// The NVRTC architecture kernels are compiled for.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The device's compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    fn function(&self, file: &'static str, entry: &str) -> Result<CudaFunction> {
        let mut cache = self
            .modules
            .lock()
            .map_err(|_| KernelError::Device("module cache poisoned".into()))?;
        let module = match cache.get(file) {
            Some(m) => m.clone(),
            None => {
                let src = KernelSource::find(file)
                    .ok_or_else(|| invalid("cuda", format!("no kernel file {file}")))?;
                if !nvrtc::nvrtc_present() {
                    return Err(KernelError::Device("libnvrtc could not be loaded".into()));
                }
                let c = nvrtc::compile(&src.full(), src.name, &self.arch)
                    .map_err(KernelError::Device)?;
                let m = self
                    .ctx
                    .load_module(cudarc::nvrtc::Ptx::from_binary(c.cubin))
                    .map_err(dev("load module"))?;
                cache.insert(file, m.clone());
                m
            }
        };
        module.load_function(entry).map_err(dev("load function"))
    }

    /// Waits for all work queued on the backend's stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(dev("synchronize"))
    }

    /// A device-to-device copy of `src` (for bandwidth baselines and scratch buffers).
    pub fn copy<T: cudarc::driver::DeviceRepr>(&self, src: &CudaSlice<T>) -> Result<CudaSlice<T>> {
        self.stream.clone_dtod(src).map_err(dev("copy"))
    }

    /// Copies `src` into the existing buffer `dst` on the device (no allocation; the two must
    /// have the same length).
    pub fn copy_into<T: cudarc::driver::DeviceRepr>(
        &self,
        src: &CudaSlice<T>,
        dst: &mut CudaSlice<T>,
    ) -> Result<()> {
        if src.len() != dst.len() {
            return Err(crate::error::invalid(
                "copy_into",
                format!("{} elements into a buffer of {}", src.len(), dst.len()),
            ));
        }
        self.stream.memcpy_dtod(src, dst).map_err(dev("copy_into"))
    }

    /// Copies host data to the device.
    pub fn upload<T: cudarc::driver::DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        self.stream.clone_htod(data).map_err(dev("upload"))
    }

    /// Copies device data to the host (synchronising the stream).
    pub fn download<T: cudarc::driver::DeviceRepr>(&self, data: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream.clone_dtoh(data).map_err(dev("download"))
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` with f32 weights (one warp per output).
    pub fn gemv_f32(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<CudaSlice<f32>> {
        if self.wide_gemv(k, 8) {
            return self.gemv("gemv_wide", "gemv_wide_f32", x, w, m, n, k);
        }
        self.gemv("gemv", "gemv_f32", x, w, m, n, k)
    }

    /// As [`CudaBackend::gemv_f32`] with bf16 weights (raw `u16` bits).
    pub fn gemv_bf16(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<u16>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<CudaSlice<f32>> {
        if self.wide_gemv(k, 16) {
            return self.gemv("gemv_wide", "gemv_wide_bf16", x, w, m, n, k);
        }
        self.gemv("gemv", "gemv_bf16", x, w, m, n, k)
    }

    /// Whether GEMV uses the Blackwell kernels of `gemv_wide.cu` (256-bit loads): compute
    /// capability 10.x and rows a whole number of 32-byte loads (`k % per_load == 0`).
    /// Elsewhere the portable `gemv.cu` kernels run.
    pub fn wide_gemv(&self, k: usize, per_load: usize) -> bool {
        self.cc.0 == 10 && k.is_multiple_of(per_load)
    }

    #[allow(clippy::too_many_arguments)]
    fn gemv<W>(
        &self,
        file: &'static str,
        entry: &str,
        x: &CudaSlice<f32>,
        w: &CudaSlice<W>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<CudaSlice<f32>> {
        check_xw("gemv", x.len(), w.len(), m, n, k)?;
        let mut y = self
            .stream
            .alloc_zeros::<f32>(m * n)
            .map_err(dev("alloc"))?;
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        let cfg = LaunchConfig {
            grid_dim: ((n as u32).div_ceil(8), m as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the argument list matches the kernel signature (x, w, y, m, n, k) and the
        // buffers hold m*k, n*k and m*n elements as checked above.
        launch!(self, file, entry, cfg, [x, w, &mut y, &mi, &ni, &ki])?;
        Ok(y)
    }

    /// RMSNorm over rows of length `d` (`w` of length `d`).
    pub fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        d: usize,
        eps: f32,
    ) -> Result<CudaSlice<f32>> {
        if d == 0 || !x.len().is_multiple_of(d) || w.len() != d {
            return Err(shape_err(
                "rms_norm",
                format!("x {} w {} d {d}", x.len(), w.len()),
            ));
        }
        let mut y = self
            .stream
            .alloc_zeros::<f32>(x.len())
            .map_err(dev("alloc"))?;
        let di = d as i32;
        let cfg = LaunchConfig {
            grid_dim: ((x.len() / d) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 256 * 4,
        };
        // SAFETY: (x, w, y, d, eps) matches `rms_norm`; 256 threads with 256 floats of shared
        // memory for the block reduction.
        launch!(self, "norm", "rms_norm", cfg, [x, w, &mut y, &di, &eps])?;
        Ok(y)
    }

    /// One token per row of `logits[rows, vocab]` with the contract of [`crate::sampling`].
    pub fn sample(
        &self,
        logits: &CudaSlice<f32>,
        vocab: usize,
        rows: &[SampleRow],
    ) -> Result<Vec<i32>> {
        if vocab == 0 || logits.len() != vocab * rows.len() {
            return Err(shape_err(
                "sample",
                format!("{} logits for {} rows", logits.len(), rows.len()),
            ));
        }
        let seeds = self.upload(&rows.iter().map(|r| r.seed).collect::<Vec<u64>>())?;
        let pos = self.upload(&rows.iter().map(|r| r.position).collect::<Vec<u64>>())?;
        let temps = self.upload(&rows.iter().map(|r| r.temperature).collect::<Vec<f32>>())?;
        let mut out = self
            .stream
            .alloc_zeros::<i32>(rows.len())
            .map_err(dev("alloc"))?;
        let vi = vocab as i32;
        let cfg = LaunchConfig {
            grid_dim: (rows.len() as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: (logits, seeds, positions, temps, out, vocab) matches `sample_rows`, one
        // block of 256 threads per row (the kernel's static shared memory is sized for 256).
        launch!(
            self,
            "sample",
            "sample_rows",
            cfg,
            [logits, &seeds, &pos, &temps, &mut out, &vi]
        )?;
        self.download(&out)
    }
}
