//! The fixed-point CDF against a float reference, and its monotonicity on
//! adversarial rows.

use deepinfer_sample::SamplingParams;
use deepinfer_sample::fixed_point::{WEIGHT_ONE, det_exp, pick, weight_of};
use deepinfer_sample::sampler::filtered_weights;

/// Float reference: softmax in f64 and a float cumulative search.
fn float_probs(logits: &[f32]) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits.iter().map(|&l| (l as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

fn float_pick(p: &[f64], u: f64) -> usize {
    let mut acc = 0.0;
    for (i, &pi) in p.iter().enumerate() {
        acc += pi;
        if acc > u {
            return i;
        }
    }
    p.len() - 1
}

fn weights(logits: &[f32]) -> (Vec<u64>, u64) {
    let (ws, total) = filtered_weights(logits, None, &[], &SamplingParams::default()).unwrap();
    let mut dense = vec![0u64; logits.len()];
    for (id, w) in ws {
        dense[id as usize] = w;
    }
    (dense, total)
}

#[test]
fn equals_float_reference_on_ordinary_rows() {
    let mut x = 12345u64;
    for row in 0..50 {
        let n = 10 + row * 7;
        let logits: Vec<f32> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
            })
            .collect();
        let p = float_probs(&logits);
        let (w, total) = weights(&logits);
        // Probabilities agree to ~1e-6 (det_exp ulps plus 2^-32 flooring).
        for (pi, wi) in p.iter().zip(&w) {
            assert!((pi - *wi as f64 / total as f64).abs() < 1e-6);
        }
        // The same uniform picks the same token, except within 1e-5 of a
        // CDF boundary.
        let mut edges = Vec::new();
        let mut acc = 0.0;
        for pi in &p {
            acc += pi;
            edges.push(acc);
        }
        for k in 0..5000 {
            let u = (k as f64 + 0.5) / 5000.0;
            let t = (u * total as f64) as u64;
            let fixed = pick(&w, t).unwrap();
            let float = float_pick(&p, u);
            if fixed != float {
                let near = edges.iter().any(|e| (e - u).abs() < 1e-5);
                assert!(near, "row {row} u {u}: fixed {fixed} float {float}");
            }
        }
    }
}

fn assert_monotone(w: &[u64], total: u64) {
    assert_eq!(w.iter().sum::<u64>(), total);
    let mut last = 0usize;
    let steps = 10_000u64;
    for k in 0..=steps {
        let t = ((total as u128 - 1) * k as u128 / steps as u128) as u64;
        let i = pick(w, t).expect("target below total must pick");
        assert!(i >= last, "CDF not monotone");
        assert!(w[i] > 0, "zero-weight token drawn");
        last = i;
    }
    assert_eq!(pick(w, total), None);
}

#[test]
fn monotone_on_many_tiny_probabilities() {
    let mut logits = vec![-18.0f32; 100_000];
    logits[777] = 0.0;
    let (w, total) = weights(&logits);
    assert!(w[0] > 0, "exp(-18) is above 2^-32 and keeps a weight");
    assert_monotone(&w, total);
    // Tiny tokens together hold ~100000 * exp(-18) ≈ 1.5 % of the mass.
    let tiny: u64 = total - w[777];
    let expect = 99_999.0 * (-18f64).exp() / (1.0 + 99_999.0 * (-18f64).exp());
    assert!((tiny as f64 / total as f64 - expect).abs() < 1e-4);
}

#[test]
fn monotone_with_one_dominant_and_vanishing_tokens() {
    let mut logits = vec![-40.0f32; 5000];
    logits[4999] = 0.0;
    logits[10] = -22.0; // exp(-22) ≈ 2.8e-10 > 2^-32: a weight of 1
    let (w, total) = weights(&logits);
    assert_eq!(w[4999], WEIGHT_ONE);
    assert_eq!(w[10], 1);
    assert_eq!(w[0], 0, "exp(-40) is below 2^-32: never drawn");
    assert_monotone(&w, total);
}

#[test]
fn denormal_relative_probabilities_get_zero_weight() {
    // det_exp of very negative arguments is denormal or zero; the weight
    // is 0 either way and the CDF stays monotone.
    let r = det_exp(-86.5);
    assert!(r > 0.0 && r < f32::MIN_POSITIVE * 4.0);
    assert_eq!(weight_of(r), 0);
    assert_eq!(weight_of(f32::from_bits(1)), 0);
    let w = [0, 5, 0, 0, WEIGHT_ONE, 0, 1];
    assert_monotone(&w, w.iter().sum());
    // At the smallest temperature a trailing token is a denormal.
    let params = SamplingParams::greedy();
    let (ws, _) = filtered_weights(&[1.0f32, 1.0 - 8e-4, 0.5], None, &[], &params).unwrap();
    assert_eq!(ws, vec![(0, WEIGHT_ONE), (1, 0), (2, 0)]);
}
