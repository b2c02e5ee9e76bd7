//! A row's token and log-probabilities never depend on its batch-mates, its
//! place in the batch or the number of threads.

use deepinfer_sample::testing::{self, Row};
use deepinfer_sample::{SamplingParams, VerifyMode, VerifyRequest};
use proptest::prelude::*;

const VOCAB: usize = 700;

fn requests(rows: &[Row]) -> Vec<deepinfer_sample::SampleRequest<'_, f32>> {
    rows.iter().map(Row::request).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn sampling_is_batch_invariant(rows in proptest::collection::vec(testing::row(VOCAB), 1..12), rot in 0usize..12) {
        // Each row alone, other thread counts, the batch reversed and rotated.
        testing::check_batch_invariant(&requests(&rows), rot).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn verification_is_batch_invariant(
        seeds in proptest::collection::vec(any::<u64>(), 1..8),
        drafts in proptest::collection::vec(proptest::collection::vec(0u32..64, 0..4), 8),
        greedy in any::<bool>(),
    ) {
        const V: usize = 64;
        let n_rows = seeds.len();
        let params: Vec<SamplingParams> = seeds.iter().map(|&s| SamplingParams {
            temperature: 0.9, top_k: 20, seed: s, ..SamplingParams::default()
        }).collect();
        let targets: Vec<Vec<f32>> = (0..n_rows).map(|i| {
            (0..(drafts[i].len() + 1) * V).map(|j| (((j * 37 + i * 11) % 23) as f32) * 0.3).collect()
        }).collect();
        let q: Vec<Vec<f32>> = (0..n_rows).map(|i| {
            let mut q = vec![0f32; drafts[i].len() * V];
            for (r, &d) in drafts[i].iter().enumerate() {
                for x in 0..V { q[r * V + x] = 0.5 / V as f32; }
                q[r * V + d as usize] += 0.5;
            }
            q
        }).collect();
        let reqs: Vec<VerifyRequest<'_, f32>> = (0..n_rows).map(|i| VerifyRequest {
            target_logits: &targets[i],
            vocab: V,
            draft_tokens: &drafts[i],
            draft_probs: Some(&q[i]),
            masks: None,
            history: &[],
            position: 5 + i as u64,
            params: &params[i],
            mode: if greedy { VerifyMode::Greedy } else { VerifyMode::Stochastic },
        }).collect();
        testing::check_verify_batch_invariant(&reqs).map_err(TestCaseError::fail)?;
    }
}
