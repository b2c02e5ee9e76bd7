//! GEMV / GEMM kernels for `x[m, k] · w[n, k]ᵀ`.
//!
//! Every f32 and bf16 output is one dot product with a fixed summation order ([`LANES`]
//! interleaved partial sums, each a fused multiply-add chain, then a fixed pairwise tree).
//! It does not depend on `m`, on which rows share the call, or on threads, so the same
//! kernels serve batch-invariant mode and the fast mode:
//! - the **tiled kernel** ([`super::gemm_tiled`], AVX-512F): 4 × 4 outputs in registers,
//!   at GEMM speed, from 4 rows of `x`;
//! - the **dot path** for fewer rows (batch-1 decode: each weight row read once, as one
//!   sequential stream) and on CPUs without AVX-512 (AVX2+FMA or portable).
//!
//! f16 and quantised weights keep the dot path in batch-invariant mode and for small `m`;
//! in fast mode from `m >= FAST_M` they take the **blocked path**: `matrixmultiply::sgemm`
//! on weight blocks decoded to f32, one rayon task per block. `matrixmultiply` is used
//! because it has tuned AVX/FMA micro-kernels with run-time CPU detection, is pure Rust,
//! small and fast to build; the heavier `gemm` crate was not worth its build time on this
//! project's 2-core CI.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::quant::QuantMatrix;

/// Interleaved partial sums per dot product (fixed: it defines the summation order).
pub const LANES: usize = 16;

/// Rows from which the fast mode switches from the dot path to blocked sgemm (f16 and
/// quantised weights, or f32 and bf16 without the tiled kernel).
pub const FAST_M: usize = 8;

/// A weight element that widens exactly to f32.
pub(crate) trait WElem: Copy + Send + Sync {
    fn widen(self) -> f32;

    /// The fixed-order dot product of `x` and `w` (see [`dot`]); element types with an
    /// explicit SIMD build override it with the same operations in the same order.
    #[inline]
    fn dot(x: &[f32], w: &[Self]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            // SAFETY: the CPU supports AVX2 (checked at run time above).
            return unsafe { dot_avx2(x, w) };
        }
        dot_body(x, w)
    }
}
impl WElem for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }

    #[inline]
    fn dot(x: &[f32], w: &[f32]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            // SAFETY: the CPU supports AVX2 (checked at run time above).
            return unsafe { simd::dot(x, w) };
        }
        dot_body(x, w)
    }
}
impl WElem for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }

    #[inline]
    fn dot(x: &[f32], w: &[bf16]) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            // SAFETY: the CPU supports AVX2 (checked at run time above).
            return unsafe { simd::dot(x, w) };
        }
        dot_body(x, w)
    }
}
impl WElem for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// Adds the tail (fewer than [`LANES`] values) into the lane sums and folds them by the fixed
/// pairwise tree: the end of every dot product, whichever build computed the lanes.
#[inline(always)]
pub(crate) fn finish<W: WElem>(mut acc: [f32; LANES], x_tail: &[f32], w_tail: &[W]) -> f32 {
    for (l, (a, b)) in x_tail.iter().zip(w_tail).enumerate() {
        acc[l] = a.mul_add(b.widen(), acc[l]);
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            acc[l] += acc[l + width];
        }
    }
    acc[0]
}

#[inline(always)]
fn dot_body<W: WElem>(x: &[f32], w: &[W]) -> f32 {
    let n = x.len().min(w.len());
    let (x, w) = (&x[..n], &w[..n]);
    let mut acc = [0.0f32; LANES];
    let mut xc = x.chunks_exact(LANES);
    let mut wc = w.chunks_exact(LANES);
    for (xs, ws) in (&mut xc).zip(&mut wc) {
        for l in 0..LANES {
            acc[l] = xs[l].mul_add(ws[l].widen(), acc[l]);
        }
    }
    finish(acc, xc.remainder(), wc.remainder())
}

/// Adds the products of the whole 16-chunks of `x` and `w` into the lane sums `acc` (the
/// first phase of [`dot_body`], resumable: chunk by chunk it gives the same sums).
#[inline(always)]
fn acc_chunks_body(acc: &mut [f32; LANES], x: &[f32], w: &[f32]) {
    for (xs, ws) in x.chunks_exact(LANES).zip(w.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = xs[l].mul_add(ws[l], acc[l]);
        }
    }
}

/// See [`acc_chunks_body`] (AVX2 build selected at run time).
#[inline]
fn acc_chunks(acc: &mut [f32; LANES], x: &[f32], w: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2 (checked at run time above).
        return unsafe { simd::acc_chunks(acc, x, w) };
    }
    acc_chunks_body(acc, x, w)
}

