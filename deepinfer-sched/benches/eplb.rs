//! EPLB rebalance for 64 layers × 256 experts over 64 devices (target: 5 ms).

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use deepinfer_sched::{EplbConfig, ExpertLoad, rebalance, rebalance_incremental};

fn load(layers: usize, experts: usize, salt: usize) -> ExpertLoad {
    let mut data = Vec::with_capacity(layers * experts);
    for l in 0..layers {
        for e in 0..experts {
            // Zipf-like skew with a per-layer permutation.
            let rank = (e * 97 + l * 13 + salt) % experts + 1;
            data.push(1e5 / rank as f64);
        }
    }
    ExpertLoad::new(layers, experts, data).unwrap()
}

fn bench(c: &mut Criterion) {
    let w = load(64, 256, 0);
    let shifted = load(64, 256, 5);
    let hier = EplbConfig {
        slots: 320,
        groups: 8,
        nodes: 8,
        devices: 64,
    };
    let global = EplbConfig {
        nodes: 1,
        groups: 1,
        ..hier
    };
    let mut g = c.benchmark_group("eplb_64x256_on_64");
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(2));
    g.bench_function("hierarchical", |b| b.iter(|| rebalance(&w, &hier).unwrap()));
    g.bench_function("global", |b| b.iter(|| rebalance(&w, &global).unwrap()));
    let current = rebalance(&w, &global).unwrap();
    g.bench_function("incremental_16_moves", |b| {
        b.iter(|| rebalance_incremental(&shifted, &current, 16).unwrap())
    });
    g.finish();
    let p = rebalance(&w, &global).unwrap();
    let inc = rebalance_incremental(&shifted, &current, 16).unwrap();
    let full = rebalance(&shifted, &global).unwrap();
    eprintln!(
        "moe_lb: global {:.4}, hierarchical {:.4}; after load shift: stale {:.4}, incremental(16) {:.4}, full {:.4} (moved {} vs {} per layer on average)",
        p.moe_lb(&w).mean,
        rebalance(&w, &hier).unwrap().moe_lb(&w).mean,
        current.moe_lb(&shifted).mean,
        inc.moe_lb(&shifted).mean,
        full.moe_lb(&shifted).mean,
        inc.moved_from(&current).iter().sum::<usize>() / 64,
        full.moved_from(&current).iter().sum::<usize>() / 64,
    );
}

/// Nanoseconds this thread spent on a CPU (Linux schedstat), so figures taken on
/// a shared, oversubscribed machine exclude time spent waiting for a core.
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// On-CPU time per call of `f`, in ms, over `n` calls.
fn cpu_ms(n: u32, mut f: impl FnMut()) -> Option<f64> {
    let t0 = cpu_ns()?;
    for _ in 0..n {
        f();
    }
    Some((cpu_ns()? - t0) as f64 / n as f64 / 1e6)
}

fn cpu_report() {
    let w = load(64, 256, 0);
    let shifted = load(64, 256, 5);
    let hier = EplbConfig {
        slots: 320,
        groups: 8,
        nodes: 8,
        devices: 64,
    };
    let global = EplbConfig {
        nodes: 1,
        groups: 1,
        ..hier
    };
    let current = rebalance(&w, &global).unwrap();
    let h = cpu_ms(50, || {
        std::hint::black_box(rebalance(&w, &hier).unwrap());
    });
    let g = cpu_ms(50, || {
        std::hint::black_box(rebalance(&w, &global).unwrap());
    });
    let i = cpu_ms(20, || {
        std::hint::black_box(rebalance_incremental(&shifted, &current, 16).unwrap());
    });
    eprintln!(
        "on-CPU ms per rebalance: hierarchical {h:.3?}, global {g:.3?}, incremental(16) {i:.3?}"
    );
}

fn all(c: &mut Criterion) {
    cpu_report();
    bench(c);
}

criterion_group!(benches, all);
criterion_main!(benches);
