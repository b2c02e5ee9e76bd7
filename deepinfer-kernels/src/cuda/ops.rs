//! `CudaBackend` operations beyond the decode hot path: quantised weights, GEMM (cuBLAS, or
//! the portable tiled kernel), embedding gather, RoPE, SwiGLU, MoE routing, sink attention,
//! paged block copy, quantise / dequantise. Thin launch wrappers: shapes are checked here,
//! the arithmetic is in `kernels/*.cu`. Checked against the CPU backend on an H200 (see the
//! module docs of [`super`]).

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys as blas_sys};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::{CudaBackend, check_xw, dev, grid1};
use crate::backend::{RouteParams, RouteScore};
use crate::error::{Result, invalid, shape_err};
use crate::quant::{QuantFormat, QuantMatrix};

fn i32_of(op: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| invalid(op, format!("{v} exceeds i32")))
}

/// A quantised weight on the device: packed codes plus block scales (FP8 scales decoded to
/// f32 on upload, exactly; FP4 scales as raw bytes).
pub struct CudaQuant {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    data: CudaSlice<u8>,
    scales_f32: Option<CudaSlice<f32>>,
    scale_bytes: Option<CudaSlice<u8>>,
    tensor_scale: f32,
}

impl std::fmt::Debug for CudaQuant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaQuant")
            .field("format", &self.format)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish()
    }
}

impl CudaQuant {
    /// The format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }
    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }
}

impl CudaBackend {
    fn alloc<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>> {
        self.stream.alloc_zeros::<T>(n.max(1)).map_err(dev("alloc"))
    }

    // ---- quantised weights -----------------------------------------------------------------

    /// Uploads a quantised matrix.
    pub fn upload_quant(&self, q: &QuantMatrix) -> Result<CudaQuant> {
        let (scales_f32, scale_bytes) = match q.format() {
            QuantFormat::Fp8 { .. } => (Some(self.upload(&q.decoded_scales())?), None),
            _ => {
                let b = q
                    .scale_bytes()
                    .ok_or_else(|| invalid("upload_quant", "FP4 without scale bytes"))?;
                (None, Some(self.upload(b)?))
            }
        };
        Ok(CudaQuant {
            format: q.format(),
            rows: q.rows(),
            cols: q.cols(),
            data: self.upload(q.data())?,
            scales_f32,
            scale_bytes,
            tensor_scale: q.tensor_scale(),
        })
    }

    /// Dequantises to a row-major f32 matrix, bit-identical to [`QuantMatrix::dequantize`].
    pub fn dequantize(&self, q: &CudaQuant) -> Result<CudaSlice<f32>> {
        const OP: &str = "dequantize";
        let n = q.rows * q.cols;
        let mut y = self.alloc::<f32>(n)?;
        match q.format {
            QuantFormat::Fp8 {
                block_rows,
                block_cols,
                ..
            } => {
                let s = q
                    .scales_f32
                    .as_ref()
                    .ok_or_else(|| invalid(OP, "no scales"))?;
                let (r, c) = (i32_of(OP, q.rows)?, i32_of(OP, q.cols)?);
                let (br, bc) = (i32_of(OP, block_rows)?, i32_of(OP, block_cols)?);
                // SAFETY: (q, scales, y, rows, cols, block_rows, block_cols) matches
                // `dequantize_fp8`; q and y hold rows*cols elements, scales one per tile.
                launch!(
                    self,
                    "quant",
                    "dequantize_fp8",
                    grid1(n),
                    [&q.data, s, &mut y, &r, &c, &br, &bc]
                )?;
            }
            _ => {
                let s = q
                    .scale_bytes
                    .as_ref()
                    .ok_or_else(|| invalid(OP, "no scales"))?;
                let bytes = (n / 2) as u64;
                let nv = i32::from(q.format == QuantFormat::Nvfp4);
                // SAFETY: (q, scales, y, bytes, nvfp4, tensor_scale) matches `dequantize_fp4`;
                // q holds n/2 bytes, y n floats, scales one byte per 16 or 32 values.
                launch!(
                    self,
                    "quant",
                    "dequantize_fp4",
                    grid1(n / 2),
                    [&q.data, s, &mut y, &bytes, &nv, &q.tensor_scale]
                )?;
            }
        }
        Ok(y)
    }

