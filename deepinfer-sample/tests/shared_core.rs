//! The public pieces a GPU kernel mirrors give the sampler's answer, and the
//! integer CDF and the RNG keep their invariants on arbitrary input.

use deepinfer_sample::fixed_point::pick;
use deepinfer_sample::sampler::{draw_index, filtered_weights};
use deepinfer_sample::{DrawKind, PhiloxStream, SampleRequest, SamplingParams, sample};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Filtered weights + `draw_index` (what a kernel implements) pick the
    /// sampler's token.
    #[test]
    fn weights_plus_draw_index_equal_sample(
        logits in proptest::collection::vec(-6.0f32..6.0, 1..400),
        seed in any::<u64>(),
        position in any::<u64>(),
        top_k in 0u32..30,
        top_p in 0.05f32..=1.0,
    ) {
        let params = SamplingParams { top_k, top_p, seed, temperature: 0.8, ..SamplingParams::default() };
        let (ws, _) = filtered_weights(&logits, None, &[], &params).unwrap();
        let weights: Vec<u64> = ws.iter().map(|w| w.1).collect();
        let i = draw_index(&weights, seed, position, DrawKind::Sample).unwrap();
        let req = SampleRequest { logits: &logits, mask: None, history: &[], position, params: &params };
        prop_assert_eq!(sample(&req).unwrap().token, ws[i].0);
    }

    /// The integer CDF is monotone in the target and never lands on a
    /// zero weight, for any weights (including huge and zero ones).
    #[test]
    fn cdf_is_monotone(weights in proptest::collection::vec(
        prop_oneof![Just(0u64), 0u64..10, 0u64..(1u64 << 32), Just(1u64 << 32)], 1..300),
        targets in proptest::collection::vec(any::<u64>(), 1..50),
    ) {
        let total: u64 = weights.iter().sum();
        prop_assume!(total > 0);
        let mut ts: Vec<u64> = targets.iter().map(|t| t % total).collect();
        ts.sort();
        let mut last = 0;
        for t in ts {
            let i = pick(&weights, t).unwrap();
            prop_assert!(i >= last);
            prop_assert!(weights[i] > 0);
            let before: u64 = weights[..i].iter().sum();
            prop_assert!(before <= t && t < before + weights[i]);
            last = i;
        }
        prop_assert_eq!(pick(&weights, total), None);
    }

    /// Unbiased integers stay in range; uniforms stay in [0, 1).
    #[test]
    fn stream_ranges(seed in any::<u64>(), offset in any::<u64>(), n in 1u64..) {
        let mut s = PhiloxStream::new(seed, offset);
        prop_assert!(s.below(n) < n);
        let u = s.uniform_f64();
        prop_assert!((0.0..1.0).contains(&u));
        let f = s.uniform_f32();
        prop_assert!((0.0..1.0).contains(&f));
    }
}

/// `below` has no modulo bias: for n = 3 * 2^62 a modulo reduction of a
/// 64-bit draw would favour the lower third 2:1; rejection keeps thirds equal.
#[test]
fn below_has_no_modulo_bias() {
    let n = 3u64 << 62;
    let mut thirds = [0u32; 3];
    for off in 0..30_000 {
        let v = PhiloxStream::new(77, off).below(n);
        thirds[(v / (1u64 << 62)) as usize] += 1;
    }
    for &c in &thirds {
        assert!((9_400..10_600).contains(&c), "{thirds:?}");
    }
}
