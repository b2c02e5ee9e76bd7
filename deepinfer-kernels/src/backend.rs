//! The [`Backend`] trait: device tensors and every operation a DeepSeek V4 / V4.1 step needs.
//!
//! Conventions (the NumPy references' semantics, so a model written against this trait
//! matches them):
//! - Tensors are row-major; "rows" are everything but the last axis.
//! - Activations are float tensors (f32, bf16 or f16); results are f32 unless stated.
//! - `matmul(x, w)` is PyTorch's `Linear`: `x[.., k] · w[n, k]ᵀ → [.., n]`.
//! - Integer index tensors are i32 or i64; `-1` marks "no entry" where an op says so.
//! - Operations are functional (they return new tensors) except the few `_into` / copy ops
//!   that write into caches.

use crate::DType;
use crate::error::Result;
use crate::quant::{FakeQuant, QuantMatrix};
use crate::sampling::SampleRow;

/// Read-only bytes that outlive every tensor viewing them (a file mapping, a static table).
pub type SharedBytes = std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>;

/// What every backend's tensor handle tells about itself.
pub trait TensorInfo {
    /// Logical shape.
    fn shape(&self) -> &[usize];
    /// Element type.
    fn dtype(&self) -> DType;
    /// Number of logical elements.
    fn numel(&self) -> usize {
        self.shape().iter().product()
    }
}

/// Unary elementwise functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unary {
    /// `x * sigmoid(x)`.
    Silu,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `log(1 + exp(x))`, computed stably.
    Softplus,
    /// `sqrt(softplus(x))` (DeepSeek V4 router scores).
    SqrtSoftplus,
    /// `max(x, 0)`.
    Relu,
    /// `exp(x)`.
    Exp,
    /// `-x`.
    Neg,
    /// `sigmoid(sign(x) * sqrt(max(|x|, 1e-6)))` (the V4.1 Engram gate).
    SignedSqrtSigmoid,
}

/// How router logits become expert scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteScore {
    /// `sqrt(softplus(logit))` (DeepSeek V4).
    SqrtSoftplus,
    /// Softmax over experts.
    Softmax,
    /// `sigmoid(logit)` (DeepSeek V3).
    Sigmoid,
}

/// MoE routing parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouteParams {
    /// Score function.
    pub score: RouteScore,
    /// Experts per token.
    pub top_k: usize,
    /// Divide the picked scores by their sum (`+ 1e-20`) before scaling.
    pub renormalize: bool,
    /// Multiplier applied last (`routed_scaling_factor`).
    pub scale: f32,
}

/// One routed expert's SwiGLU weights (any weight dtype `matmul` accepts).
#[derive(Debug)]
pub struct ExpertWeights<'a, T> {
    /// Gate projection `[inter, hidden]` (`w1`).
    pub gate: &'a T,
    /// Up projection `[inter, hidden]` (`w3`).
    pub up: &'a T,
    /// Down projection `[hidden, inter]` (`w2`).
    pub down: &'a T,
}

impl<T> Clone for ExpertWeights<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for ExpertWeights<'_, T> {}

/// Hyper-connection mixing weights of one block, as [`Backend::hc_mixes`] returns them.
#[derive(Debug, Clone)]
pub struct HcMixes<T> {
    /// `[S, N]`: `sigmoid(..) + eps`, the collapse weights of the next read.
    pub pre: T,
    /// `[S, N]`: `2 * sigmoid(..)`, how much of the block output each stream gets.
    pub post: T,
    /// `[S, N, N]` indexed `[source, destination]`: Sinkhorn-normalised stream mixing.
    pub comb: T,
}

/// A compute backend. Model code is written against this trait only.
///
/// All methods take `&self`; a backend is shared by reference and may run work on its own
/// thread pool. Errors: shapes or dtypes that do not fit return [`crate::KernelError`].
pub trait Backend: Send + Sync {
    /// The backend's tensor handle (cheap to clone: shares the buffer).
    type Tensor: TensorInfo + Clone + Send + Sync + std::fmt::Debug;

