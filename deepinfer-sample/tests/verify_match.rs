//! [`VerifyMode::Match`]: drafts that are a function of the context (argmax
//! drafts) verified by sampling each position as `sample` would.
//!
//! The property: the tokens equal those of sampling position by position
//! without drafts, so the output distribution is the target's. The
//! chi-square test checks that distribution directly and, as a control,
//! shows that feeding argmax drafts to [`VerifyMode::Stochastic`] with
//! `q = softmax(draft logits)` (drafts not drawn from q) is biased.

use deepinfer_sample::testing::{
    self, CHI2_9999, chi_square, degrees_of_freedom as dof, target_distribution as target,
};
use deepinfer_sample::{
    SampleRequest, SamplingParams, VerifyMode, VerifyOutput, VerifyRequest, mask_words, sample,
    verify,
};
use proptest::prelude::*;

/// A token, its log-probability and its alternatives.
type Emitted = (u32, f32, Vec<(u32, f32)>);

/// Sample `n + 1` positions one by one (what decoding without drafts does),
/// stopping after the first position whose token differs from its draft.
fn sequential(
    logits: &[f32],
    v: usize,
    drafts: &[u32],
    masks: Option<&[u32]>,
    history: &[u32],
    position: u64,
    params: &SamplingParams,
) -> Vec<Emitted> {
    let words = mask_words(v);
    let mut hist = history.to_vec();
    let mut out = Vec::new();
    for i in 0..=drafts.len() {
        let s = sample(&SampleRequest {
            logits: &logits[i * v..(i + 1) * v],
            mask: masks.map(|m| &m[i * words..(i + 1) * words]),
            history: &hist,
            position: position + i as u64,
            params,
        })
        .unwrap();
        let go_on = i < drafts.len() && s.token == drafts[i];
        out.push((s.token, s.logprob, s.top_logprobs));
        if !go_on {
            break;
        }
        hist.push(drafts[i]);
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn run(
    logits: &[f32],
    v: usize,
    drafts: &[u32],
    masks: Option<&[u32]>,
    history: &[u32],
    position: u64,
    params: &SamplingParams,
    mode: VerifyMode,
    q: Option<&[f32]>,
) -> VerifyOutput {
    verify(&VerifyRequest {
        target_logits: logits,
        vocab: v,
        draft_tokens: drafts,
        draft_probs: q,
        masks,
        history,
        position,
        params,
        mode,
    })
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Tokens, log-probabilities and alternatives equal those of sampling
    /// each position without drafts, for any drafts, masks and parameters
    /// (near-ties included: logits are drawn from a few values).
    #[test]
    fn match_equals_sampling_without_drafts(
        v in 2usize..40,
        n in 0usize..6,
        level in prop::collection::vec(0u8..4, 6 * 40),
        draft_seed in any::<u64>(),
        with_masks in any::<bool>(),
        history in prop::collection::vec(0u32..40, 0..6),
        position in 0u64..1000,
        params in testing::sampling_params(),
    ) {
        let logits: Vec<f32> = level[..(n + 1) * v].iter().map(|&l| f32::from(l) * 0.5).collect();
        // Drafts from the target's own argmax half the time (so some are accepted).
        let mut x = draft_seed | 1;
        let drafts: Vec<u32> = (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if x % 2 == 0 {
                    let row = &logits[i * v..(i + 1) * v];
                    (0..v).max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a))).unwrap() as u32
                } else {
                    (x % v as u64) as u32
                }
            })
            .collect();
        let history: Vec<u32> = history.into_iter().map(|t| t % v as u32).collect();
        let words = mask_words(v);
        // Masks that always allow token 0, so no row is empty.
        let masks: Option<Vec<u32>> = with_masks.then(|| {
            (0..(n + 1) * words)
                .map(|k| (draft_seed.rotate_left(k as u32) as u32) | u32::from(k % words == 0))
                .collect()
        });
        let want = sequential(&logits, v, &drafts, masks.as_deref(), &history, position, &params);
        let got = run(&logits, v, &drafts, masks.as_deref(), &history, position, &params, VerifyMode::Match, None);
        prop_assert_eq!(got.tokens.len(), got.accepted + 1);
        prop_assert_eq!(&got.tokens[..got.accepted], &drafts[..got.accepted]);
        let got_all: Vec<Emitted> = got
            .tokens
            .iter()
            .zip(&got.logprobs)
            .zip(&got.top_logprobs)
            .map(|((&t, &l), a)| (t, l, a.clone()))
            .collect();
        prop_assert_eq!(got_all, want);
    }
}

