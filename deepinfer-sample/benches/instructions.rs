//! A driver for instruction counts under callgrind: runs one case once on
//! one path, with nothing else in the process that calls the sampler (the
//! criterion bench checks both paths in its setup, which would mix them).
//!
//! ```text
//! cargo bench -p deepinfer-sample --bench instructions --no-run
//! valgrind --tool=callgrind <bench binary> <case> <fused|listing>
//! ```
//! Cases: `verify_t1` and `verify_t1_greedy` (16 rows x 5 drafts x 129,280,
//! target temperature 1),
//! `top_logprobs5` and `top_logprobs5_processed` (64 rows x 129,280,
//! temperature 1). Without arguments (as in `cargo bench`) it runs nothing.

use std::hint::black_box;

use deepinfer_sample::{
    LogprobSource, SampleRequest, Sampler, SamplingParams, Verifier, VerifyMode, VerifyRequest,
};

const VOCAB: usize = 129_280;
const DRAFTS: usize = 5;

/// The bench's pseudo-normal logits (sum of four uniforms, scaled).
fn logits(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..n)
        .map(|_| (next() + next() + next() + next() - 2.0) * 6.0)
        .collect()
}

/// Softmax of the target rows plus noise, and each row's most probable token.
fn drafts(target: &[f32], seed: u64) -> (Vec<f32>, Vec<u32>) {
    let noise = logits(DRAFTS * VOCAB, seed);
    let mut q = Vec::with_capacity(DRAFTS * VOCAB);
    let mut tokens = Vec::with_capacity(DRAFTS);
    for (row, nrow) in target.chunks_exact(VOCAB).zip(noise.chunks_exact(VOCAB)) {
        let z: Vec<f32> = row.iter().zip(nrow).map(|(a, n)| a + 0.1 * n).collect();
        let m = z.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = z.iter().map(|v| (v - m).exp()).collect();
        let s: f32 = e.iter().sum();
        let best = (0..VOCAB)
            .max_by(|&a, &b| e[a].total_cmp(&e[b]))
            .unwrap_or(0);
        tokens.push(best as u32);
        q.extend(e.iter().map(|v| v / s));
        if tokens.len() == DRAFTS {
            break;
        }
    }
    (q, tokens)
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let (Some(case), Some(path)) = (args.first(), args.get(1)) else {
        return;
    };
    let above = if path == "listing" {
        usize::MAX
    } else {
        deepinfer_sample::sampler::FUSED_ABOVE
    };
    match case.as_str() {
        "verify_t1" | "verify_t1_greedy" => {
            const ROWS: usize = 16;
            let targets: Vec<Vec<f32>> = (0..4)
                .map(|b| logits((DRAFTS + 1) * VOCAB, 30 + b))
                .collect();
            let sets: Vec<(Vec<f32>, Vec<u32>)> = targets
                .iter()
                .enumerate()
                .map(|(b, t)| drafts(t, 100 + b as u64))
                .collect();
            let params: Vec<SamplingParams> = (0..ROWS)
                .map(|i| SamplingParams {
                    temperature: 1.0,
                    seed: i as u64,
                    ..SamplingParams::default()
                })
                .collect();
            let mut v = Verifier::with_fused_above(above);
            let mut accepted = 0;
            for (i, p) in params.iter().enumerate() {
                let (q, tokens) = &sets[i % 4];
                let out = v
                    .verify(&VerifyRequest {
                        target_logits: &targets[i % 4],
                        vocab: VOCAB,
                        draft_tokens: tokens,
                        draft_probs: Some(q),
                        masks: None,
                        history: &[],
                        position: 1000,
                        params: p,
                        mode: if case.ends_with("greedy") {
                            VerifyMode::Greedy
                        } else {
                            VerifyMode::Stochastic
                        },
                    })
                    .expect("valid request");
                accepted += out.accepted;
                black_box(out);
            }
            println!(
                "{case} {path}: {accepted} of {} drafts accepted",
                ROWS * DRAFTS
            );
        }
        "top_logprobs5" | "top_logprobs5_processed" => {
            const ROWS: usize = 64;
            let data = logits(ROWS * VOCAB, 2);
            let source = if case.ends_with("processed") {
                LogprobSource::Processed
            } else {
                LogprobSource::Sampled
            };
            let mut s = Sampler::with_fused_above(above);
            for (i, row) in data.chunks_exact(VOCAB).enumerate() {
                let params = SamplingParams {
                    temperature: 1.0,
                    top_logprobs: 5,
                    logprob_source: source,
                    seed: i as u64,
                    ..SamplingParams::default()
                };
                let out = s
                    .sample(&SampleRequest {
                        logits: row,
                        mask: None,
                        history: &[],
                        position: 100,
                        params: &params,
                    })
                    .expect("valid request");
                black_box(out);
            }
        }
        other => eprintln!("unknown case {other}"),
    }
}