    /// A short name ("cpu", "cuda:0", ..).
    fn name(&self) -> String;

    // ---- data movement -------------------------------------------------------------------

    /// Uploads f32 data with the given shape.
    fn upload_f32(&self, data: &[f32], shape: &[usize]) -> Result<Self::Tensor>;
    /// Uploads bf16 data.
    fn upload_bf16(&self, data: &[half::bf16], shape: &[usize]) -> Result<Self::Tensor>;
    /// Uploads f16 data.
    fn upload_f16(&self, data: &[half::f16], shape: &[usize]) -> Result<Self::Tensor>;
    /// Uploads i32 data.
    fn upload_i32(&self, data: &[i32], shape: &[usize]) -> Result<Self::Tensor>;
    /// Uploads i64 data.
    fn upload_i64(&self, data: &[i64], shape: &[usize]) -> Result<Self::Tensor>;
    /// Uploads a quantised weight matrix (shape `[rows, cols]`, dtype from its format).
    fn upload_quant(&self, q: &QuantMatrix) -> Result<Self::Tensor>;
    /// A tensor of the little-endian `dtype` values (F32, BF16 or F16) at byte `start` of
    /// `bytes`, such as a memory-mapped checkpoint's weight. A backend that reads host memory
    /// in place (the CPU) keeps a view: the values are read from the page cache and never
    /// copied. The default decodes and uploads a copy.
    fn upload_shared(
        &self,
        bytes: SharedBytes,
        start: usize,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Self::Tensor> {
        upload_shared_copy(self, bytes, start, dtype, shape)
    }
    /// Downloads any float tensor as f32 (quantised weights are dequantised).
    fn download_f32(&self, t: &Self::Tensor) -> Result<Vec<f32>>;
    /// Downloads an integer tensor as i32 (i64 values must fit).
    fn download_i32(&self, t: &Self::Tensor) -> Result<Vec<i32>>;
    /// Downloads an integer tensor as i64.
    fn download_i64(&self, t: &Self::Tensor) -> Result<Vec<i64>>;
    /// A zero-filled tensor (float or integer dtype).
    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<Self::Tensor>;
    /// Converts between float dtypes (f32, bf16, f16), rounding to nearest even.
    fn cast(&self, t: &Self::Tensor, dtype: DType) -> Result<Self::Tensor>;
    /// Same data, new shape (same element count). No copy.
    fn reshape(&self, t: &Self::Tensor, shape: &[usize]) -> Result<Self::Tensor>;
    /// `t[.., start..start+len, ..]` along axis `dim` (copies).
    fn narrow(
        &self,
        t: &Self::Tensor,
        dim: usize,
        start: usize,
        len: usize,
    ) -> Result<Self::Tensor>;
    /// Concatenation along axis `dim`; all other axes and the dtype must agree.
    fn concat(&self, ts: &[&Self::Tensor], dim: usize) -> Result<Self::Tensor>;
    /// Swaps axes `a` and `b` (copies).
    fn transpose(&self, t: &Self::Tensor, a: usize, b: usize) -> Result<Self::Tensor>;
    /// Embedding gather: `table[idx]` for a `[V, ..]` table and an integer `idx` of any shape;
    /// the result has shape `idx.shape ++ table.shape[1..]` and f32 (or the integer) dtype.
    fn gather_rows(&self, table: &Self::Tensor, idx: &Self::Tensor) -> Result<Self::Tensor>;
    /// Writes `src` (shape `[n, ..]`) into rows `row..row+n` of `dst` (same trailing shape).
    fn write_rows(&self, dst: &mut Self::Tensor, row: usize, src: &Self::Tensor) -> Result<()>;
    /// Paged block copy (copy-on-write of KV blocks): `cache` is `[num_blocks, ..]`; for each
    /// `(src, dst)` pair block `dst` becomes a copy of block `src` (sources read before writes).
    fn copy_blocks(&self, cache: &mut Self::Tensor, pairs: &[(usize, usize)]) -> Result<()>;

    // ---- elementwise and reductions -------------------------------------------------------

    /// `a + b`; `b`'s shape must equal `a`'s or be a suffix of it (broadcast over leading axes).
    fn add(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;
    /// `a * b` with the same broadcasting as [`Backend::add`].
    fn mul(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;
    /// `a * s + c`.
    fn affine(&self, a: &Self::Tensor, s: f32, c: f32) -> Result<Self::Tensor>;
    /// An elementwise function.
    fn unary(&self, a: &Self::Tensor, f: Unary) -> Result<Self::Tensor>;
    /// Clamped SwiGLU: `silu(min(g, limit)) * clamp(u, -limit, limit)`; no clamp if `limit <= 0`.
    fn swiglu(&self, gate: &Self::Tensor, up: &Self::Tensor, limit: f32) -> Result<Self::Tensor>;
    /// Softmax along the last axis (`-inf` entries get 0; an all `-inf` row gives zeros).
    fn softmax(&self, a: &Self::Tensor) -> Result<Self::Tensor>;
    /// RMSNorm along the last axis: `x / sqrt(mean(x²) + eps) * w` (`w` of the last axis' size).
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        w: Option<&Self::Tensor>,
        eps: f32,
    ) -> Result<Self::Tensor>;
    /// Mean over axis 1 of a `[S, N, D]` tensor → `[S, D]`.
    fn mean_axis1(&self, x: &Self::Tensor) -> Result<Self::Tensor>;
    /// Sum along the last axis → shape without it (fixed order: [`crate::cpu::gemm::LANES`]
    /// interleaved partial sums, then a fixed tree). The default downloads and sums on the host.
    fn sum_last(&self, x: &Self::Tensor) -> Result<Self::Tensor> {
        let shape = x.shape().to_vec();
        let d = shape.last().copied().unwrap_or(1);
        let v = self.download_f32(x)?;
        let ones = vec![1.0f32; d];
        let out: Vec<f32> = if d == 0 {
            vec![0.0; v.len()]
        } else {
            v.chunks(d)
                .map(|r| crate::cpu::gemm::dot_f32(r, &ones))
                .collect()
        };
        let new_shape = &shape[..shape.len().saturating_sub(1)];
        self.upload_f32(&out, new_shape)
    }
    /// Index of the largest value along the last axis (lowest index on ties) → i32 `[rows]`.
    fn argmax(&self, x: &Self::Tensor) -> Result<Self::Tensor>;

    // ---- GEMM -------------------------------------------------------------------------------

    /// `x[.., k] · w[n, k]ᵀ → [.., n]` (f32 out). `w` may be f32, bf16, f16 or quantised.
    fn matmul(&self, x: &Self::Tensor, w: &Self::Tensor) -> Result<Self::Tensor>;
    /// Batched: `a[b, m, k] · c[b, n, k]ᵀ → [b, m, n]`.
    fn bmm(&self, a: &Self::Tensor, c: &Self::Tensor) -> Result<Self::Tensor>;
    /// Grouped low-rank output projection: `x[S, G, i]`, `w[G, r, i]` → `[S, G, r]`
    /// (`einsum("sgi,gri->sgr")`; reshape to `[S, G*r]` for the following `matmul`).
    fn grouped_matmul(&self, x: &Self::Tensor, w: &Self::Tensor) -> Result<Self::Tensor>;

    // ---- attention building blocks -------------------------------------------------------

    /// Interleaved partial RoPE on the trailing `2 * inv_freq.len()` channels of each row of `x`
    /// (`[S, d]` or `[S, H, d]`): pairs `(x[2i], x[2i+1])` rotate by `pos[s] * inv_freq[i]`
    /// (angles in f64). `inverse` rotates by the negative angle (de-rotating the output).
    fn rope(
        &self,
        x: &Self::Tensor,
        pos: &[i64],
        inv_freq: &[f64],
        inverse: bool,
    ) -> Result<Self::Tensor>;
    /// Attention over one shared key=value head with a learned per-head sink.
    ///
    /// `q[S, H, d]`, `kv[J, d]`, `idx[S, K]` (integer; the keys row `s` reads, `-1` = none),
    /// `sink[H]`: `p = softmax([q·k_j * scale for j in idx[s]] ++ [sink_h])`, output
    /// `Σ p_j k_j` (the sink takes probability but contributes no value) → `[S, H, d]`.
    fn sparse_attention(
        &self,
        q: &Self::Tensor,
        kv: &Self::Tensor,
        idx: &Self::Tensor,
        sink: &Self::Tensor,
        scale: f32,
    ) -> Result<Self::Tensor>;
    /// Gated pooling of the KV compressor.
    ///
    /// Without overlap: `a`, `z` are `[n*ratio, c]` → `[n, c]`, entry `w` is
    /// `Σ_r softmax_r(z[w*ratio + r]) * a[w*ratio + r]` per channel.
    /// With overlap: `a`, `z` are `[n*ratio, 2c]`; entry `w` pools over the previous group's
    /// first `c` channels and its own group's last `c` channels (softmax over up to `2*ratio`
    /// rows per channel). If `first_is_context`, the first group only serves as the previous
    /// group of the second and the output has `n - 1` entries; otherwise entry 0 has no
    /// previous group.
    fn compress_pool(
        &self,
        a: &Self::Tensor,
        z: &Self::Tensor,
        ratio: usize,
        overlap: bool,
        first_is_context: bool,
    ) -> Result<Self::Tensor>;
    /// Lightning-indexer scores: `q[S, Hi, di]`, `k[T, di]`, `w[S, Hi]` →
    /// `scale * Σ_h w[s,h] * relu(q[s,h]·k[t])` as `[S, T]`; entries `t >= visible[s]` are `-inf`.
    fn indexer_scores(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        w: &Self::Tensor,
        visible: &[usize],
        scale: f32,
    ) -> Result<Self::Tensor>;
    /// Top-k along the last axis, largest first, ties to the lower index → i32 `[rows, k]`.
    /// Picks whose value is `-inf` (and slots past the row length) are `-1`.
    fn topk(&self, x: &Self::Tensor, k: usize) -> Result<Self::Tensor>;
    /// Max over consecutive blocks of `block` entries along the last axis (last block may be
    /// partial) → `[rows, ceil(T / block)]`.
    fn block_max(&self, x: &Self::Tensor, block: usize) -> Result<Self::Tensor>;
    /// Replaces entries where `keep` (integer, same shape, 0 = drop) is 0 by `-inf`.
    fn mask_neg_inf(&self, x: &Self::Tensor, keep: &Self::Tensor) -> Result<Self::Tensor>;

    // ---- hyper-connections ---------------------------------------------------------------

    /// The mixing coefficients from `mix = rms(X.flat) · fnᵀ` (`[S, (2+N)*N]`), `scale[3]`,
    /// `base[(2+N)*N]`: pre, post, and the comb matrix (softmax + eps, then a column
    /// normalisation and `sinkhorn_iters - 1` row/column rounds, each with `+ eps`).
    fn hc_mixes(
        &self,
        mix: &Self::Tensor,
        scale: &Self::Tensor,
        base: &Self::Tensor,
        n: usize,
        eps: f32,
        sinkhorn_iters: usize,
    ) -> Result<HcMixes<Self::Tensor>>;
    /// `sigmoid(mix * scale[0] + base) + eps` for `mix[S, N]` (the V4 head's collapse weights).
    fn hc_pre_only(
        &self,
        mix: &Self::Tensor,
        scale: &Self::Tensor,
        base: &Self::Tensor,
        eps: f32,
    ) -> Result<Self::Tensor>;
    /// Collapse: `X[S, N, D]`, `pre[S, N]` → `Σ_n pre[s,n] X[s,n]` as `[S, D]`.
    fn hc_collapse(&self, x: &Self::Tensor, pre: &Self::Tensor) -> Result<Self::Tensor>;
    /// Expand (merge): `Y[s,k] = post[s,k] * out[s] + Σ_j comb[s,j,k] X[s,j]` → `[S, N, D]`.
    fn hc_expand(
        &self,
        x: &Self::Tensor,
        out: &Self::Tensor,
        post: &Self::Tensor,
        comb: &Self::Tensor,
    ) -> Result<Self::Tensor>;

    // ---- MoE -----------------------------------------------------------------------------

    /// Routing: `logits[S, E]`, optional selection `bias[E]` (added for the choice only) →
    /// `(indices i32 [S, k], weights f32 [S, k])`; ties to the lower expert id.
    fn moe_route(
        &self,
        logits: &Self::Tensor,
        bias: Option<&Self::Tensor>,
        p: RouteParams,
    ) -> Result<(Self::Tensor, Self::Tensor)>;
    /// Hash routing: experts from `table[ids[s]]` (`table` integer `[V, k]`), weights from the
    /// scores of `logits` at those experts (renormalised and scaled as `p` says).
    fn moe_route_hash(
        &self,
        logits: &Self::Tensor,
        table: &Self::Tensor,
        ids: &Self::Tensor,
        p: RouteParams,
    ) -> Result<(Self::Tensor, Self::Tensor)>;
    /// Routed experts: `out[s] = Σ_j weights[s,j] * down_e(swiglu(gate_e x, up_e x))` with
    /// `e = indices[s,j]` (`-1` skipped), accumulated in slot order → `[S, D]`.
    fn moe_experts(
        &self,
        x: &Self::Tensor,
        indices: &Self::Tensor,
        weights: &Self::Tensor,
        experts: &[ExpertWeights<'_, Self::Tensor>],
        limit: f32,
    ) -> Result<Self::Tensor>;

    // ---- quantisation --------------------------------------------------------------------

    /// The QAT round trip of the NumPy reference along the last axis (its size must be a
    /// multiple of the block).
    fn fake_quant(&self, x: &Self::Tensor, f: FakeQuant) -> Result<Self::Tensor>;

    // ---- sampling --------------------------------------------------------------------------

    /// Samples one token per row of `logits[S, V]` with the fixed-point / Philox contract of
    /// [`crate::sampling`] (the same token `deepinfer-sample` picks at that temperature with no
    /// other filter) → i32 `[S]`. The default downloads the logits and runs the CPU kernel.
    fn sample(&self, logits: &Self::Tensor, rows: &[SampleRow]) -> Result<Self::Tensor> {
        let shape = logits.shape().to_vec();
        if shape.len() != 2 || shape[0] != rows.len() {
            return Err(crate::error::shape_err(
                "sample",
                format!("logits {shape:?} for {} rows", rows.len()),
            ));
        }
        let v = self.download_f32(logits)?;
        let ids = crate::sampling::sample_rows(&v, shape[1], rows)?;
        self.upload_i32(&ids, &[rows.len()])
    }
}

/// [`Backend::upload_shared`] by decoding a copy.
pub(crate) fn upload_shared_copy<B: Backend + ?Sized>(
    be: &B,
    bytes: SharedBytes,
    start: usize,
    dtype: DType,
    shape: &[usize],
) -> Result<B::Tensor> {
    const OP: &str = "upload_shared";
    let n: usize = shape.iter().product();
    let size = match dtype {
        DType::F32 => 4,
        DType::BF16 | DType::F16 => 2,
        d => return Err(crate::error::invalid(OP, format!("dtype {d:?}"))),
    };
    let raw = n
        .checked_mul(size)
        .and_then(|len| (*bytes).as_ref().get(start..start.checked_add(len)?))
        .ok_or_else(|| {
            crate::error::invalid(
                OP,
                format!("{n} values at byte {start} lie outside the bytes"),
            )
        })?;
    match dtype {
        DType::F32 => {
            let v: Vec<f32> = raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            be.upload_f32(&v, shape)
        }
        DType::BF16 => {
            let v: Vec<half::bf16> = raw
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]))
                .collect();
            be.upload_bf16(&v, shape)
        }
        _ => {
            let v: Vec<half::f16> = raw
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                .collect();
            be.upload_f16(&v, shape)
        }
    }
}
