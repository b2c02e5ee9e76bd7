//! The fused full-vocabulary path draws the same token with the same
//! log-probability as the listing path and as the sort definition, for any
//! logits, mask, penalties, temperature, top-p, min-p, seed and position.

use deepinfer_sample::reference::sample_sorted;
use deepinfer_sample::sampler::FUSED_ABOVE;
use deepinfer_sample::{
    LogitValue, LogprobSource, SampleRequest, Sampler, SamplingParams, Verifier, VerifyMode,
    VerifyRequest, mask_words,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    logits: Vec<f32>,
    mask: Option<Vec<u32>>,
    history: Vec<u32>,
    params: SamplingParams,
    position: u64,
}

fn case() -> impl Strategy<Value = Case> {
    // Up to a few blocks of 1024 tokens, ragged ends included.
    (1usize..4200, any::<u64>(), 0u8..5).prop_flat_map(|(vocab, seed, flavour)| {
        let logit = match flavour {
            // Few distinct values: many ties, also across the top-p edge.
            0 => (-3i32..4).prop_map(|v| v as f32 * 0.5).boxed(),
            1 => (-20.0f32..20.0).boxed(),
            2 => (-1.0f32..1.0).prop_map(|v| v * 1e-3).boxed(),
            // Huge spreads: most weights underflow to 0.
            3 => prop_oneof![(-1e4f32..1e4), Just(0.0f32), Just(-0.0f32)].boxed(),
            _ => prop_oneof![(-5.0f32..5.0), Just(0.0f32), Just(-0.0f32)].boxed(),
        };
        (
            proptest::collection::vec(logit, vocab),
            proptest::option::of(proptest::collection::vec(
                prop_oneof![Just(u32::MAX), any::<u32>(), Just(0u32)],
                mask_words(vocab),
            )),
            proptest::collection::vec(0..vocab as u32, 0..8),
            prop_oneof![Just(1.0f32), 0.01f32..1.0, Just(0.999_999f32)],
            prop_oneof![Just(0.0f32), 0.0f32..0.5, Just(1.0f32)],
            prop_oneof![
                Just(1.0f32),
                Just(0.0f32),
                0.05f32..4.0,
                Just(1e-4f32),
                Just(100.0f32)
            ],
            prop_oneof![Just(1.0f32), 0.5f32..2.0],
            (-1.0f32..1.0, -1.0f32..1.0),
            proptest::collection::vec((0..vocab as u32, -3.0f32..3.0), 0..4),
            (0u64..1_000_000, any::<bool>()),
        )
            .prop_map(
                move |(
                    logits,
                    mask,
                    history,
                    top_p,
                    min_p,
                    temperature,
                    repetition_penalty,
                    (presence_penalty, frequency_penalty),
                    logit_bias,
                    (position, processed),
                )| Case {
                    logits,
                    mask,
                    history,
                    params: SamplingParams {
                        temperature,
                        top_p,
                        min_p,
                        repetition_penalty,
                        presence_penalty,
                        frequency_penalty,
                        logit_bias,
                        seed,
                        logprob_source: if processed {
                            LogprobSource::Processed
                        } else {
                            LogprobSource::Sampled
                        },
                        ..SamplingParams::default()
                    },
                    position,
                },
            )
    })
}

fn check<L: LogitValue>(c: &Case, logits: &[L]) -> Result<(), TestCaseError> {
    let req = SampleRequest {
        logits,
        mask: c.mask.as_deref(),
        history: &c.history,
        position: c.position,
        params: &c.params,
    };
    let fused = Sampler::with_fused_above(0).sample(&req);
    let listed = Sampler::with_fused_above(usize::MAX).sample(&req);
    let default = Sampler::new().sample(&req);
    prop_assert_eq!(&fused, &listed);
    prop_assert_eq!(&default, &listed);
    if let Ok(out) = &fused {
        prop_assert_eq!(
            out.logprob.to_bits(),
            listed.as_ref().unwrap().logprob.to_bits()
        );
        if c.params.logprob_source == LogprobSource::Sampled {
            let (token, lp) = sample_sorted(&req).unwrap();
            prop_assert_eq!(out.token, token);
            prop_assert_eq!(out.logprob.to_bits(), lp.to_bits());
        }
    }
    Ok(())
}

