//! Criterion benches: the 256 x 129,280 sampling case against the streaming
//! memory floor and a sort-based baseline (same group), and verification of
//! 256 rows x 5 drafts.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use deepinfer_sample::reference::sample_sorted;
use deepinfer_sample::sampler::FUSED_ABOVE;
use deepinfer_sample::{
    LogprobSource, SampleRequest, Sampler, SamplingParams, Verifier, VerifyMode, VerifyRequest,
    sample_batch, verify_batch,
};
use rayon::prelude::*;

const ROWS: usize = 256;
const VOCAB: usize = 129_280;
const DRAFTS: usize = 5;

/// Deterministic pseudo-normal logits (sum of four uniforms, scaled).
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

/// One request per `VOCAB`-long row of `data`, at position 100.
fn requests<'a>(data: &'a [f32], params: &'a [SamplingParams]) -> Vec<SampleRequest<'a, f32>> {
    data.chunks_exact(VOCAB)
        .zip(params)
        .map(|(row, p)| SampleRequest {
            logits: row,
            mask: None,
            history: &[],
            position: 100,
            params: p,
        })
        .collect()
}

/// One streaming pass that sums each row (8 lanes so it vectorises).
fn row_sum(row: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for c in row.chunks_exact(8) {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + row.chunks_exact(8).remainder().iter().sum::<f32>()
}

fn bench_sample(c: &mut Criterion) {
    let data = logits(ROWS * VOCAB, 1);
    let params: Vec<SamplingParams> = (0..ROWS)
        .map(|i| SamplingParams {
            temperature: 0.7,
            top_k: 50,
            top_p: 0.9,
            seed: i as u64,
            ..SamplingParams::default()
        })
        .collect();
    let reqs = requests(&data, &params);
    let mut g = c.benchmark_group("sample_256x129280_topk50_topp0.9");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    g.bench_function("streaming_sum_floor", |b| {
        b.iter(|| {
            let s: Vec<f32> = data.par_chunks_exact(VOCAB).map(row_sum).collect();
            black_box(s)
        })
    });
    g.bench_function("sampler", |b| b.iter(|| black_box(sample_batch(&reqs))));
    g.bench_function("sort_baseline", |b| {
        b.iter(|| {
            let r: Vec<_> = reqs.par_iter().map(sample_sorted).collect();
            black_box(r)
        })
    });
    g.finish();

    // Without top-k: every token gets a weight and top-p runs a weighted
    // quickselect over the vocabulary (no sort).
    let params_p: Vec<SamplingParams> = params
        .iter()
        .map(|p| SamplingParams {
            top_k: 0,
            ..p.clone()
        })
        .collect();
    let reqs_p: Vec<SampleRequest<'_, f32>> = reqs
        .iter()
        .zip(&params_p)
        .map(|(r, p)| SampleRequest { params: p, ..*r })
        .collect();
    let mut g = c.benchmark_group("sample_256x129280_topp0.9_no_topk");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    g.bench_function("sampler", |b| b.iter(|| black_box(sample_batch(&reqs_p))));
    g.finish();
}

/// Temperature 1, no top-k: every token keeps a weight. The fused path
/// (default) against the listing path it replaces (`with_fused_above(MAX)`),
/// 64 rows as in the end-to-end run of issue #10.
fn bench_full_vocab(c: &mut Criterion) {
    const FULL_ROWS: usize = 64;
    let data = logits(FULL_ROWS * VOCAB, 2);
    for (name, top_p, top_logprobs, logprob_source) in [
        ("t1", 1.0f32, 0, LogprobSource::Sampled),
        ("t1_topp0.9", 0.9, 0, LogprobSource::Sampled),
        ("t1_top_logprobs5", 1.0, 5, LogprobSource::Sampled),
        (
            "t1_top_logprobs5_processed",
            1.0,
            5,
            LogprobSource::Processed,
        ),
    ] {
        let params: Vec<SamplingParams> = (0..FULL_ROWS)
            .map(|i| SamplingParams {
                temperature: 1.0,
                top_p,
                top_logprobs,
                logprob_source,
                seed: i as u64,
                ..SamplingParams::default()
            })
            .collect();
        let reqs = requests(&data, &params);
        let run = |above: usize| {
            reqs.par_iter()
                .map_init(
                    || Sampler::with_fused_above(above),
                    |s, r| s.sample(r).unwrap(),
                )
                .collect::<Vec<_>>()
        };
        // The paths agree (a few rows: the tests cover the rest).
        let few = &reqs[..4];
        let pick = |above: usize| -> Vec<_> {
            let mut s = Sampler::with_fused_above(above);
            few.iter().map(|r| s.sample(r).unwrap()).collect()
        };
        assert_eq!(pick(0), pick(usize::MAX), "the paths must agree");
        let mut g = c.benchmark_group(format!("full_vocab_64x129280_{name}"));
        g.sample_size(10).measurement_time(Duration::from_secs(2));
        g.bench_function("fused", |b| b.iter(|| black_box(sample_batch(&reqs))));
        g.bench_function("listing_old", |b| b.iter(|| black_box(run(usize::MAX))));
        g.finish();
    }
}

/// Draft distributions for each target block: softmax of the target logits
/// divided by `temp`, perturbed; and each position's most probable token.
fn draft_set(targets: &[Vec<f32>], temp: f32) -> (Vec<Vec<f32>>, Vec<Vec<u32>>) {
    // Draft distribution: softmax of perturbed target logits.
    let drafts: Vec<Vec<f32>> = targets
        .iter()
        .enumerate()
        .map(|(b, t)| {
            let noise = logits(DRAFTS * VOCAB, 100 + b as u64);
            let mut q = Vec::with_capacity(DRAFTS * VOCAB);
            for (row, nrow) in t.chunks_exact(VOCAB).zip(noise.chunks_exact(VOCAB)) {
                let z: Vec<f32> = row
                    .iter()
                    .zip(nrow)
                    .map(|(a, n)| a / temp + 0.1 * n)
                    .collect();
                let m = z.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = z.iter().map(|v| (v - m).exp()).collect();
                let s: f32 = e.iter().sum();
                q.extend(e.iter().map(|v| v / s));
                if q.len() == DRAFTS * VOCAB {
                    break;
                }
            }
            q
        })
        .collect();
    let draft_tokens: Vec<Vec<u32>> = drafts
        .iter()
        .map(|q| {
            q.chunks_exact(VOCAB)
                .map(|r| {
                    let mut best = 0;
                    for (i, &v) in r.iter().enumerate() {
                        if v > r[best] {
                            best = i;
                        }
                    }
                    best as u32
                })
                .collect()
        })
        .collect();
    (drafts, draft_tokens)
}

fn bench_verify(c: &mut Criterion) {
    // 8 distinct target blocks shared by the 256 rows keep memory modest
    // (each row still reads its whole (n+1) x V block).
    const BLOCKS: usize = 8;
    let targets: Vec<Vec<f32>> = (0..BLOCKS)
        .map(|b| logits((DRAFTS + 1) * VOCAB, 10 + b as u64))
        .collect();
    let (drafts, draft_tokens) = draft_set(&targets, 0.7);
    let params: Vec<SamplingParams> = (0..ROWS)
        .map(|i| SamplingParams {
            temperature: 0.7,
            top_k: 50,
            top_p: 0.9,
            seed: i as u64,
            ..SamplingParams::default()
        })
        .collect();
    let mut g = c.benchmark_group("verify_256rows_x5drafts_v129280");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    for mode in [VerifyMode::Stochastic, VerifyMode::Greedy] {
        let reqs: Vec<VerifyRequest<'_, f32>> = (0..ROWS)
            .map(|i| VerifyRequest {
                target_logits: &targets[i % BLOCKS],
                vocab: VOCAB,
                draft_tokens: &draft_tokens[i % BLOCKS],
                draft_probs: Some(&drafts[i % BLOCKS]),
                masks: None,
                history: &[],
                position: 1000,
                params: &params[i],
                mode,
            })
            .collect();
        g.bench_function(format!("{mode:?}"), |b| {
            b.iter(|| black_box(verify_batch(&reqs)))
        });
    }
    g.finish();
}

/// Verification at temperature 1 without top-k (every token keeps a weight):
/// the fused path (default) against the listing path
/// (`Verifier::with_fused_above(MAX)`), 16 rows x 5 drafts.
fn bench_verify_full(c: &mut Criterion) {
    const FULL_ROWS: usize = 16;
    const BLOCKS: usize = 4;
    let targets: Vec<Vec<f32>> = (0..BLOCKS)
        .map(|b| logits((DRAFTS + 1) * VOCAB, 30 + b as u64))
        .collect();
    let (drafts, draft_tokens) = draft_set(&targets, 1.0);
    for (name, top_p) in [("t1", 1.0f32), ("t1_topp0.9", 0.9)] {
        let params: Vec<SamplingParams> = (0..FULL_ROWS)
            .map(|i| SamplingParams {
                temperature: 1.0,
                top_p,
                seed: i as u64,
                ..SamplingParams::default()
            })
            .collect();
        let reqs: Vec<VerifyRequest<'_, f32>> = (0..FULL_ROWS)
            .map(|i| VerifyRequest {
                target_logits: &targets[i % BLOCKS],
                vocab: VOCAB,
                draft_tokens: &draft_tokens[i % BLOCKS],
                draft_probs: Some(&drafts[i % BLOCKS]),
                masks: None,
                history: &[],
                position: 1000,
                params: &params[i],
                mode: VerifyMode::Stochastic,
            })
            .collect();
        let run = |above: usize| {
            reqs.par_iter()
                .map_init(
                    || Verifier::with_fused_above(above),
                    |v, r| v.verify(r).unwrap(),
                )
                .collect::<Vec<_>>()
        };
        let (fused, listed) = (run(FUSED_ABOVE), run(usize::MAX));
        assert_eq!(fused, listed, "the paths must agree");
        let accepted: usize = fused.iter().map(|o| o.accepted).sum();
        eprintln!(
            "verify {name}: {accepted} of {} drafts accepted",
            FULL_ROWS * DRAFTS
        );
        let mut g = c.benchmark_group(format!("verify_full_16rows_x5drafts_v129280_{name}"));
        g.sample_size(10).measurement_time(Duration::from_secs(2));
        g.bench_function("fused", |b| b.iter(|| black_box(verify_batch(&reqs))));
        g.bench_function("listing_old", |b| b.iter(|| black_box(run(usize::MAX))));
        g.finish();
    }
}

/// 64 greedy rows, one thread, against a plain streaming sum of the same
/// rows (same run). "cold": 64 distinct rows (33 MB of f32, from memory);
/// "hot": 2 rows sampled 32 times each (from cache), which shows the
/// compute cost. f32 and bf16 logits.
fn bench_greedy(c: &mut Criterion) {
    const GREEDY_ROWS: usize = 64;
    let mut g = c.benchmark_group("greedy_64x129280");
    g.sample_size(10).measurement_time(Duration::from_secs(2));
    let params: Vec<SamplingParams> = (0..GREEDY_ROWS)
        .map(|i| SamplingParams {
            seed: i as u64,
            ..SamplingParams::greedy()
        })
        .collect();
    for (name, distinct) in [("cold", GREEDY_ROWS), ("hot", 2)] {
        let data = logits(distinct * VOCAB, 7);
        let bdata: Vec<half::bf16> = data.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let row = |i: usize| (i % distinct) * VOCAB..(i % distinct + 1) * VOCAB;
        let reqs: Vec<SampleRequest<'_, f32>> = (0..GREEDY_ROWS)
            .map(|i| SampleRequest {
                logits: &data[row(i)],
                mask: None,
                history: &[],
                position: 100,
                params: &params[i],
            })
            .collect();
        let breqs: Vec<SampleRequest<'_, half::bf16>> = (0..GREEDY_ROWS)
            .map(|i| SampleRequest {
                logits: &bdata[row(i)],
                mask: None,
                history: &[],
                position: 100,
                params: &params[i],
            })
            .collect();
        g.bench_function(format!("{name}/f32_sum_floor"), |b| {
            b.iter(|| {
                let t: Vec<f32> = reqs.iter().map(|r| row_sum(r.logits)).collect();
                black_box(t)
            })
        });
        let mut sampler = Sampler::new();
        g.bench_function(format!("{name}/f32_sampler"), |b| {
            b.iter(|| {
                let t: Vec<u32> = reqs
                    .iter()
                    .map(|r| sampler.sample(r).unwrap().token)
                    .collect();
                black_box(t)
            })
        });
        g.bench_function(format!("{name}/bf16_sampler"), |b| {
            b.iter(|| {
                let t: Vec<u32> = breqs
                    .iter()
                    .map(|r| sampler.sample(r).unwrap().token)
                    .collect();
                black_box(t)
            })
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_sample,
    bench_full_vocab,
    bench_verify,
    bench_verify_full,
    bench_greedy
);
criterion_main!(benches);
