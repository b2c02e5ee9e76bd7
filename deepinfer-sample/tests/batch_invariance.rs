//! A row's token and log-probabilities never depend on its batch-mates, its
//! place in the batch or the number of threads.

use deepinfer_sample::{
    LogprobSource, SampleRequest, SamplingParams, VerifyMode, VerifyRequest, mask_words, sample,
    sample_batch, verify, verify_batch,
};
use proptest::prelude::*;

const VOCAB: usize = 700;

#[derive(Debug, Clone)]
struct Row {
    logits: Vec<f32>,
    mask: Option<Vec<u32>>,
    history: Vec<u32>,
    params: SamplingParams,
    position: u64,
}

fn row() -> impl Strategy<Value = Row> {
    (
        proptest::collection::vec(-8.0f32..8.0, VOCAB),
        proptest::option::of(proptest::collection::vec(any::<u32>(), mask_words(VOCAB))),
        proptest::collection::vec(0..VOCAB as u32, 0..6),
        (
            0u32..40,
            prop_oneof![Just(1.0f32), 0.05f32..1.0],
            0.0f32..0.3,
        ),
        (
            prop_oneof![Just(0.0f32), 0.3f32..2.0],
            any::<u64>(),
            0u64..10_000,
        ),
        (0usize..5, any::<bool>(), 0.0f32..0.5),
    )
        .prop_map(
            |(
                logits,
                mask,
                history,
                (top_k, top_p, min_p),
                (t, seed, position),
                (n, processed, pres),
            )| Row {
                logits,
                mask,
                history,
                params: SamplingParams {
                    temperature: t,
                    top_k,
                    top_p,
                    min_p,
                    presence_penalty: pres,
                    seed,
                    top_logprobs: n,
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
}

fn requests(rows: &[Row]) -> Vec<SampleRequest<'_, f32>> {
    rows.iter()
        .map(|r| SampleRequest {
            logits: &r.logits,
            mask: r.mask.as_deref(),
            history: &r.history,
            position: r.position,
            params: &r.params,
        })
        .collect()
}

fn pool(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn sampling_is_batch_invariant(rows in proptest::collection::vec(row(), 1..12), rot in 0usize..12) {
        let reqs = requests(&rows);
        let base = pool(1).install(|| sample_batch(&reqs));
        // Each row alone, with fresh buffers.
        for (r, b) in reqs.iter().zip(&base) {
            prop_assert_eq!(&sample(r), b);
        }
        // Other thread counts.
        for threads in [2, 3] {
            prop_assert_eq!(&pool(threads).install(|| sample_batch(&reqs)), &base);
        }
        // Reordered batch (reverse, then rotate).
        let mut order: Vec<usize> = (0..reqs.len()).rev().collect();
        let k = rot % order.len();
        order.rotate_left(k);
        let shuffled: Vec<_> = order.iter().map(|&i| reqs[i]).collect();
        let out = pool(2).install(|| sample_batch(&shuffled));
        for (pos, &i) in order.iter().enumerate() {
            prop_assert_eq!(&out[pos], &base[i]);
        }
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
        let base = pool(1).install(|| verify_batch(&reqs));
        for (r, b) in reqs.iter().zip(&base) {
            prop_assert_eq!(&verify(r), b);
        }
        prop_assert_eq!(&pool(3).install(|| verify_batch(&reqs)), &base);
        let rev: Vec<_> = reqs.iter().rev().copied().collect();
        let mut out = pool(2).install(|| verify_batch(&rev));
        out.reverse();
        prop_assert_eq!(&out, &base);
    }
}
