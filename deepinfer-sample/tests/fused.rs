//! The fused full-vocabulary path draws the same token with the same
//! log-probability as the listing path and as the sort definition, for any
//! logits, mask, penalties, temperature, top-p, min-p, seed and position.

use deepinfer_sample::reference::sample_sorted;
use deepinfer_sample::sampler::FUSED_ABOVE;
use deepinfer_sample::testing::{self, Row, VerifyCase, edge_row, verify_case};
use deepinfer_sample::{
    LogitValue, LogprobSource, SampleRequest, Sampler, SamplingParams, Verifier, VerifyMode,
    VerifyRequest, mask_words,
};
use proptest::prelude::*;

/// The row asking for `n` alternatives.
fn with_alternatives(mut c: Row, n: usize) -> Row {
    c.params.top_logprobs = n;
    c
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn fused_alternatives_equal_listing_f32(c in edge_row(4200), n in 1usize..9) {
        let c = with_alternatives(c, n);
        testing::check_fused_alternatives(&c.request()).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn fused_alternatives_equal_listing_bf16(c in edge_row(4200), n in 1usize..9) {
        let c = with_alternatives(c, n);
        let row = c.bf16_logits();
        testing::check_fused_alternatives(&c.request_with(&row)).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn fused_equals_listing_f32(c in edge_row(4200)) {
        testing::check_fused_matches_listing(&c.request()).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn fused_equals_listing_bf16(c in edge_row(4200)) {
        let row = c.bf16_logits();
        testing::check_fused_matches_listing(&c.request_with(&row)).map_err(TestCaseError::fail)?;
    }
}

/// Pseudo-normal logits (sum of four uniforms), as in the bench.
fn full_row(seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..129_280)
        .map(|_| (next() + next() + next() + next() - 2.0) * 6.0)
        .collect()
}

#[test]
fn full_vocabulary_rows_take_the_fused_path_and_match() {
    let logits = full_row(3);
    let mut mask = vec![u32::MAX; mask_words(logits.len())];
    mask[7] = 0x0F0F_0F0F;
    mask[4039] = 0;
    for (temperature, top_p, min_p) in [
        (1.0, 1.0, 0.0),
        (1.0, 0.9, 0.0),
        (0.7, 0.95, 0.0),
        (1.0, 1.0, 1e-4),
        (1.3, 0.5, 1e-3),
    ] {
        for position in 0..3 {
            let params = SamplingParams {
                temperature,
                top_p,
                min_p,
                seed: 17 + position,
                presence_penalty: 0.5,
                logit_bias: vec![(12, 3.0), (129_279, -2.0)],
                ..SamplingParams::default()
            };
            for m in [None, Some(&mask[..])] {
                let req = SampleRequest {
                    logits: &logits[..],
                    mask: m,
                    history: &[5, 12, 5, 100_000],
                    position,
                    params: &params,
                };
                let fused = Sampler::new().sample(&req).unwrap();
                let listed = Sampler::with_fused_above(usize::MAX).sample(&req).unwrap();
                assert_eq!(fused, listed, "t {temperature} top_p {top_p} min_p {min_p}");
                for source in [LogprobSource::Sampled, LogprobSource::Processed] {
                    let p5 = SamplingParams {
                        top_logprobs: 5,
                        logprob_source: source,
                        ..params.clone()
                    };
                    let r5 = SampleRequest { params: &p5, ..req };
                    let fused = Sampler::new().sample(&r5).unwrap();
                    let listed = Sampler::with_fused_above(usize::MAX).sample(&r5).unwrap();
                    assert_eq!(fused, listed, "{source:?} t {temperature} top_p {top_p}");
                    assert_eq!(fused.top_logprobs.len(), 5);
                }
                let (token, lp) = sample_sorted(&req).unwrap();
                assert_eq!(
                    (fused.token, fused.logprob.to_bits()),
                    (token, lp.to_bits())
                );
            }
        }
    }
    assert!(FUSED_ABOVE < logits.len());
}

#[test]
fn extreme_temperatures_and_spreads_match() {
    // Logits spanning the f32 range: `l - l_max` overflows to -inf, and an infinite
    // temperature turns it into NaN (weight 0) while every other token weighs 2^32.
    let mut logits: Vec<f32> = (0..3000).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
    logits[10] = 3.0e38;
    logits[20] = -3.0e38;
    logits[2999] = 3.0e38;
    for temperature in [f32::INFINITY, f32::MAX, 1e30, 1e-5, 1.0] {
        for top_p in [1.0f32, 0.5] {
            let params = SamplingParams {
                temperature,
                top_p,
                seed: 5,
                ..SamplingParams::default()
            };
            for position in 0..4 {
                let req = SampleRequest {
                    logits: &logits[..],
                    mask: None,
                    history: &[],
                    position,
                    params: &params,
                };
                let fused = Sampler::with_fused_above(0).sample(&req).unwrap();
                let listed = Sampler::with_fused_above(usize::MAX).sample(&req).unwrap();
                assert_eq!(fused, listed, "t {temperature} top_p {top_p}");
                let (token, lp) = sample_sorted(&req).unwrap();
                assert_eq!(
                    (fused.token, fused.logprob.to_bits()),
                    (token, lp.to_bits())
                );
            }
        }
    }
}

fn check_verify<L: LogitValue>(c: &VerifyCase, target: &[L]) -> Result<(), TestCaseError> {
    for (mode, with_q) in [
        (VerifyMode::Stochastic, true),
        (VerifyMode::Greedy, true),
        (VerifyMode::Greedy, false),
    ] {
        testing::check_verify_paths_agree(&c.request(target, mode, with_q))
            .map_err(TestCaseError::fail)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn fused_verification_equals_listing_f32(c in verify_case(2600)) {
        check_verify(&c, &c.target)?;
    }

    #[test]
    fn fused_verification_equals_listing_bf16(c in verify_case(2600)) {
        let t: Vec<half::bf16> = c.target.iter().map(|&v| half::bf16::from_f32(v)).collect();
        check_verify(&c, &t)?;
    }
}

#[test]
fn full_vocabulary_verification_takes_the_fused_path_and_matches() {
    const N: usize = 3;
    let v = 129_280;
    let mut target = Vec::with_capacity((N + 1) * v);
    for r in 0..=N {
        target.extend(full_row(10 + r as u64));
    }
    // Draft distributions: the target's own softmax at a hotter temperature
    // (near p: frequent acceptances) and a flat one (frequent rejections).
    let softmax = |row: &[f32], t: f32| -> Vec<f32> {
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f64> = row.iter().map(|&l| f64::from((l - m) / t).exp()).collect();
        let z: f64 = e.iter().sum();
        e.iter().map(|x| (x / z) as f32).collect()
    };
    let mut accepted = [0usize; N + 1];
    for (flat, t_draft) in [(false, 1.2f32), (true, 1.0)] {
        let mut q = Vec::with_capacity(N * v);
        let mut drafts = Vec::new();
        for r in 0..N {
            let row = &target[r * v..(r + 1) * v];
            let qr = if flat {
                vec![1.0 / v as f32; v]
            } else {
                softmax(row, t_draft)
            };
            // The draft's argmax, or a mid-ranked token.
            let best = (0..v).max_by(|&a, &b| qr[a].total_cmp(&qr[b])).unwrap();
            drafts.push(if r == 1 && flat { 4242 } else { best as u32 });
            q.extend(qr);
        }
        for (top_p, min_p) in [(1.0f32, 0.0f32), (0.9, 0.0), (1.0, 1e-4)] {
            for seed in 0..4 {
                let params = SamplingParams {
                    top_p,
                    min_p,
                    seed,
                    presence_penalty: 0.3,
                    ..SamplingParams::default()
                };
                let req = VerifyRequest {
                    target_logits: &target,
                    vocab: v,
                    draft_tokens: &drafts,
                    draft_probs: Some(&q),
                    masks: None,
                    history: &[7, 8],
                    position: 50,
                    params: &params,
                    mode: VerifyMode::Stochastic,
                };
                let fused = Verifier::new().verify(&req).unwrap();
                let listed = Verifier::with_fused_above(usize::MAX).verify(&req).unwrap();
                assert_eq!(fused, listed, "flat {flat} top_p {top_p} min_p {min_p}");
                accepted[fused.accepted] += 1;
                let greedy = VerifyRequest {
                    mode: VerifyMode::Greedy,
                    ..req
                };
                let fused = Verifier::new().verify(&greedy).unwrap();
                let listed = Verifier::with_fused_above(usize::MAX)
                    .verify(&greedy)
                    .unwrap();
                assert_eq!(
                    fused, listed,
                    "greedy flat {flat} top_p {top_p} min_p {min_p}"
                );
            }
        }
    }
    // Both outcomes occur: rejections (residual draws) and acceptances.
    assert!(accepted[0] + accepted[1] + accepted[2] > 0, "{accepted:?}");
    assert!(accepted[1] + accepted[2] + accepted[3] > 0, "{accepted:?}");
}