/// Fixed-order dot product of `x` with row `row` of a quantised matrix, decoding 256 values
/// at a time into a stack buffer: bit-identical to [`dot`] on the dequantised row, without
/// materialising it.
pub(crate) fn dot_quant_row(x: &[f32], q: &QuantMatrix, row: usize) -> f32 {
    const PIECE: usize = 256;
    let k = q.cols().min(x.len());
    let full = k / LANES * LANES;
    let mut acc = [0.0f32; LANES];
    let mut buf = [0.0f32; PIECE];
    let mut c0 = 0;
    while c0 < full {
        let c1 = (c0 + PIECE).min(full);
        q.dequantize_range(row, c0, &mut buf[..c1 - c0]);
        acc_chunks(&mut acc, &x[c0..c1], &buf[..c1 - c0]);
        c0 = c1;
    }
    q.dequantize_range(row, full, &mut buf[..k - full]);
    finish(acc, &x[full..k], &buf[..k - full])
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2<W: WElem>(x: &[f32], w: &[W]) -> f32 {
    // Same IEEE operations in the same order as the portable body (each a fused
    // multiply-add), so the result is bit-identical whichever version runs.
    dot_body(x, w)
}

/// Explicit AVX2 dot products: lanes 0–7 and 8–15 of [`dot_body`] in two registers, one fused
/// multiply-add per element, then the same [`finish`]: bit-identical to the portable body. Written out because the auto-vectoriser splits the 16 lanes badly.
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{LANES, WElem, finish};
    use half::bf16;
    use std::arch::x86_64::*;

    /// A weight type the blocked loop can widen to eight f32 lanes.
    pub(super) trait Wide8: WElem {
        /// Eight weights at `p` as f32 (exact).
        ///
        /// # Safety
        /// Eight values must be readable at `p`, and the CPU must support AVX2.
        unsafe fn load8(p: *const Self) -> __m256;
    }

    impl Wide8 for f32 {
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn load8(p: *const f32) -> __m256 {
            // SAFETY: the caller guarantees 8 readable f32 at p.
            unsafe { _mm256_loadu_ps(p) }
        }
    }

    impl Wide8 for bf16 {
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn load8(p: *const bf16) -> __m256 {
            // SAFETY: the caller guarantees 8 readable bf16 (16 bytes) at p; the 16-bit
            // shift widens exactly.
            unsafe {
                let h = _mm_loadu_si128(p.cast());
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            }
        }
    }

    /// The blocked loop every AVX2 dot shares: adds `x[i] * w[i]` into the two 8-lane
    /// registers `acc` (lanes 0–7 and 8–15 of [`super::dot_body`]) over the first `full`
    /// values (a multiple of [`LANES`] within both slices), one fused multiply-add per
    /// element.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn blocked<W: Wide8>(
        acc: (__m256, __m256),
        x: &[f32],
        w: &[W],
        full: usize,
    ) -> (__m256, __m256) {
        assert!(full <= x.len() && full <= w.len() && full.is_multiple_of(LANES));
        let (mut a0, mut a1) = acc;
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let mut i = 0;
        while i < full {
            // SAFETY: i + 16 <= full, within both slices (asserted); unaligned loads; AVX2
            // is enabled on this function.
            unsafe {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(i)), W::load8(wp.add(i)), a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(i + 8)), W::load8(wp.add(i + 8)), a1);
            }
            i += LANES;
        }
        (a0, a1)
    }

    /// The two registers into lane sums.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn store(acc: &mut [f32; LANES], (a0, a1): (__m256, __m256)) {
        // SAFETY: acc holds 16 f32s; two unaligned 8-lane stores.
        unsafe {
            _mm256_storeu_ps(acc.as_mut_ptr(), a0);
            _mm256_storeu_ps(acc.as_mut_ptr().add(8), a1);
        }
    }

    /// [`super::dot_body`] with AVX2, for f32 or bf16 weights.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot<W: Wide8>(x: &[f32], w: &[W]) -> f32 {
        let n = x.len().min(w.len());
        let full = n / LANES * LANES;
        let zero = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut acc = [0.0f32; LANES];
        store(&mut acc, blocked(zero, x, w, full));
        finish(acc, &x[full..n], &w[full..n])
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn acc_chunks(acc: &mut [f32; LANES], x: &[f32], w: &[f32]) {
        let full = x.len().min(w.len()) / LANES * LANES;
        // SAFETY: acc holds 16 f32s; two unaligned 8-lane loads.
        let start = unsafe {
            (
                _mm256_loadu_ps(acc.as_ptr()),
                _mm256_loadu_ps(acc.as_ptr().add(8)),
            )
        };
        store(acc, blocked(start, x, w, full));
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    use std::sync::OnceLock;
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    })
}

