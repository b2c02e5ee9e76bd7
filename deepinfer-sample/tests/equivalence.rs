//! The fast sampler equals the sort-then-filter definition (weights, token
//! and log-probability), for f32 and bf16 rows.

use deepinfer_sample::reference::{sample_sorted, sorted_weights};
use deepinfer_sample::sampler::filtered_weights;
use deepinfer_sample::{SampleError, SampleRequest, SamplingParams, mask_words, sample};
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
    (1usize..3000, any::<u64>(), 0u8..4).prop_flat_map(|(vocab, seed, flavour)| {
        let logit = match flavour {
            // Few distinct values: many ties.
            0 => (-3i32..4).prop_map(|v| v as f32 * 0.5).boxed(),
            1 => (-20.0f32..20.0).boxed(),
            2 => (-1.0f32..1.0).prop_map(|v| v * 1e-3).boxed(),
            _ => prop_oneof![(-5.0f32..5.0), Just(0.0f32), Just(-0.0f32)].boxed(),
        };
        (
            proptest::collection::vec(logit, vocab),
            proptest::option::of(proptest::collection::vec(
                prop_oneof![Just(u32::MAX), any::<u32>()],
                mask_words(vocab),
            )),
            proptest::collection::vec(0..vocab as u32, 0..8),
            prop_oneof![Just(0u32), 1u32..60],
            prop_oneof![Just(1.0f32), 0.01f32..1.0],
            prop_oneof![Just(0.0f32), 0.0f32..0.5],
            prop_oneof![Just(0.0f32), Just(0.7f32), Just(1.0f32), Just(2.5f32)],
            prop_oneof![Just(1.0f32), 0.5f32..2.0],
            (-1.0f32..1.0, -1.0f32..1.0),
            proptest::collection::vec((0..vocab as u32, -3.0f32..3.0), 0..4),
            0u64..1_000_000,
        )
            .prop_map(
                move |(
                    logits,
                    mask,
                    history,
                    top_k,
                    top_p,
                    min_p,
                    t,
                    rep,
                    (pres, freq),
                    bias,
                    position,
                )| {
                    Case {
                        logits,
                        mask,
                        history,
                        params: SamplingParams {
                            temperature: t,
                            top_k,
                            top_p,
                            min_p,
                            repetition_penalty: rep,
                            presence_penalty: pres,
                            frequency_penalty: freq,
                            logit_bias: bias,
                            seed,
                            ..SamplingParams::default()
                        },
                        position,
                    }
                },
            )
    })
}

fn check<L: deepinfer_sample::LogitValue>(c: &Case, logits: &[L]) -> Result<(), TestCaseError> {
    let fast = filtered_weights(logits, c.mask.as_deref(), &c.history, &c.params);
    let slow = sorted_weights(logits, c.mask.as_deref(), &c.history, &c.params);
    prop_assert_eq!(&fast, &slow);
    let req = SampleRequest {
        logits,
        mask: c.mask.as_deref(),
        history: &c.history,
        position: c.position,
        params: &c.params,
    };
    match (sample(&req), sample_sorted(&req)) {
        (Ok(a), Ok((token, lp))) => {
            prop_assert_eq!(a.token, token);
            prop_assert_eq!(a.logprob.to_bits(), lp.to_bits());
        }
        (Err(a), Err(b)) => prop_assert_eq!(a, b),
        (a, b) => prop_assert!(false, "fast {:?} vs sorted {:?}", a, b),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn fast_equals_sort_definition_f32(c in case()) {
        check(&c, &c.logits)?;
    }

    #[test]
    fn fast_equals_sort_definition_bf16(c in case()) {
        let row: Vec<half::bf16> = c.logits.iter().map(|&v| half::bf16::from_f32(v)).collect();
        check(&c, &row)?;
    }
}

#[test]
fn all_masked_is_an_error_in_both() {
    let logits = [1.0f32; 40];
    let mask = [0u32, 0];
    let p = SamplingParams::default();
    assert_eq!(
        filtered_weights(&logits, Some(&mask), &[], &p),
        Err(SampleError::MaskForbidsAll)
    );
    assert_eq!(
        sorted_weights(&logits, Some(&mask), &[], &p),
        Err(SampleError::MaskForbidsAll)
    );
}

#[test]
fn pruned_rows_of_a_full_vocabulary_equal_the_sort_definition() {
    // 129,280 logits with a tie at the top and a near-tie within the greedy temperature:
    // the sampler leaves zero-weight tokens out, the reference sorts all of them.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut logits: Vec<f32> = (0..129_280)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 20_000) as f32 * 1e-3 - 10.0
        })
        .collect();
    logits[77] = 11.0;
    logits[90_001] = 11.0;
    logits[5] = 11.0 - 3e-5;
    for (t, top_p, top_k) in [(0.0, 1.0, 0), (1e-4, 1.0, 0), (0.7, 0.9, 0), (1.0, 1.0, 40)] {
        for position in 0..4 {
            let params = SamplingParams {
                temperature: t,
                top_p,
                top_k,
                seed: 11,
                ..SamplingParams::default()
            };
            let req = SampleRequest {
                logits: &logits,
                mask: None,
                history: &[],
                position,
                params: &params,
            };
            let a = sample(&req).unwrap();
            let (token, lp) = sample_sorted(&req).unwrap();
            assert_eq!(
                (a.token, a.logprob.to_bits()),
                (token, lp.to_bits()),
                "t {t}"
            );
        }
    }
}

#[test]
fn ties_of_large_logits_at_the_greedy_temperature_all_survive() {
    // At 9920 the f32 spacing (2^-10) exceeds the zero-weight span at
    // temperature 1e-5 (24e-5), so `top - span` rounds back to `top`: the
    // pruning threshold must still let the ties of the maximum through.
    let mut logits = vec![-9000.0f32; 2000];
    for (i, l) in [(432, 9920.0), (790, 9920.0), (1623, 9920.0), (5, 9919.0)] {
        logits[i] = l;
    }
    let params = SamplingParams {
        temperature: 0.0,
        seed: 18,
        ..SamplingParams::default()
    };
    let mut seen = [false; 3];
    for position in 0..64 {
        let req = SampleRequest {
            logits: &logits,
            mask: None,
            history: &[],
            position,
            params: &params,
        };
        let a = sample(&req).unwrap();
        let (token, lp) = sample_sorted(&req).unwrap();
        assert_eq!((a.token, a.logprob.to_bits()), (token, lp.to_bits()));
        assert_eq!(a.logprob, -(3f32.ln()));
        seen[[432, 790, 1623].iter().position(|&t| t == a.token).unwrap()] = true;
    }
    assert_eq!(seen, [true; 3]);
    assert_eq!(
        filtered_weights(&logits, None, &[], &params),
        sorted_weights(&logits, None, &[], &params)
    );
}
