//! Shared by the statistical tests: Pearson's chi-square, its quantiles, and the filtered
//! target distribution of a row.
#![allow(dead_code)]

use deepinfer_sample::SamplingParams;
use deepinfer_sample::sampler::filtered_weights;

/// Pearson chi-square of `counts` against probabilities `p` (cells with
/// p = 0 must have zero counts).
pub fn chi_square(counts: &[u64], p: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    let mut chi = 0.0;
    for (&c, &pi) in counts.iter().zip(p) {
        if pi == 0.0 {
            assert_eq!(c, 0, "a token with probability 0 was drawn");
            continue;
        }
        let e = pi * n as f64;
        chi += (c as f64 - e).powi(2) / e;
    }
    chi
}

/// Chi-square 99.99 % quantiles for 1..=9 degrees of freedom.
pub const CHI2_9999: [f64; 10] = [
    0.0, 15.14, 18.42, 21.11, 23.51, 25.74, 27.86, 29.88, 31.83, 33.72,
];

pub fn target(logits: &[f32], params: &SamplingParams) -> Vec<f64> {
    let (ws, total) = filtered_weights(logits, None, &[], params).unwrap();
    let mut p = vec![0.0; logits.len()];
    for (id, w) in ws {
        p[id as usize] = w as f64 / total as f64;
    }
    p
}

pub fn dof(p: &[f64]) -> usize {
    p.iter().filter(|&&x| x > 0.0).count() - 1
}