/// Fixed-order dot product of `x` and `w` (over the shorter length): [`LANES`] interleaved
/// partial sums (a fused multiply-add per element), then a fixed pairwise tree.
#[inline]
pub(crate) fn dot<W: WElem>(x: &[f32], w: &[W]) -> f32 {
    W::dot(x, w)
}

/// `out[i * rows.len() + j] = dot(x[i], rows[j])` for the `m` rows of `x` (`[m, k]`) and
/// weight rows anywhere in memory (each at least `k` long; attention's selected keys): the
/// tiled kernel where the CPU has it, each key read once per four rows of `x`.
pub(crate) fn dots_rows(x: &[f32], m: usize, k: usize, rows: &[&[f32]], out: &mut [f32]) {
    if super::gemm_tiled::available() {
        return super::gemm_tiled::dots_rows(x, m, k, rows, out);
    }
    let n = rows.len();
    for i in 0..m {
        for (j, r) in rows.iter().enumerate() {
            out[i * n + j] = dot(&x[i * k..(i + 1) * k], &r[..k]);
        }
    }
}

/// The portable build of [`dot`] (the specification the SIMD builds are tested against).
pub fn dot_f32_portable(x: &[f32], w: &[f32]) -> f32 {
    dot_body(x, w)
}

/// The portable build of [`dot`] for bf16 weights.
pub fn dot_bf16_portable(x: &[f32], w: &[bf16]) -> f32 {
    dot_body(x, w)
}

/// Fixed-order dot product of `x` and bf16 weights (the kernel the bf16 GEMV uses).
pub fn dot_bf16(x: &[f32], w: &[bf16]) -> f32 {
    dot(x, w)
}

/// Fixed-order dot product of two f32 slices (public for tests and other backends' checks).
pub fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    dot(x, w)
}

