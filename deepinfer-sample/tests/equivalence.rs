//! The fast sampler equals the sort-then-filter definition (weights, token
//! and log-probability), for f32 and bf16 rows.

use deepinfer_sample::reference::{sample_sorted, sorted_weights};
use deepinfer_sample::sampler::filtered_weights;
use deepinfer_sample::testing::{self, reference_row};
use deepinfer_sample::{SampleError, SampleRequest, SamplingParams, sample};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn fast_equals_sort_definition_f32(c in reference_row(3000)) {
        testing::check_matches_reference(&c.request()).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn fast_equals_sort_definition_bf16(c in reference_row(3000)) {
        let row = c.bf16_logits();
        testing::check_matches_reference(&c.request_with(&row)).map_err(TestCaseError::fail)?;
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