fn softmax(l: &[f32]) -> Vec<f32> {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f32 = l.iter().map(|&x| (x - m).exp()).sum();
    l.iter().map(|&x| (x - m).exp() / z).collect()
}

fn argmax(l: &[f32]) -> u32 {
    (0..l.len())
        .max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a)))
        .unwrap() as u32
}

/// Per position, how often each token came out at positions 0..n over many
/// seeds, with the drafts the argmax chain of `draft_logits`.
fn frequencies(
    target_logits: &[f32],
    draft_logits: &[f32],
    v: usize,
    n: usize,
    params: &SamplingParams,
    mode: VerifyMode,
) -> Vec<Vec<u64>> {
    let drafts: Vec<u32> = (0..n)
        .map(|i| argmax(&draft_logits[i * v..(i + 1) * v]))
        .collect();
    let q: Vec<f32> = (0..n)
        .flat_map(|i| softmax(&draft_logits[i * v..(i + 1) * v]))
        .collect();
    let mut counts = vec![vec![0u64; v]; n + 1];
    for seed in 0..20_000u64 {
        let params = SamplingParams {
            seed,
            ..params.clone()
        };
        let out = run(
            target_logits,
            v,
            &drafts,
            None,
            &[],
            17,
            &params,
            mode,
            Some(&q),
        );
        // Position j's token is observed only when drafts ..j were accepted:
        // condition on that (the target does not depend on the drafts here).
        for (j, &t) in out.tokens.iter().enumerate() {
            counts[j][t as usize] += 1;
        }
    }
    counts
}

/// Argmax drafts for 1, 3 and 5 positions over small vocabularies with
/// random-looking targets and draft distributions: every position's token
/// frequencies match the target (chi-square at 99.99 %, fixed seeds). The
/// same drafts through [`VerifyMode::Stochastic`] with `q = softmax` fail.
#[test]
fn argmax_drafts_give_the_target_distribution() {
    const V: usize = 6;
    let mut x = 0x0005_DEEC_E66D_u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x % 1000) as f32 / 1000.0 - 0.5) * 3.0
    };
    let params = SamplingParams {
        temperature: 0.9,
        ..SamplingParams::default()
    };
    let mut biased_somewhere = false;
    for n in [1usize, 3, 5] {
        let target_logits: Vec<f32> = (0..(n + 1) * V).map(|_| next()).collect();
        let draft_logits: Vec<f32> = (0..n * V).map(|_| next()).collect();
        let exact = frequencies(
            &target_logits,
            &draft_logits,
            V,
            n,
            &params,
            VerifyMode::Match,
        );
        for (j, counts) in exact.iter().enumerate() {
            if counts.iter().sum::<u64>() < 500 {
                continue;
            }
            let p = target(&target_logits[j * V..(j + 1) * V], &params);
            let chi = chi_square(counts, &p);
            assert!(
                chi < CHI2_9999[dof(&p)],
                "{n} drafts, position {j}: {counts:?} vs {p:?} (chi2 {chi})"
            );
        }
        let old = frequencies(
            &target_logits,
            &draft_logits,
            V,
            n,
            &params,
            VerifyMode::Stochastic,
        );
        let p = target(&target_logits[..V], &params);
        biased_somewhere |= chi_square(&old[0], &p) > CHI2_9999[V - 1];
    }
    assert!(
        biased_somewhere,
        "the control (argmax drafts judged against softmax q) should be biased"
    );
}

/// The example: target (0.5, 0.5), draft distribution (0.6, 0.4),
/// argmax draft 0. Against q the first token is 0 about 5/6 of the time;
/// matched, half the time.
#[test]
fn two_token_example() {
    let target_logits = [0.0f32, 0.0, 0.0, 0.0];
    let q = [0.6f32, 0.4];
    let params = SamplingParams::default();
    let mut zeros = [0u64; 2];
    for seed in 0..20_000u64 {
        let params = SamplingParams {
            seed,
            ..params.clone()
        };
        for (k, mode) in [VerifyMode::Match, VerifyMode::Stochastic]
            .into_iter()
            .enumerate()
        {
            let out = run(
                &target_logits,
                2,
                &[0],
                None,
                &[],
                3,
                &params,
                mode,
                Some(&q),
            );
            zeros[k] += u64::from(out.tokens[0] == 0);
        }
    }
    let share = zeros.map(|z| z as f64 / 20_000.0);
    assert!((share[0] - 0.5).abs() < 0.02, "matched: {share:?}");
    assert!((share[1] - 5.0 / 6.0).abs() < 0.02, "against q: {share:?}");
}