    /// `y[m, n] = x[m, k] · Wᵀ` against a quantised `W[n, k]` (one warp per output; FP8 and
    /// FP4 values decoded in registers).
    pub fn gemv_quant(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaQuant,
        m: usize,
    ) -> Result<CudaSlice<f32>> {
        const OP: &str = "gemv_quant";
        let (n, k) = (w.rows, w.cols);
        if x.len() != m * k {
            return Err(shape_err(OP, format!("x {} for m {m} k {k}", x.len())));
        }
        let mut y = self.alloc::<f32>(m * n)?;
        let (mi, ni, ki) = (i32_of(OP, m)?, i32_of(OP, n)?, i32_of(OP, k)?);
        let cfg = LaunchConfig {
            grid_dim: ((n as u32).div_ceil(8), m as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        match w.format {
            QuantFormat::Fp8 {
                block_rows,
                block_cols,
                ..
            } => {
                let s = w
                    .scales_f32
                    .as_ref()
                    .ok_or_else(|| invalid(OP, "no scales"))?;
                let (br, bc) = (i32_of(OP, block_rows)?, i32_of(OP, block_cols)?);
                // SAFETY: the arguments match `gemv_fp8`; x is m*k, w n*k bytes, y m*n.
                launch!(
                    self,
                    "gemv",
                    "gemv_fp8",
                    cfg,
                    [x, &w.data, s, &mut y, &mi, &ni, &ki, &br, &bc]
                )?;
            }
            _ => {
                let s = w
                    .scale_bytes
                    .as_ref()
                    .ok_or_else(|| invalid(OP, "no scales"))?;
                let nv = i32::from(w.format == QuantFormat::Nvfp4);
                // SAFETY: the arguments match `gemv_fp4`; x is m*k, w n*k/2 bytes, y m*n.
                launch!(
                    self,
                    "gemv",
                    "gemv_fp4",
                    cfg,
                    [x, &w.data, s, &mut y, &mi, &ni, &ki, &nv, &w.tensor_scale]
                )?;
            }
        }
        Ok(y)
    }

    /// MXFP4-quantises `x[rows, cols]` (`cols % 32 == 0`): `(packed codes, UE8M0 scales)`,
    /// bit-identical to [`QuantMatrix::quantize`] with [`QuantFormat::Mxfp4`].
    pub fn quantize_mxfp4(
        &self,
        x: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<(CudaSlice<u8>, CudaSlice<u8>)> {
        self.quantize_32("quantize_mxfp4", x, rows, cols, 2)
    }

    /// FP8-quantises `x[rows, cols]` with 1×32 blocks and UE8M0 scales (`cols % 32 == 0`):
    /// `(e4m3 codes, scales)`, bit-identical to [`QuantMatrix::quantize`] with that format.
    pub fn quantize_fp8_ue8m0(
        &self,
        x: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<(CudaSlice<u8>, CudaSlice<u8>)> {
        self.quantize_32("quantize_fp8_ue8m0", x, rows, cols, 1)
    }

    fn quantize_32(
        &self,
        entry: &'static str,
        x: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        per_byte: usize,
    ) -> Result<(CudaSlice<u8>, CudaSlice<u8>)> {
        let n = rows * cols;
        if x.len() != n || !cols.is_multiple_of(32) {
            return Err(shape_err(
                entry,
                format!("{} values for [{rows}, {cols}]", x.len()),
            ));
        }
        let blocks = (n / 32) as u64;
        let mut q = self.alloc::<u8>(n / per_byte)?;
        let mut s = self.alloc::<u8>(n / 32)?;
        // SAFETY: (x, q, scales, blocks) matches the kernel; one warp per 32-value block,
        // q holds n / per_byte bytes and scales one byte per block.
        launch!(self, "quant", entry, grid1(n), [x, &mut q, &mut s, &blocks])?;
        Ok((q, s))
    }

    // ---- GEMM ------------------------------------------------------------------------------

    fn blas(&self) -> Option<&CudaBlas> {
        self.blas
            .get_or_init(|| {
                // SAFETY: only probes whether libcublas can be dlopen'ed.
                if !unsafe { blas_sys::is_culib_present() } {
                    return None;
                }
                CudaBlas::new(self.stream.clone()).ok()
            })
            .as_ref()
    }

    /// Whether cuBLAS could be loaded (GEMMs use it when it can).
    pub fn has_cublas(&self) -> bool {
        self.blas().is_some()
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` in f32: cuBLAS `sgemm` when libcublas loads (it picks
    /// its own SM90 / SM100 kernels), else the portable tiled kernel of `gemm.cu`.
    pub fn gemm_f32(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<CudaSlice<f32>> {
        const OP: &str = "gemm_f32";
        check_xw(OP, x.len(), w.len(), m, n, k)?;
        let Some(blas) = self.blas() else {
            return self.gemm_f32_portable(x, w, m, n, k);
        };
        let mut y = self.alloc::<f32>(m * n)?;
        // Row-major y = x·wᵀ is column-major yᵀ = w·xᵀ: A = w (k×n column-major, transposed),
        // B = x (k×m column-major), C = yᵀ (n×m column-major).
        let cfg = GemmConfig {
            transa: blas_sys::cublasOperation_t::CUBLAS_OP_T,
            transb: blas_sys::cublasOperation_t::CUBLAS_OP_N,
            m: i32_of(OP, n)?,
            n: i32_of(OP, m)?,
            k: i32_of(OP, k)?,
            alpha: 1.0f32,
            lda: i32_of(OP, k)?,
            ldb: i32_of(OP, k)?,
            beta: 0.0f32,
            ldc: i32_of(OP, n)?,
        };
        // SAFETY: the dimensions and leading dimensions describe exactly the x, w and y
        // buffers (m*k, n*k, m*n elements, checked above).
        unsafe { blas.gemm(cfg, w, x, &mut y) }.map_err(dev("cublas sgemm"))?;
        Ok(y)
    }

    /// The portable tiled f32 GEMM (`gemm_f32_tn`, 64×64 tiles; no tensor cores).
    pub fn gemm_f32_portable(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<CudaSlice<f32>> {
        const OP: &str = "gemm_f32_portable";
        check_xw(OP, x.len(), w.len(), m, n, k)?;
        let mut y = self.alloc::<f32>(m * n)?;
        let (mi, ni, ki) = (i32_of(OP, m)?, i32_of(OP, n)?, i32_of(OP, k)?);
        let cfg = LaunchConfig {
            grid_dim: ((n as u32).div_ceil(64), (m as u32).div_ceil(64), 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: (a, b, c, m, n, k) matches `gemm_f32_tn`; 256 threads per 64×64 tile.
        launch!(
            self,
            "gemm",
            "gemm_f32_tn",
            cfg,
            [x, w, &mut y, &mi, &ni, &ki]
        )?;
        Ok(y)
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` with bf16 weights (raw bits): cuBLAS `GemmEx` with the
    /// activations rounded to bf16 (round to nearest even) and f32 accumulation and output;
    /// without cuBLAS, the GEMV kernel (f32 activations, one warp per output).
    pub fn gemm_bf16(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<u16>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<CudaSlice<f32>> {
        const OP: &str = "gemm_bf16";
        check_xw(OP, x.len(), w.len(), m, n, k)?;
        let Some(blas) = self.blas() else {
            return self.gemv_bf16(x, w, m, n, k);
        };
        let xb = self.to_bf16(x)?;
        let mut y = self.alloc::<f32>(m * n)?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (mi, ni, ki) = (i32_of(OP, m)?, i32_of(OP, n)?, i32_of(OP, k)?);
        {
            let (wp, _rw) = w.device_ptr(&self.stream);
            let (xp, _rx) = xb.device_ptr(&self.stream);
            let (yp, _ry) = y.device_ptr_mut(&self.stream);
            // SAFETY: same layout as `gemm_f32` (A = w transposed, B = x, C = yᵀ), bf16
            // inputs, f32 output and compute; the pointers stay valid while the records live.
            unsafe {
                cudarc::cublas::result::gemm_ex(
                    *blas.handle(),
                    blas_sys::cublasOperation_t::CUBLAS_OP_T,
                    blas_sys::cublasOperation_t::CUBLAS_OP_N,
                    ni,
                    mi,
                    ki,
                    (&alpha) as *const f32 as *const _,
                    wp as *const _,
                    blas_sys::cudaDataType_t::CUDA_R_16BF,
                    ki,
                    xp as *const _,
                    blas_sys::cudaDataType_t::CUDA_R_16BF,
                    ki,
                    (&beta) as *const f32 as *const _,
                    yp as *mut _,
                    blas_sys::cudaDataType_t::CUDA_R_32F,
                    ni,
                    blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(dev("cublas gemm_ex bf16"))?;
        }
        Ok(y)
    }

    /// f32 → bf16 bits (round to nearest even, NaN kept quiet).
    pub fn to_bf16(&self, x: &CudaSlice<f32>) -> Result<CudaSlice<u16>> {
        let n = x.len() as u64;
        let mut y = self.alloc::<u16>(x.len())?;
        // SAFETY: (a, y, n) matches `f32_to_bf16`; both buffers hold n elements.
        launch!(
            self,
            "elementwise",
            "f32_to_bf16",
            grid1(x.len()),
            [x, &mut y, &n]
        )?;
        Ok(y)
    }

    // ---- gather, RoPE, SwiGLU --------------------------------------------------------------

    /// Embedding gather: `out[i, :] = table[ids[i], :]` for a `[rows, row]` f32 table. An id
    /// outside the table gives a NaN row (a kernel cannot return an error).
    pub fn gather_rows_f32(
        &self,
        table: &CudaSlice<f32>,
        row: usize,
        ids: &CudaSlice<i64>,
    ) -> Result<CudaSlice<f32>> {
        self.gather("gather_rows_f32", table, row, ids)
    }

    /// As [`CudaBackend::gather_rows_f32`] for a bf16 table (raw bits), widened to f32.
    pub fn gather_rows_bf16(
        &self,
        table: &CudaSlice<u16>,
        row: usize,
        ids: &CudaSlice<i64>,
    ) -> Result<CudaSlice<f32>> {
        self.gather("gather_rows_bf16", table, row, ids)
    }

    fn gather<T>(
        &self,
        entry: &'static str,
        table: &CudaSlice<T>,
        row: usize,
        ids: &CudaSlice<i64>,
    ) -> Result<CudaSlice<f32>> {
        if row == 0 || !table.len().is_multiple_of(row) {
            return Err(shape_err(entry, format!("table {} row {row}", table.len())));
        }
        let n = ids.len();
        let mut out = self.alloc::<f32>(n * row)?;
        let (ni, ri) = (i32_of(entry, n)?, i32_of(entry, row)?);
        let rows = (table.len() / row) as i64;
        // SAFETY: (table, ids, out, n, row, rows) matches the kernel; out holds n*row floats
        // and ids outside [0, rows) are not dereferenced.
        launch!(
            self,
            "copy",
            entry,
            grid1(n * row),
            [table, ids, &mut out, &ni, &ri, &rows]
        )?;
        Ok(out)
    }

    /// Interleaved partial RoPE in place on `x[s_len, inner, d]`: the trailing
    /// `2 * inv_freq.len()` channels of each row, angle `pos[s] * inv_freq[i]` (negated when
    /// `inverse`), computed in f64 like the CPU backend.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        s_len: usize,
        inner: usize,
        d: usize,
        pos: &[i64],
        inv_freq: &[f64],
        inverse: bool,
    ) -> Result<()> {
        const OP: &str = "rope";
        let half = inv_freq.len();
        if x.len() != s_len * inner * d || pos.len() != s_len || 2 * half > d {
            return Err(shape_err(
                OP,
                format!(
                    "x {} for [{s_len}, {inner}, {d}], {} positions, {half} freqs",
                    x.len(),
                    pos.len()
                ),
            ));
        }
        if half == 0 || x.is_empty() {
            return Ok(());
        }
        let pos_d = self.upload(pos)?;
        let freq_d = self.upload(inv_freq)?;
        let (si, ii, di, hi) = (
            i32_of(OP, s_len)?,
            i32_of(OP, inner)?,
            i32_of(OP, d)?,
            i32_of(OP, half)?,
        );
        let sign = if inverse { -1.0f64 } else { 1.0 };
        // SAFETY: (x, s_len, inner, d, half, pos, inv_freq, sign) matches `rope_interleaved`;
        // x holds s_len*inner*d floats, pos s_len, inv_freq half.
        launch!(
            self,
            "rope",
            "rope_interleaved",
            grid1(s_len * inner * half),
            [x, &si, &ii, &di, &hi, &pos_d, &freq_d, &sign]
        )?;
        Ok(())
    }

    /// Clamped SwiGLU: `silu(min(g, limit)) * clamp(u, ±limit)` (no clamp if `limit <= 0`).
    pub fn swiglu(
        &self,
        g: &CudaSlice<f32>,
        u: &CudaSlice<f32>,
        limit: f32,
    ) -> Result<CudaSlice<f32>> {
        if g.len() != u.len() {
            return Err(shape_err(
                "swiglu",
                format!("gate {} up {}", g.len(), u.len()),
            ));
        }
        let n = g.len() as u64;
        let mut y = self.alloc::<f32>(g.len())?;
        // SAFETY: (g, u, y, n, limit) matches `swiglu`; all three buffers hold n floats.
        launch!(
            self,
            "elementwise",
            "swiglu",
            grid1(g.len()),
            [g, u, &mut y, &n, &limit]
        )?;
        Ok(y)
    }

    // ---- MoE routing, attention, block copy ------------------------------------------------

    /// MoE routing of `logits[s_len, e]`: scores, optional selection bias, top-k (ties to the
    /// lower expert), renormalise and scale → `(indices [s_len, k], weights [s_len, k])`.
    pub fn moe_route(
        &self,
        logits: &CudaSlice<f32>,
        bias: Option<&CudaSlice<f32>>,
        e: usize,
        p: RouteParams,
    ) -> Result<(CudaSlice<i32>, CudaSlice<f32>)> {
        const OP: &str = "moe_route";
        if e == 0 || !logits.len().is_multiple_of(e) || bias.is_some_and(|b| b.len() != e) {
            return Err(shape_err(
                OP,
                format!("logits {} for {e} experts", logits.len()),
            ));
        }
        if p.top_k == 0 || p.top_k > 32 || p.top_k > e {
            return Err(invalid(OP, format!("top_k {} (1..=min(32, {e}))", p.top_k)));
        }
        let s_len = logits.len() / e;
        let f = self.function("moe", "moe_route")?;
        let mut idx = self.alloc::<i32>(s_len * p.top_k)?;
        let mut wts = self.alloc::<f32>(s_len * p.top_k)?;
        let score = match p.score {
            RouteScore::SqrtSoftplus => 0i32,
            RouteScore::Softmax => 1,
            RouteScore::Sigmoid => 2,
        };
        let (si, ei, ki) = (i32_of(OP, s_len)?, i32_of(OP, e)?, i32_of(OP, p.top_k)?);
        let renorm = i32::from(p.renormalize);
        let null = 0u64;
        let mut b = self.stream.launch_builder(&f);
        b.arg(logits);
        match bias {
            Some(bias) => b.arg(bias),
            // A null `const float*`: the kernel reads no bias.
            None => b.arg(&null),
        };
        b.arg(&mut idx)
            .arg(&mut wts)
            .arg(&si)
            .arg(&ei)
            .arg(&ki)
            .arg(&score)
            .arg(&renorm)
            .arg(&p.scale);
        // SAFETY: the arguments match `moe_route` (a pointer-sized null when there is no
        // bias); one thread per row, idx and wts hold s_len*k elements.
        unsafe { b.launch(grid1(s_len)) }.map_err(dev("launch moe_route"))?;
        Ok((idx, wts))
    }

    /// Sink attention (decode and prefill): `q[s_len, heads, d]`, one shared key=value head
    /// `kv[J, d]`, `idx[s_len, kk]` (keys each row reads, `-1` = none), `sink[heads]` →
    /// `[s_len, heads, d]`, with the semantics of [`crate::Backend::sparse_attention`].
    #[allow(clippy::too_many_arguments)]
    pub fn sparse_attention(
        &self,
        q: &CudaSlice<f32>,
        kv: &CudaSlice<f32>,
        idx: &CudaSlice<i32>,
        sink: &CudaSlice<f32>,
        heads: usize,
        d: usize,
        scale: f32,
    ) -> Result<CudaSlice<f32>> {
        const OP: &str = "sparse_attention";
        if heads == 0 || d == 0 || !q.len().is_multiple_of(heads * d) || sink.len() != heads {
            return Err(shape_err(OP, format!("q {} heads {heads} d {d}", q.len())));
        }
        let s_len = q.len() / (heads * d);
        if s_len == 0 || !idx.len().is_multiple_of(s_len) || !kv.len().is_multiple_of(d) {
            return Err(shape_err(OP, format!("idx {} kv {}", idx.len(), kv.len())));
        }
        let kk = idx.len() / s_len;
        let shared = (kk + 128) * 4;
        if shared > 48 * 1024 {
            return Err(invalid(
                OP,
                format!("{kk} keys per row exceed 48 KiB of shared memory"),
            ));
        }
        let mut o = self.alloc::<f32>(q.len())?;
        let (hi, di, ki) = (i32_of(OP, heads)?, i32_of(OP, d)?, i32_of(OP, kk)?);
        let cfg = LaunchConfig {
            grid_dim: (s_len as u32, heads as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        // SAFETY: (q, kv, idx, sink, o, heads, d, kk, scale) matches `sink_attention`; grid
        // (S, H) of 128 threads with kk + 128 floats of dynamic shared memory. Key indices
        // must lie in [0, J) or be -1 (the caller's contract, as on the CPU).
        launch!(
            self,
            "attention",
            "sink_attention",
            cfg,
            [q, kv, idx, sink, &mut o, &hi, &di, &ki, &scale]
        )?;
        Ok(o)
    }

    /// Paged block copy (copy-on-write): `cache` holds blocks of `words` 32-bit words; for
    /// each `(src, dst)` block `dst` becomes a copy of block `src`, every source read before
    /// any destination is written.
    pub fn copy_blocks(
        &self,
        cache: &mut CudaSlice<u32>,
        words: usize,
        pairs: &[(usize, usize)],
    ) -> Result<()> {
        const OP: &str = "copy_blocks";
        if words == 0 || !cache.len().is_multiple_of(words) {
            return Err(shape_err(
                OP,
                format!("cache {} words {words}", cache.len()),
            ));
        }
        let blocks = cache.len() / words;
        if let Some(&(s, d)) = pairs.iter().find(|&&(s, d)| s >= blocks || d >= blocks) {
            return Err(invalid(
                OP,
                format!("pair ({s}, {d}) outside {blocks} blocks"),
            ));
        }
        if pairs.is_empty() {
            return Ok(());
        }
        let src: Vec<i32> = pairs.iter().map(|p| p.0 as i32).collect();
        let dst: Vec<i32> = pairs.iter().map(|p| p.1 as i32).collect();
        let (src, dst) = (self.upload(&src)?, self.upload(&dst)?);
        let total = pairs.len() * words;
        let mut stage = self.alloc::<u32>(total)?;
        let np = i32_of(OP, pairs.len())?;
        let w = words as u64;
        // SAFETY: (cache, stage, src, pairs, words) matches `copy_blocks_stage`; indices were
        // checked against the block count and stage holds pairs*words words.
        launch!(
            self,
            "copy",
            "copy_blocks_stage",
            grid1(total),
            [&*cache, &mut stage, &src, &np, &w]
        )?;
        // SAFETY: as above for `copy_blocks_commit`, ordered after the stage on one stream.
        launch!(
            self,
            "copy",
            "copy_blocks_commit",
            grid1(total),
            [cache, &stage, &dst, &np, &w]
        )?;
        Ok(())
    }

    // ---- softmax, indexer, top-k, compressor -----------------------------------------------

    /// Softmax along rows of length `d` (`-inf` entries get 0; an all `-inf` row gives zeros).
    pub fn softmax(&self, x: &CudaSlice<f32>, d: usize) -> Result<CudaSlice<f32>> {
        const OP: &str = "softmax";
        if d == 0 || !x.len().is_multiple_of(d) {
            return Err(shape_err(OP, format!("x {} d {d}", x.len())));
        }
        let mut y = self.alloc::<f32>(x.len())?;
        let di = i32_of(OP, d)?;
        let cfg = LaunchConfig {
            grid_dim: ((x.len() / d) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 256 * 4,
        };
        // SAFETY: (x, y, d) matches `softmax_rows`; one 256-thread block per row with 256
        // floats of shared memory for the reductions.
        launch!(self, "norm", "softmax_rows", cfg, [x, &mut y, &di])?;
        Ok(y)
    }

    /// Top-k along rows of length `t_len`, largest first, ties to the lower index; picks whose
    /// value is `-inf` (or past the row) are `-1` → `[rows, k]`, as [`crate::Backend::topk`].
    pub fn topk(&self, x: &CudaSlice<f32>, t_len: usize, k: usize) -> Result<CudaSlice<i32>> {
        const OP: &str = "topk";
        if t_len == 0 || !x.len().is_multiple_of(t_len) || k == 0 {
            return Err(shape_err(OP, format!("x {} row {t_len} k {k}", x.len())));
        }
        let rows = x.len() / t_len;
        let mut scratch = self.alloc::<f32>(x.len())?;
        let mut out = self.alloc::<i32>(rows * k)?;
        let (ti, ki) = (i32_of(OP, t_len)?, i32_of(OP, k)?);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: (x, scratch, out, t_len, k) matches `topk_rows`; one 256-thread block per
        // row (its static shared arrays are sized for 256), scratch as large as x.
        launch!(
            self,
            "indexer",
            "topk_rows",
            cfg,
            [x, &mut scratch, &mut out, &ti, &ki]
        )?;
        Ok(out)
    }

    /// Lightning-indexer scores: `q[S, hi, di]`, `k[T, di]`, `w[S, hi]` →
    /// `scale · Σ_h w[s,h] · relu(q[s,h]·k[t])` as `[S, T]`, `-inf` for `t >= visible[s]`.
    #[allow(clippy::too_many_arguments)]
    pub fn indexer_scores(
        &self,
        q: &CudaSlice<f32>,
        k: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        visible: &[usize],
        hi: usize,
        di: usize,
        scale: f32,
    ) -> Result<CudaSlice<f32>> {
        const OP: &str = "indexer_scores";
        let s_len = visible.len();
        if di == 0
            || q.len() != s_len * hi * di
            || w.len() != s_len * hi
            || !k.len().is_multiple_of(di)
        {
            return Err(shape_err(
                OP,
                format!(
                    "q {} k {} w {} for S {s_len} hi {hi} di {di}",
                    q.len(),
                    k.len(),
                    w.len()
                ),
            ));
        }
        let t_len = k.len() / di;
        let vis: Vec<i32> = visible.iter().map(|&v| v.min(t_len) as i32).collect();
        let vis = self.upload(&vis)?;
        let mut out = self.alloc::<f32>(s_len * t_len)?;
        let (si, hii, dii, ti) = (
            i32_of(OP, s_len)?,
            i32_of(OP, hi)?,
            i32_of(OP, di)?,
            i32_of(OP, t_len)?,
        );
        // SAFETY: the arguments match `indexer_scores`; buffer sizes checked above, one
        // thread per (s, t) output.
        launch!(
            self,
            "indexer",
            "indexer_scores",
            grid1(s_len * t_len),
            [q, k, w, &vis, &mut out, &si, &hii, &dii, &ti, &scale]
        )?;
        Ok(out)
    }

    /// KV-compressor gated pooling with the semantics of [`crate::Backend::compress_pool`]:
    /// `a`, `z` are `[n * ratio, width]` (`width = 2c` with `overlap`, else `c`) → `[n_out, c]`.
    pub fn compress_pool(
        &self,
        a: &CudaSlice<f32>,
        z: &CudaSlice<f32>,
        width: usize,
        ratio: usize,
        overlap: bool,
        first_is_context: bool,
    ) -> Result<CudaSlice<f32>> {
        const OP: &str = "compress_pool";
        if width == 0
            || ratio == 0
            || a.len() != z.len()
            || !a.len().is_multiple_of(width * ratio)
            || (overlap && !width.is_multiple_of(2))
        {
            return Err(shape_err(
                OP,
                format!("a {} z {} width {width} ratio {ratio}", a.len(), z.len()),
            ));
        }
        let n = a.len() / (width * ratio);
        let first = usize::from(first_is_context);
        if n < first {
            return Err(shape_err(OP, "no group after the context group"));
        }
        let n_out = n - first;
        let c = if overlap { width / 2 } else { width };
        let mut out = self.alloc::<f32>(n_out * c)?;
        let (ni, ri, wi) = (i32_of(OP, n_out)?, i32_of(OP, ratio)?, i32_of(OP, width)?);
        let (ov, fi) = (i32::from(overlap), first as i32);
        // SAFETY: (a, z, out, n_out, ratio, width, overlap, first) matches `compress_pool`;
        // a and z hold n*ratio*width floats, out n_out*c.
        launch!(
            self,
            "compress",
            "compress_pool",
            grid1(n_out * c),
            [a, z, &mut out, &ni, &ri, &wi, &ov, &fi]
        )?;
        Ok(out)
    }
}
