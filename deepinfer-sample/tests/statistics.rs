//! Statistical correctness with fixed seeds (deterministic, never flaky):
//! empirical distributions over many seeds match the filtered target.

use deepinfer_sample::{
    PhiloxStream, SampleRequest, SamplingParams, VerifyMode, VerifyRequest, sample, verify,
};

use deepinfer_sample::testing::{
    CHI2_9999, chi_square, degrees_of_freedom as dof, target_distribution as target,
};

#[test]
fn sampling_matches_filtered_target() {
    let logits = [1.0f32, 0.2, -0.5, 2.0, 0.0, 1.3, -2.0, 0.7];
    let settings = [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.6,
            top_k: 5,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 1.4,
            top_p: 0.8,
            ..SamplingParams::default()
        },
        SamplingParams {
            min_p: 0.2,
            ..SamplingParams::default()
        },
    ];
    for (si, params) in settings.iter().enumerate() {
        let p = target(&logits, params);
        let mut counts = vec![0u64; logits.len()];
        for seed in 0..20_000u64 {
            let params = SamplingParams {
                seed,
                ..params.clone()
            };
            let req = SampleRequest {
                logits: &logits[..],
                mask: None,
                history: &[],
                position: 3,
                params: &params,
            };
            counts[sample(&req).unwrap().token as usize] += 1;
        }
        let chi = chi_square(&counts, &p);
        assert!(
            chi < CHI2_9999[dof(&p)],
            "setting {si}: chi2 {chi} counts {counts:?} p {p:?}"
        );
    }
}

#[test]
fn positions_give_independent_draws() {
    // One seed, many positions: same distribution.
    let logits = [0.0f32, 0.5, 1.0, -1.0];
    let params = SamplingParams::default();
    let p = target(&logits, &params);
    let mut counts = vec![0u64; 4];
    for position in 0..20_000u64 {
        let req = SampleRequest {
            logits: &logits[..],
            mask: None,
            history: &[],
            position,
            params: &params,
        };
        counts[sample(&req).unwrap().token as usize] += 1;
    }
    assert!(chi_square(&counts, &p) < CHI2_9999[3]);
}

#[test]
fn greedy_picks_top_token_past_a_tiny_margin() {
    let logits = [1.0f32, 1.001, 0.5, 1.0005];
    for seed in 0..2000 {
        let params = SamplingParams {
            seed,
            ..SamplingParams::greedy()
        };
        let req = SampleRequest {
            logits: &logits[..],
            mask: None,
            history: &[],
            position: seed,
            params: &params,
        };
        let out = sample(&req).unwrap();
        assert_eq!(out.token, 1);
        assert_eq!(out.logprob, 0.0);
    }
}

/// Output distribution of speculative verification (first token, and second
/// token given the first draft was accepted) equals the target distribution,
/// whatever the draft distribution.
#[test]
fn speculative_output_follows_target() {
    const V: usize = 6;
    let target_logits: Vec<f32> = [
        [0.5f32, 1.5, -0.3, 0.0, 2.0, -1.0],
        [1.0, -0.2, 0.3, 0.8, -1.5, 0.1],
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    ]
    .concat();
    let params = SamplingParams {
        temperature: 0.9,
        top_k: 5,
        ..SamplingParams::default()
    };
    let p0 = target(&target_logits[..V], &params);
    let p1 = target(&target_logits[V..2 * V], &params);
    let drafts: [[f64; V]; 4] = [
        [1.0 / 6.0; V],                 // uniform
        [0.0, 0.0, 0.9, 0.1, 0.0, 0.0], // mostly on tokens the target dislikes
        [0.1, 0.3, 0.0, 0.1, 0.5, 0.0], // close to the target
        [0.0, 1.0, 0.0, 0.0, 0.0, 0.0], // a point mass
    ];
    for (di, q) in drafts.iter().enumerate() {
        let q32: Vec<f32> = q.iter().chain(q.iter()).map(|&v| v as f32).collect();
        let mut first = vec![0u64; V];
        let mut second = vec![0u64; V];
        let mut accepted_first = 0u64;
        for seed in 0..20_000u64 {
            // Draft tokens drawn from q with an independent stream.
            let mut s = PhiloxStream::new(seed ^ 0xD1CE, 99);
            let mut pick = || {
                let u = s.uniform_f64();
                let mut acc = 0.0;
                for (i, &qi) in q.iter().enumerate() {
                    acc += qi;
                    if u < acc && qi > 0.0 {
                        return i as u32;
                    }
                }
                q.iter().rposition(|&x| x > 0.0).unwrap() as u32
            };
            let d = [pick(), pick()];
            let params = SamplingParams {
                seed,
                ..params.clone()
            };
            let out = verify(&VerifyRequest {
                target_logits: &target_logits,
                vocab: V,
                draft_tokens: &d,
                draft_probs: Some(&q32),
                masks: None,
                history: &[],
                position: 40,
                params: &params,
                mode: VerifyMode::Stochastic,
            })
            .unwrap();
            assert_eq!(out.tokens.len(), out.accepted + 1);
            accepted_first += u64::from(out.accepted >= 1);
            first[out.tokens[0] as usize] += 1;
            if out.tokens.len() >= 2 {
                second[out.tokens[1] as usize] += 1;
            }
        }
        let c0 = chi_square(&first, &p0);
        assert!(
            c0 < CHI2_9999[dof(&p0)],
            "draft {di}: first {first:?} vs {p0:?} chi2 {c0}"
        );
        let c1 = chi_square(&second, &p1);
        assert!(
            c1 < CHI2_9999[dof(&p1)],
            "draft {di}: second {second:?} vs {p1:?} chi2 {c1}"
        );
        // The first draft is accepted with probability sum_x min(p, q).
        let expect: f64 = p0.iter().zip(q).map(|(a, b)| a.min(*b)).sum();
        let n = 20_000.0;
        let rate = accepted_first as f64 / n;
        let sd = (expect * (1.0 - expect) / n).sqrt();
        assert!(
            (rate - expect).abs() <= 5.0 * sd + 1e-4,
            "draft {di}: rate {rate} vs {expect}"
        );
    }
}

#[test]
fn greedy_verification_accepts_the_argmax_chain() {
    const V: usize = 4;
    let t: Vec<f32> = [
        [0.0f32, 3.0, 1.0, 0.0],
        [2.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 5.0],
    ]
    .concat();
    let params = SamplingParams::greedy();
    let run = |d: &[u32]| {
        verify(&VerifyRequest {
            target_logits: &t[..(d.len() + 1) * V],
            vocab: V,
            draft_tokens: d,
            draft_probs: None,
            masks: None,
            history: &[],
            position: 0,
            params: &params,
            mode: VerifyMode::Greedy,
        })
        .unwrap()
    };
    let all = run(&[1, 0]);
    assert_eq!((all.accepted, all.tokens.clone()), (2, vec![1, 0, 3]));
    let miss = run(&[1, 2]);
    assert_eq!((miss.accepted, miss.tokens.clone()), (1, vec![1, 0]));
    let none = run(&[3]);
    assert_eq!((none.accepted, none.tokens.clone()), (0, vec![1]));
}
