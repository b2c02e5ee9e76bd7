//! Setup shared by the benches: deterministic data, the streaming-read baseline, the GEMV
//! weights and the direct `matrixmultiply::sgemm` reference.

// Each bench uses its own subset.
#![allow(dead_code)]

use deepinfer_kernels::{Backend, CpuBackend, CpuTensor};

/// Deterministic values in [-0.5, 0.5) (xorshift32).
pub fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1 << 24) as f32 - 0.5
        })
        .collect()
}

// The bandwidth baseline; benches that do not use it compile this module too.
#[allow(unused_imports)]
pub use deepinfer_kernels::bandwidth::stream_read;

/// `bytes` of words for [`stream_read`].
pub fn stream_words(bytes: usize) -> Vec<u32> {
    data(bytes / 4, 1).iter().map(|v| v.to_bits()).collect()
}

/// The GEMV activation row `[1, k]`.
pub fn gemv_x(b: &CpuBackend, k: usize) -> CpuTensor {
    b.upload_f32(&data(k, 2), &[1, k]).unwrap()
}

/// f32 GEMV weights filling `bytes`: `[bytes / 4 / k, k]`.
pub fn gemv_w_f32(b: &CpuBackend, bytes: usize, k: usize) -> CpuTensor {
    let n = bytes / 4 / k;
    b.upload_f32(&data(n * k, 3), &[n, k]).unwrap()
}

/// bf16 GEMV weights filling `bytes`: `[bytes / 2 / k, k]`.
pub fn gemv_w_bf16(b: &CpuBackend, bytes: usize, k: usize) -> CpuTensor {
    let n = bytes / 2 / k;
    let w: Vec<half::bf16> = data(n * k, 4)
        .iter()
        .map(|&v| half::bf16::from_f32(v))
        .collect();
    b.upload_bf16(&w, &[n, k]).unwrap()
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` by `matrixmultiply::sgemm` called directly (one thread).
pub fn sgemm_reference(m: usize, k: usize, n: usize, x: &[f32], w: &[f32], out: &mut [f32]) {
    assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    // SAFETY: x is [m, k] (row stride k), wᵀ is read with strides (1, k) from the [n, k]
    // buffer, out is [m, n]; all in bounds (asserted) and out aliases neither input.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            x.as_ptr(),
            k as isize,
            1,
            w.as_ptr(),
            1,
            k as isize,
            0.0,
            out.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}
