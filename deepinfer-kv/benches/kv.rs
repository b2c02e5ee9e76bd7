//! Benchmarks of the block pool, chained hashing, prefix matching and a serving trace.
//!
//! `cargo bench -p deepinfer-kv` (short runs; the figures are machine dependent).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use deepinfer_kv::{
    AllocateOptions, BlockHasher, BlockManager, BlockManagerConfig, BlockPool, ExtraKeys, HashAlgo,
};

mod trace;

fn alloc_free(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool_allocate_free");
    for n in [10usize, 100, 1_000] {
        g.throughput(Throughput::Elements(n as u64));
        let mut pool = BlockPool::new(100_000, 128, true).unwrap();
        let mut blocks = Vec::with_capacity(n);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| {
                blocks.clear();
                pool.allocate_n(n, &mut blocks).unwrap();
                pool.release_all(black_box(&blocks)).unwrap();
            })
        });
        // Through the manager (prefix caching off: no hashing), prompt of n full blocks.
        let mut cfg = BlockManagerConfig::new(100_000, 16);
        cfg.enable_prefix_caching = false;
        let mut m = BlockManager::new(cfg).unwrap();
        let prompt: Vec<u32> = (0..(n * 16) as u32).collect();
        g.bench_with_input(BenchmarkId::new("manager", n), &n, |b, _| {
            b.iter(|| {
                m.allocate(1, black_box(&prompt), AllocateOptions::default())
                    .unwrap();
                m.free(1).unwrap();
            })
        });
    }
    g.finish();
}

fn hashing(c: &mut Criterion) {
    let tokens: Vec<u32> = (0..131_072u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let mut g = c.benchmark_group("chained_hash");
    g.throughput(Throughput::Elements(tokens.len() as u64));
    for (name, algo) in [
        ("xxh3_128", HashAlgo::Xxh3_128),
        ("sha256", HashAlgo::Sha256),
    ] {
        let mut h = BlockHasher::new(algo, 0);
        let mut out = Vec::with_capacity(tokens.len() / 128);
        g.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                h.hash_chain(black_box(&tokens), 128, &ExtraKeys::none(), &mut out);
                black_box(&out);
            })
        });
    }
    g.finish();
}

fn prefix_match(c: &mut Criterion) {
    let prompt: Vec<u32> = (0..100_000u32).map(|i| i % 50_000).collect();
    let mut m = BlockManager::new(BlockManagerConfig::new(2_000, 128)).unwrap();
    m.allocate(1, &prompt, AllocateOptions::default()).unwrap();
    m.mark_computed(1, prompt.len()).unwrap();
    let mut g = c.benchmark_group("prefix_match_100k_tokens");
    g.bench_function("match_prefix", |b| {
        b.iter(|| {
            let pm = m.match_prefix(black_box(&prompt), &ExtraKeys::none());
            assert_eq!(pm.blocks.len(), 781);
        })
    });
    g.bench_function("allocate_hit_and_free", |b| {
        b.iter(|| {
            let a = m
                .allocate(2, black_box(&prompt), AllocateOptions::default())
                .unwrap();
            assert_eq!(a.plan.reused_tokens, 99_968);
            m.free(2).unwrap();
        })
    });
    g.finish();
}

fn serving_trace(c: &mut Criterion) {
    let prompts = trace::prompts();
    let hit_rate = trace::run(&prompts);
    eprintln!(
        "trace: {} requests, hit rate {:.4} (prefix tokens reused / prompt tokens)",
        trace::REQUESTS,
        hit_rate
    );
    let mut g = c.benchmark_group("trace");
    g.throughput(Throughput::Elements(trace::REQUESTS as u64));
    g.sample_size(10);
    g.bench_function("10k_requests_shared_2048_system_prompt", |b| {
        b.iter(|| black_box(trace::run(&prompts)))
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = alloc_free, hashing, prefix_match, serving_trace
}
criterion_main!(benches);