/// Rows asking for alternatives: same token, log-probability and
/// alternatives (bit for bit) on both paths.
fn check_alts<L: LogitValue>(c: &Case, logits: &[L], n: usize) -> Result<(), TestCaseError> {
    let params = SamplingParams {
        top_logprobs: n,
        ..c.params.clone()
    };
    let req = SampleRequest {
        logits,
        mask: c.mask.as_deref(),
        history: &c.history,
        position: c.position,
        params: &params,
    };
    let fused = Sampler::with_fused_above(0).sample(&req);
    let listed = Sampler::with_fused_above(usize::MAX).sample(&req);
    prop_assert_eq!(format!("{fused:?}"), format!("{listed:?}"));
    if let (Ok(f), Ok(l)) = (&fused, &listed) {
        let bits = |o: &deepinfer_sample::SampleOutput| -> Vec<(u32, u32)> {
            std::iter::once((o.token, o.logprob.to_bits()))
                .chain(o.top_logprobs.iter().map(|&(t, lp)| (t, lp.to_bits())))
                .collect()
        };
        prop_assert_eq!(bits(f), bits(l));
        prop_assert_eq!(f.top_logprobs.len(), l.top_logprobs.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn fused_alternatives_equal_listing_f32(c in case(), n in 1usize..9) {
        check_alts(&c, &c.logits, n)?;
    }

    #[test]
    fn fused_alternatives_equal_listing_bf16(c in case(), n in 1usize..9) {
        let row: Vec<half::bf16> = c.logits.iter().map(|&v| half::bf16::from_f32(v)).collect();
        check_alts(&c, &row, n)?;
    }

    #[test]
    fn fused_equals_listing_f32(c in case()) {
        check(&c, &c.logits)?;
    }

    #[test]
    fn fused_equals_listing_bf16(c in case()) {
        let row: Vec<half::bf16> = c.logits.iter().map(|&v| half::bf16::from_f32(v)).collect();
        check(&c, &row)?;
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

/// A verification case: `n` drafts over a small vocabulary.
#[derive(Debug, Clone)]
struct VerifyCase {
    vocab: usize,
    target: Vec<f32>,
    drafts: Vec<u32>,
    q: Vec<f32>,
    masks: Option<Vec<u32>>,
    history: Vec<u32>,
    params: SamplingParams,
    position: u64,
}

fn verify_case() -> impl Strategy<Value = VerifyCase> {
    (1usize..2600, 0usize..4, any::<u64>(), 0u8..4).prop_flat_map(|(vocab, n, seed, flavour)| {
        let logit = match flavour {
            0 => (-3i32..4).prop_map(|v| v as f32 * 0.5).boxed(),
            1 => (-20.0f32..20.0).boxed(),
            2 => (-1.0f32..1.0).prop_map(|v| v * 1e-3).boxed(),
            _ => prop_oneof![(-5.0f32..5.0), Just(0.0f32)].boxed(),
        };
        // Draft probabilities: near the target scale (1 / vocab), large
        // (sums far above 1, empty residuals) or zero; rarely invalid.
        let scale = 1.0 / vocab as f32;
        let qv = prop_oneof![
            8 => (0.0f32..4.0).prop_map(move |x| x * scale),
            2 => 0.0f32..1.0,
            1 => Just(0.0f32),
            1 => Just(f32::NAN),
        ];
        (
            proptest::collection::vec(logit, (n + 1) * vocab),
            proptest::collection::vec(0..vocab as u32, n),
            proptest::collection::vec(qv, n * vocab),
            proptest::option::of(proptest::collection::vec(
                prop_oneof![4 => Just(u32::MAX), 1 => any::<u32>()],
                (n + 1) * mask_words(vocab),
            )),
            proptest::collection::vec(0..vocab as u32, 0..6),
            prop_oneof![Just(1.0f32), 0.05f32..1.0],
            prop_oneof![Just(0.0f32), 0.0f32..0.3],
            prop_oneof![Just(1.0f32), 0.1f32..3.0, Just(1e-4f32)],
            (0u64..1_000_000, any::<bool>(), 0.5f32..1.5),
        )
            .prop_map(
                move |(
                    target,
                    drafts,
                    mut q,
                    masks,
                    history,
                    top_p,
                    min_p,
                    temperature,
                    (position, clean, repetition_penalty),
                )| {
                    if clean {
                        // Most rows: no invalid value anywhere.
                        q.iter_mut().filter(|x| x.is_nan()).for_each(|x| *x = 0.0);
                    }
                    VerifyCase {
                        vocab,
                        target,
                        drafts,
                        q,
                        masks,
                        history,
                        params: SamplingParams {
                            temperature,
                            top_p,
                            min_p,
                            repetition_penalty,
                            seed,
                            ..SamplingParams::default()
                        },
                        position,
                    }
                },
            )
    })
}

fn check_verify<L: LogitValue>(c: &VerifyCase, target: &[L]) -> Result<(), TestCaseError> {
    check_verify_mode(c, target, VerifyMode::Stochastic, Some(&c.q))?;
    check_verify_mode(c, target, VerifyMode::Greedy, Some(&c.q))?;
    check_verify_mode(c, target, VerifyMode::Greedy, None)
}

fn check_verify_mode<L: LogitValue>(
    c: &VerifyCase,
    target: &[L],
    mode: VerifyMode,
    draft_probs: Option<&[f32]>,
) -> Result<(), TestCaseError> {
    let req = VerifyRequest {
        target_logits: target,
        vocab: c.vocab,
        draft_tokens: &c.drafts,
        draft_probs,
        masks: c.masks.as_deref(),
        history: &c.history,
        position: c.position,
        params: &c.params,
        mode,
    };
    let fused = Verifier::with_fused_above(0).verify(&req);
    let listed = Verifier::with_fused_above(usize::MAX).verify(&req);
    let default = Verifier::new().verify(&req);
    // Errors carry the offending value (possibly NaN): compare them as text.
    prop_assert_eq!(format!("{default:?}"), format!("{listed:?}"));
    match (&fused, &listed) {
        (Ok(f), Ok(l)) => {
            prop_assert_eq!(f.accepted, l.accepted);
            prop_assert_eq!(&f.tokens, &l.tokens);
            let fb: Vec<u32> = f.logprobs.iter().map(|x| x.to_bits()).collect();
            let lb: Vec<u32> = l.logprobs.iter().map(|x| x.to_bits()).collect();
            prop_assert_eq!(fb, lb);
        }
        _ => prop_assert_eq!(format!("{fused:?}"), format!("{listed:?}")),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn fused_verification_equals_listing_f32(c in verify_case()) {
        check_verify(&c, &c.target)?;
    }

    #[test]
    fn fused_verification_equals_listing_bf16(c in verify_case()) {
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
