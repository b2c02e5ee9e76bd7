//! Planner and split latency for a 256-request × 5-draft batch (issue targets: `plan` ≤ 20 µs,
//! `split` ≤ 10 µs).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use deepinfer_spec::{
    Plan, Planner, PlannerConfig, Search, SplitScratch, StepTimeModel, fixed_length, split_into,
};

/// Deterministic pseudo-random confidences (xorshift), roughly like a real drafter: high at
/// the first position, decaying after.
fn batch(requests: usize, drafts: usize) -> Vec<Vec<f64>> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..requests)
        .map(|_| {
            let base = 0.4 + 0.6 * next();
            (0..drafts)
                .map(|i| base * (0.95 - 0.05 * i as f64) * (0.8 + 0.2 * next()))
                .collect()
        })
        .collect()
}

/// A jagged step-time table up to 2048 rows: flat while memory bound, then rising, with tile
/// steps every 64 rows.
fn model() -> StepTimeModel {
    let points: Vec<(usize, f64)> = (1..=32)
        .map(|t| {
            let rows = t * 64;
            (
                rows,
                20.0 + (rows as f64 * 0.03 - 6.0).max(0.0) + (t % 3) as f64 * 0.4,
            )
        })
        .collect();
    StepTimeModel::linear(&points).unwrap()
}

fn benches(c: &mut Criterion) {
    let b = batch(256, 5);
    let mut full = Planner::new(model(), PlannerConfig::default()).unwrap();
    let mut greedy = Planner::new(
        model(),
        PlannerConfig {
            search: Search::EarlyStop,
            ..PlannerConfig::default()
        },
    )
    .unwrap();
    let mut out = Plan::default();
    c.bench_function("plan_256x5_full", |bn| {
        bn.iter(|| full.plan_into(black_box(&b), &mut out).unwrap())
    });
    c.bench_function("plan_256x5_early_stop", |bn| {
        bn.iter(|| greedy.plan_into(black_box(&b), &mut out).unwrap())
    });
    let k = full.plan(&b).unwrap().total_drafts();
    let mut scratch = SplitScratch::new();
    let mut rows = Vec::new();
    c.bench_function("split_256x5", |bn| {
        bn.iter(|| split_into(black_box(k), black_box(&b), &mut scratch, &mut rows).unwrap())
    });
    let m = model();
    c.bench_function("fixed_length_256x5", |bn| {
        bn.iter(|| fixed_length(&m, 5, black_box(&b)).unwrap())
    });
    // Yardstick for a loaded machine: the standard library's unstable sort of as many 64-bit
    // keys as the batch has drafts (a plan cannot be much cheaper than ordering its drafts).
    let keys: Vec<u64> = b
        .iter()
        .flatten()
        .map(|&x| x.to_bits().wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let mut work = keys.clone();
    c.bench_function("yardstick_sort_unstable_1280_u64", |bn| {
        bn.iter(|| {
            work.copy_from_slice(&keys);
            work.sort_unstable();
            black_box(&work);
        })
    });
}

criterion_group! {
    name = group;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(group);
