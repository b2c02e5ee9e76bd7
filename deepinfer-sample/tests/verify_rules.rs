//! Verification details: masks per position, penalties that see accepted
//! drafts, the residual, and determinism of the (seed, position) streams.

use deepinfer_sample::{SampleRequest, SamplingParams, VerifyMode, VerifyRequest, sample, verify};

const V: usize = 8;

fn rows(rows: &[[f32; V]]) -> Vec<f32> {
    rows.concat()
}

#[test]
fn masked_draft_is_never_accepted() {
    let t = rows(&[[1.0; V], [1.0; V]]);
    let q = vec![1.0 / V as f32; V];
    let mut masks = vec![u32::MAX; 2];
    masks[0] = !(1 << 3); // draft token 3 forbidden at position 0
    for seed in 0..300 {
        let params = SamplingParams {
            seed,
            ..SamplingParams::default()
        };
        let out = verify(&VerifyRequest {
            target_logits: &t,
            vocab: V,
            draft_tokens: &[3],
            draft_probs: Some(&q),
            masks: Some(&masks),
            history: &[],
            position: 9,
            params: &params,
            mode: VerifyMode::Stochastic,
        })
        .unwrap();
        assert_eq!(out.accepted, 0);
        assert_ne!(out.tokens[0], 3);
    }
}

#[test]
fn penalties_see_accepted_drafts() {
    // Position 1 prefers token 2 by 0.5; a presence penalty of 1 applies to
    // token 2 only if draft 0 (token 2) is in the history of position 1.
    let mut r0 = [0.0f32; V];
    r0[2] = 5.0;
    let mut r1 = [0.0f32; V];
    r1[2] = 1.5;
    r1[5] = 1.0;
    let t = rows(&[r0, r1]);
    let params = SamplingParams {
        presence_penalty: 1.0,
        ..SamplingParams::greedy()
    };
    let out = verify(&VerifyRequest {
        target_logits: &t,
        vocab: V,
        draft_tokens: &[2],
        draft_probs: None,
        masks: None,
        history: &[],
        position: 0,
        params: &params,
        mode: VerifyMode::Greedy,
    })
    .unwrap();
    assert_eq!(out.tokens, vec![2, 5]);
}

#[test]
fn identical_draft_and_target_accepts_everything() {
    // q slightly below the filtered target: u * q < p always holds (u < 1).
    let logits = [0.3f32, 1.0, -0.5, 0.0, 2.0, 0.1, -1.0, 0.7];
    let params = SamplingParams::default();
    let (ws, total) =
        deepinfer_sample::sampler::filtered_weights(&logits, None, &[], &params).unwrap();
    let p: Vec<f32> = ws
        .iter()
        .map(|w| (w.1 as f64 / total as f64) as f32)
        .collect();
    let t = rows(&[logits, logits, logits]);
    let q = [p.clone(), p].concat();
    for seed in 0..200 {
        let params = SamplingParams {
            seed,
            ..SamplingParams::default()
        };
        // Drafts follow the target's own samples at those positions.
        let d: Vec<u32> = (0..2)
            .map(|i| {
                sample(&SampleRequest {
                    logits: &logits,
                    mask: None,
                    history: &[],
                    position: 50 + i,
                    params: &params,
                })
                .unwrap()
                .token
            })
            .collect();
        let out = verify(&VerifyRequest {
            target_logits: &t,
            vocab: V,
            draft_tokens: &d,
            draft_probs: Some(&q),
            masks: None,
            history: &[],
            position: 50,
            params: &params,
            mode: VerifyMode::Stochastic,
        })
        .unwrap();
        assert_eq!(out.accepted, 2);
        assert_eq!(&out.tokens[..out.accepted], &d[..out.accepted]);
        {
            // The bonus token is the target's ordinary sample at position 52.
            let bonus = sample(&SampleRequest {
                logits: &logits,
                mask: None,
                history: &[],
                position: 52,
                params: &params,
            })
            .unwrap();
            assert_eq!(out.tokens[2], bonus.token);
            assert_eq!(out.logprobs[2], bonus.logprob);
        }
    }
}

#[test]
fn point_mass_draft_on_unlikely_token_resamples_from_residual() {
    // The draft always proposes token 0, which the target gives little mass:
    // after a rejection, token 0 cannot be drawn again (its residual is 0).
    let mut r = [0.0f32; V];
    r[0] = -3.0;
    let t = rows(&[r, r]);
    let mut q = vec![0.0f32; V];
    q[0] = 1.0;
    let mut rejected = 0;
    for seed in 0..500 {
        let params = SamplingParams {
            seed,
            ..SamplingParams::default()
        };
        let out = verify(&VerifyRequest {
            target_logits: &t,
            vocab: V,
            draft_tokens: &[0],
            draft_probs: Some(&q),
            masks: None,
            history: &[],
            position: 3,
            params: &params,
            mode: VerifyMode::Stochastic,
        })
        .unwrap();
        if out.accepted == 0 {
            rejected += 1;
            assert_ne!(out.tokens[0], 0);
        }
    }
    // p(0) = e^-3 / (e^-3 + 7) ≈ 0.007: nearly every draft is rejected.
    assert!(rejected > 480, "{rejected}");
}
