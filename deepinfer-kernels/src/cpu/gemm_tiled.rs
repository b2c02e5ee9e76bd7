//! The fixed-order dot path as a register-tiled AVX-512 kernel.
//!
//! Every output is still one [`super::gemm::dot`]: the same [`LANES`] partial sums, each a
//! fused multiply-add chain over the 16-value chunks of `k`, then the same tail and pairwise
//! tree. One 512-bit register holds the 16 lane sums of one output, so a tile of
//! [`MR`] × [`NR`] outputs keeps its sums in 16 registers (larger tiles spill) and loads each
//! chunk of an activation row once per [`NR`] weight rows and each chunk of a weight row once
//! per [`MR`] activation rows. Results are bit-identical to the portable dot whatever the tile, the
//! batch or the thread count, which is what lets one kernel serve batch-invariant mode and
//! the fast path alike.

use half::bf16;

use super::gemm::{LANES, WElem, finish};

/// Activation rows per tile.
pub(crate) const MR: usize = 4;
/// Weight rows per tile.
pub(crate) const NR: usize = 4;

/// Whether this CPU runs the tiled kernel (AVX-512F with FMA).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static AVX512: OnceLock<bool> = OnceLock::new();
        *AVX512.get_or_init(|| {
            std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A weight type the kernel widens to sixteen f32 lanes.
pub(crate) trait Wide16: WElem {
    /// Sixteen weights at `p` as f32 (exact).
    ///
    /// # Safety
    /// Sixteen values must be readable at `p`, and the CPU must support AVX-512F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
}

impl Wide16 for f32 {
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller guarantees 16 readable f32 at p.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
}

impl Wide16 for bf16 {
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const bf16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller guarantees 16 readable bf16 (32 bytes) at p; the 16-bit shift
        // widens exactly.
        unsafe {
            let h = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
}

/// The weight rows of a call: row `j` has at least `k` values.
pub(crate) trait Rows<W>: Sync {
    /// Row `j`.
    fn row(&self, j: usize) -> &[W];
}

/// Rows of a contiguous `[cols, k]` matrix.
struct Contiguous<'a, W> {
    w: &'a [W],
    k: usize,
}

impl<W: Sync> Rows<W> for Contiguous<'_, W> {
    fn row(&self, j: usize) -> &[W] {
        &self.w[j * self.k..(j + 1) * self.k]
    }
}

impl<W: Sync> Rows<W> for [&[W]] {
    fn row(&self, j: usize) -> &[W] {
        self[j]
    }
}

/// Where a call writes its outputs: element `(i, j)` of the call goes to `ptr[i * ld + j]`.
/// Calls on disjoint column ranges of one output matrix may run in parallel.
#[derive(Clone, Copy)]
pub(crate) struct OutView {
    ptr: *mut f32,
    ld: usize,
}

// SAFETY: an OutView is only a base pointer and a stride; the callers of `dots_into` give
// each parallel call its own columns, so no element is written twice or read.
unsafe impl Send for OutView {}
// SAFETY: as above.
unsafe impl Sync for OutView {}

impl OutView {
    /// A view of `out` as `[rows, ld]`.
    pub(crate) fn new(out: &mut [f32], ld: usize) -> Self {
        OutView {
            ptr: out.as_mut_ptr(),
            ld,
        }
    }
}

/// `out[i, col0 + j] = dot(x[i], w[j])` for the `m` rows of `x` (`[m, k]`) and the `cols`
/// rows of `w` (`[cols, k]`), through the tiled kernel.
///
/// # Safety
/// `out` must view a live matrix of at least `m` rows of `out.ld` values with
/// `col0 + cols <= out.ld`, and no other thread may access those `m × cols` elements during
/// the call.
///
/// # Panics
/// If [`available`] is false or a slice is shorter than its shape.
pub(crate) unsafe fn dots_into<W: Wide16>(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[W],
    cols: usize,
    out: OutView,
    col0: usize,
) {
    assert!(available(), "the tiled kernel needs AVX-512F");
    assert!(x.len() >= m * k && w.len() >= cols * k && col0 + cols <= out.ld);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F and FMA are present (asserted), the slices hold their shapes and the
    // caller gives this call the output elements it writes.
    unsafe {
        avx512::dots_into(x, m, k, &Contiguous { w, k }, cols, out, col0)
    }
}

/// `out[i * rows.len() + j] = dot(x[i], rows[j])` for the `m` rows of `x` (`[m, k]`) and
/// weight rows anywhere in memory (each at least `k` long), through the tiled kernel.
///
/// # Panics
/// If [`available`] is false or a slice is shorter than its shape.
pub(crate) fn dots_rows(x: &[f32], m: usize, k: usize, rows: &[&[f32]], out: &mut [f32]) {
    let cols = rows.len();
    assert!(available(), "the tiled kernel needs AVX-512F");
    assert!(x.len() >= m * k && out.len() >= m * cols && rows.iter().all(|r| r.len() >= k));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F and FMA are present (asserted), the slices hold their shapes, and the
    // call has `out` to itself (an exclusive borrow of m × cols values).
    unsafe {
        avx512::dots_into(x, m, k, rows, cols, OutView::new(out, cols), 0)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{LANES, MR, NR, OutView, Rows, Wide16, finish};
    use std::arch::x86_64::*;

    /// The lane sums of an `R × NR` tile over the first `full` values of each row (a
    /// multiple of [`LANES`]).
    ///
    /// # Safety
    /// Every pointer has `full` readable values; the CPU has AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<W: Wide16, const R: usize>(
        xs: &[*const f32; R],
        ws: &[*const W; NR],
        next: &[*const W; NR],
        full: usize,
    ) -> [[__m512; NR]; R] {
        let mut acc = [[_mm512_setzero_ps(); NR]; R];
        let mut xv = [_mm512_setzero_ps(); R];
        let mut c = 0;
        while c < full {
            for p in next {
                // A hint only (never faults): the next tile's weight rows at the same offset,
                // so the interleaved rows stream from memory as one sequential read would.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(c).cast());
            }
            for i in 0..R {
                // SAFETY: c + 16 <= full values are readable at xs[i] (caller).
                xv[i] = unsafe { _mm512_loadu_ps(xs[i].add(c)) };
            }
            for j in 0..NR {
                // SAFETY: as above, for the weight row.
                let wv = unsafe { W::load16(ws[j].add(c)) };
                for i in 0..R {
                    acc[i][j] = _mm512_fmadd_ps(xv[i], wv, acc[i][j]);
                }
            }
            c += LANES;
        }
        acc
    }

    /// Finishes the tile's dot products (tails and the pairwise tree) into `out_t`, for the
    /// `rows` × `cols` of the tile that exist.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn store<W: Wide16, const R: usize>(
        acc: &[[__m512; NR]; R],
        x: &[f32],
        w: &(impl Rows<W> + ?Sized),
        (k, full): (usize, usize),
        (i0, rows): (usize, usize),
        (j0, cols): (usize, usize),
        out: OutView,
    ) {
        let put = |i: usize, j: usize, v: f32| {
            // SAFETY: element (i0 + i, j0 + j) of the call, which the caller of `dots_into`
            // reserved for it (i < rows, j < cols of a tile inside the call's shape).
            unsafe { *out.ptr.add((i0 + i) * out.ld + j0 + j) = v }
        };
        let mut lanes = [0.0f32; LANES];
        for (i, row) in acc.iter().enumerate().take(rows) {
            if full == k {
                // No tail: the pairwise tree in registers.
                for (j, v) in row.iter().enumerate().take(cols) {
                    put(i, j, tree(*v));
                }
                continue;
            }
            let xr = &x[(i0 + i) * k..(i0 + i + 1) * k];
            for (j, v) in row.iter().enumerate().take(cols) {
                // SAFETY: lanes holds 16 f32; unaligned store.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *v) };
                let wr = &w.row(j0 + j)[..k];
                put(i, j, finish(lanes, &xr[full..], &wr[full..]));
            }
        }
    }

    /// The fixed pairwise tree of [`finish`] over the 16 lanes of `v`: lanes `l` and `l + 8`,
    /// then `l + 4`, `l + 2` and `l + 1`, the same additions in the same order.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn tree(v: __m512) -> f32 {
        let lo = _mm512_castps512_ps256(v);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        let a = _mm256_add_ps(lo, hi);
        let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
        let d = _mm_add_ss(c, _mm_shuffle_ps::<0b01>(c, c));
        _mm_cvtss_f32(d)
    }

    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn dots_into<W: Wide16>(
        x: &[f32],
        m: usize,
        k: usize,
        w: &(impl Rows<W> + ?Sized),
        cols: usize,
        out: OutView,
        col0: usize,
    ) {
        let out = OutView {
            // SAFETY: col0 + cols <= ld (checked by the caller), inside the first row.
            ptr: unsafe { out.ptr.add(col0) },
            ld: out.ld,
        };
        if m == 0 || cols == 0 {
            return;
        }
        let full = k / LANES * LANES;
        let xp = x.as_ptr();
        let mut i0 = 0;
        while i0 < m {
            let rows = if m - i0 >= MR { MR } else { 1 };
            let mut j0 = 0;
            while j0 < cols {
                let n = NR.min(cols - j0);
                // A short last tile repeats its last weight row and drops the extra sums.
                let mut ws = [std::ptr::null::<W>(); NR];
                let mut next = [std::ptr::null::<W>(); NR];
                for (j, p) in ws.iter_mut().enumerate() {
                    // Row min(j0 + j, cols - 1) < cols, at least k long.
                    *p = w.row(j0 + j.min(n - 1)).as_ptr();
                }
                for (j, p) in next.iter_mut().enumerate() {
                    *p = w.row((j0 + NR + j).min(cols - 1)).as_ptr();
                }
                let shape = (k, full);
                if rows == MR {
                    let mut xs = [xp; MR];
                    for (i, p) in xs.iter_mut().enumerate() {
                        // SAFETY: i0 + i < m rows lie inside x.
                        *p = unsafe { xp.add((i0 + i) * k) };
                    }
                    // SAFETY: each pointer has k >= full readable values.
                    let acc = unsafe { tile::<W, MR>(&xs, &ws, &next, full) };
                    store(&acc, x, w, shape, (i0, MR), (j0, n), out);
                } else {
                    // SAFETY: row i0 < m lies inside x.
                    let xs = [unsafe { xp.add(i0 * k) }];
                    // SAFETY: as above.
                    let acc = unsafe { tile::<W, 1>(&xs, &ws, &next, full) };
                    store(&acc, x, w, shape, (i0, 1), (j0, n), out);
                }
                j0 += NR;
            }
            i0 += rows;
        }
    }
}
