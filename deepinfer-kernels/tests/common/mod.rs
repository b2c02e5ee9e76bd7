//! Shared test helpers: a seeded generator, comparisons, and plain f64 references.
#![allow(dead_code)]

/// xorshift64* — deterministic test data without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Largest |a - b| / (atol + rtol |b|) over the pair of slices; panics on length mismatch.
pub fn assert_close(what: &str, got: &[f32], want: &[f64], atol: f64, rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= atol + rtol * w.abs()
                || (g.is_infinite() && w.is_infinite() && g.signum() as f64 == w.signum()),
            "{what}[{i}]: got {g}, want {w} (err {err:e})"
        );
    }
}

pub fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// `x[m,k] · w[n,k]ᵀ` in f64.
pub fn linear64(x: &[f64], m: usize, k: usize, w: &[f64], n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|t| x[i * k + t] * w[j * k + t]).sum();
        }
    }
    out
}

pub fn rms64(x: &[f64], d: usize, w: Option<&[f64]>, eps: f64) -> Vec<f64> {
    let mut out = x.to_vec();
    for row in out.chunks_mut(d) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / d as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        for (i, v) in row.iter_mut().enumerate() {
            *v *= inv * w.map_or(1.0, |w| w[i]);
        }
    }
    out
}

pub fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub fn softplus64(x: f64) -> f64 {
    (1.0 + x.exp()).ln()
}
