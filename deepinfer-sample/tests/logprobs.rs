//! Log-probabilities: values against a float reference, ordering of the
//! alternatives (ties by token id), and the penalty arithmetic.

use deepinfer_sample::{LogprobSource, SampleRequest, SamplingParams, sample};

fn run(logits: &[f32], history: &[u32], params: &SamplingParams) -> deepinfer_sample::SampleOutput {
    sample(&SampleRequest {
        logits,
        mask: None,
        history,
        position: 1,
        params,
    })
    .unwrap()
}

fn log_softmax(z: &[f64]) -> Vec<f64> {
    let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = z.iter().map(|v| (v - m).exp()).sum();
    z.iter().map(|v| v - m - s.ln()).collect()
}

#[test]
fn processed_logprobs_match_log_softmax() {
    let logits: Vec<f32> = (0..3000)
        .map(|i| ((i * 7919 % 1000) as f32) * 0.01 - 5.0)
        .collect();
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 5,
        top_logprobs: 8,
        logprob_source: LogprobSource::Processed,
        ..SamplingParams::default()
    };
    let out = run(&logits, &[], &params);
    let z: Vec<f64> = logits.iter().map(|&l| l as f64 / 0.8).collect();
    let lp = log_softmax(&z);
    assert!((out.logprob as f64 - lp[out.token as usize]).abs() < 1e-4);
    // Alternatives: the 8 best by logit, ties by id, even beyond top_k = 5.
    let mut ids: Vec<u32> = (0..3000).collect();
    ids.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    assert_eq!(out.top_logprobs.len(), 8);
    for ((id, v), want) in out.top_logprobs.iter().zip(&ids) {
        assert_eq!(id, want);
        assert!((*v as f64 - lp[*id as usize]).abs() < 1e-4);
    }
}

#[test]
fn sampled_logprobs_describe_the_filtered_distribution() {
    let logits = [1.0f32, 3.0, 3.0, 0.0, 2.0];
    let params = SamplingParams {
        top_k: 3,
        top_logprobs: 5,
        ..SamplingParams::default()
    };
    let out = run(&logits, &[], &params);
    // Survivors 1, 2, 4; ties (1 and 2) ordered by id; no entries for the rest.
    let ids: Vec<u32> = out.top_logprobs.iter().map(|a| a.0).collect();
    assert_eq!(ids, vec![1, 2, 4]);
    let z = log_softmax(&[3.0, 3.0, 2.0]);
    for ((_, v), want) in out.top_logprobs.iter().zip(&z) {
        assert!((*v as f64 - want).abs() < 1e-6);
    }
    let total: f64 = out.top_logprobs.iter().map(|a| (a.1 as f64).exp()).sum();
    assert!((total - 1.0).abs() < 1e-6);
}

#[test]
fn penalties_follow_the_documented_arithmetic() {
    let logits = [2.0f32, -1.0, 0.5];
    let params = SamplingParams {
        repetition_penalty: 2.0,
        frequency_penalty: 0.1,
        presence_penalty: 0.3,
        logit_bias: vec![(2, 0.25)],
        top_logprobs: 3,
        logprob_source: LogprobSource::Processed,
        ..SamplingParams::default()
    };
    let out = run(&logits, &[0, 0, 1], &params);
    // token 0: 2 / 2 - 0.1 * 2 - 0.3 = 0.5; token 1: -1 * 2 - 0.1 - 0.3 = -2.4;
    // token 2: 0.5 + 0.25 = 0.75 (bias, not in the history).
    let lp = log_softmax(&[0.5, -2.4, 0.75]);
    let got: Vec<(u32, f32)> = out.top_logprobs.clone();
    assert_eq!(got.iter().map(|a| a.0).collect::<Vec<_>>(), vec![2, 0, 1]);
    for (id, v) in got {
        assert!((v as f64 - lp[id as usize]).abs() < 1e-5, "token {id}");
    }
}