/// A weight matrix `[n, k]` in one of the supported storage types.
#[derive(Clone, Copy)]
pub(crate) enum WeightRef<'a> {
    F32(&'a [f32]),
    BF16(&'a [bf16]),
    F16(&'a [f16]),
    Quant(&'a QuantMatrix),
}

impl WeightRef<'_> {
    /// Decodes rows `n0..n1` into `buf` (row-major f32).
    fn decode_rows(&self, k: usize, n0: usize, n1: usize, buf: &mut Vec<f32>) {
        buf.clear();
        buf.resize((n1 - n0) * k, 0.0);
        match self {
            WeightRef::F32(w) => buf.copy_from_slice(&w[n0 * k..n1 * k]),
            WeightRef::BF16(w) => {
                for (o, v) in buf.iter_mut().zip(&w[n0 * k..n1 * k]) {
                    *o = v.widen();
                }
            }
            WeightRef::F16(w) => {
                for (o, v) in buf.iter_mut().zip(&w[n0 * k..n1 * k]) {
                    *o = v.widen();
                }
            }
            WeightRef::Quant(q) => {
                for (r, row) in buf.chunks_mut(k.max(1)).enumerate() {
                    q.dequantize_row(n0 + r, row);
                }
            }
        }
    }
}

/// Weight rows per dot-path task: about 512 KiB of f32 weights (few, large tasks keep the
/// streaming read going), at least one row.
fn dot_block_rows(k: usize) -> usize {
    (131_072 / k.max(1)).clamp(1, 1024)
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ`.
pub(crate) fn linear(
    x: &[f32],
    m: usize,
    k: usize,
    w: WeightRef<'_>,
    n: usize,
    invariant: bool,
) -> Vec<f32> {
    if m == 0 || n == 0 {
        return vec![0.0; m * n];
    }
    if k == 0 {
        return vec![0.0; m * n];
    }
    // Fewer rows than a tile: one weight row at a time is one sequential stream, which the
    // hardware prefetcher follows better than a tile's interleaved rows (same bits).
    if super::gemm_tiled::available() && m >= super::gemm_tiled::MR {
        match w {
            WeightRef::F32(ws) => return linear_tiled(x, m, k, ws, n),
            WeightRef::BF16(ws) => return linear_tiled(x, m, k, ws, n),
            _ => {}
        }
    }
    if invariant || m < FAST_M {
        linear_dot(x, m, k, w, n)
    } else {
        linear_blocked(x, m, k, w, n)
    }
}

/// The dot path through the tiled kernel ([`super::gemm_tiled`]): bit-identical to
/// [`linear_dot`], at GEMM speed, so both modes use it where the CPU has it.
fn linear_tiled<W: super::gemm_tiled::Wide16>(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[W],
    n: usize,
) -> Vec<f32> {
    use super::gemm_tiled::{NR, OutView, dots_into};
    // Weight rows per task: the dot path's streaming block, or fewer so that a large batch
    // still spreads over every thread; a multiple of the tile width.
    let threads = rayon::current_num_threads().max(1);
    let nb = dot_block_rows(k)
        .min(n.div_ceil(4 * threads))
        .next_multiple_of(NR);
    let mut out = vec![0.0f32; m * n];
    let view = OutView::new(&mut out, n);
    (0..n.div_ceil(nb)).into_par_iter().for_each(|b| {
        let n0 = b * nb;
        let cols = nb.min(n - n0);
        // SAFETY: `out` is [m, n] and outlives the loop; task b alone writes columns
        // n0..n0 + cols.
        unsafe { dots_into(x, m, k, &w[n0 * k..(n0 + cols) * k], cols, view, n0) };
    });
    out
}

/// `[rows, cols]` → `[cols, rows]`.
fn transpose(t: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = t[r * cols + c];
        }
    }
    out
}

fn linear_dot(x: &[f32], m: usize, k: usize, w: WeightRef<'_>, n: usize) -> Vec<f32> {
    let nb = dot_block_rows(k);
    // Transposed result [n, m]: each task owns a contiguous run of weight rows.
    let mut out_t = vec![0.0f32; n * m];
    out_t
        .par_chunks_mut(nb * m)
        .enumerate()
        .for_each(|(b, chunk)| {
            let n0 = b * nb;
            let rows = chunk.len() / m;
            for r in 0..rows {
                let o = &mut chunk[r * m..(r + 1) * m];
                let wi = n0 + r;
                match w {
                    WeightRef::F32(ws) => row_dots(x, k, &ws[wi * k..(wi + 1) * k], o),
                    WeightRef::BF16(ws) => row_dots(x, k, &ws[wi * k..(wi + 1) * k], o),
                    WeightRef::F16(ws) => row_dots(x, k, &ws[wi * k..(wi + 1) * k], o),
                    WeightRef::Quant(q) => {
                        for (i, o) in o.iter_mut().enumerate() {
                            *o = dot_quant_row(&x[i * k..(i + 1) * k], q, wi);
                        }
                    }
                }
            }
        });
    if m == 1 {
        return out_t;
    }
    transpose(&out_t, n, m)
}

#[inline]
fn row_dots<W: WElem>(x: &[f32], k: usize, wrow: &[W], out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = dot(&x[i * k..(i + 1) * k], wrow);
    }
}

fn linear_blocked(x: &[f32], m: usize, k: usize, w: WeightRef<'_>, n: usize) -> Vec<f32> {
    // Column blocks of the output, each computed by one task into its own [m, nb] buffer.
    let nb = 128usize;
    let mb = 256usize;
    let nblocks = n.div_ceil(nb);
    let parts: Vec<(usize, Vec<f32>)> = (0..nblocks)
        .into_par_iter()
        .map(|b| {
            let n0 = b * nb;
            let n1 = (n0 + nb).min(n);
            let cols = n1 - n0;
            let mut buf = Vec::new();
            let wblk: &[f32] = match w {
                WeightRef::F32(ws) => &ws[n0 * k..n1 * k],
                _ => {
                    w.decode_rows(k, n0, n1, &mut buf);
                    &buf
                }
            };
            let mut c = vec![0.0f32; m * cols];
            for i0 in (0..m).step_by(mb) {
                let rows = mb.min(m - i0);
                // SAFETY: A is x[i0.., k] (row stride k), B = wblkᵀ (k × cols: element (kk, j)
                // at wblk[j*k + kk]), C is c[i0.., cols]; all three lie inside their slices
                // for the given dimensions and strides, and C does not alias A or B.
                unsafe {
                    matrixmultiply::sgemm(
                        rows,
                        k,
                        cols,
                        1.0,
                        x[i0 * k..].as_ptr(),
                        k as isize,
                        1,
                        wblk.as_ptr(),
                        1,
                        k as isize,
                        0.0,
                        c[i0 * cols..].as_mut_ptr(),
                        cols as isize,
                        1,
                    );
                }
            }
            (n0, c)
        })
        .collect();
    let mut out = vec![0.0f32; m * n];
    for (n0, c) in parts {
        let cols = c.len() / m;
        for i in 0..m {
            out[i * n + n0..i * n + n0 + cols].copy_from_slice(&c[i * cols..(i + 1) * cols]);
        }
    }
    out
}
