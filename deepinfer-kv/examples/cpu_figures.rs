//! The bench figures by CPU time of this process (Linux: from /proc/self/stat) as well as by
//! wall time: on a machine shared with other jobs, wall time depends on the load, CPU time much
//! less. Runs allocate + free, chained hashing, the 100,000-token prefix match and the
//! shared-system-prompt trace of the `kv` bench (compare the trace with
//! `benches/compare/nano_vllm_trace.py`, which reports the same two figures).
//!
//! `cargo run --release -p deepinfer-kv --example cpu_figures`

use std::hint::black_box;
use std::time::Instant;

use deepinfer_kv::{
    AllocateOptions, BlockHasher, BlockManager, BlockManagerConfig, BlockPool, ExtraKeys, HashAlgo,
};

#[path = "../benches/trace.rs"]
mod trace;

/// User + system CPU seconds of this process, if the platform exposes them.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // The kernel reports in USER_HZ, 100 on every mainstream Linux configuration.
    Some(ticks / 100.0)
}

/// Runs `f` `iters` times; returns (best wall seconds per iteration, mean CPU seconds per iteration).
fn measure(iters: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut best = f64::MAX;
    let c0 = cpu_seconds();
    for _ in 0..iters {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    let cpu = match (c0, cpu_seconds()) {
        (Some(a), Some(b)) => (b - a) / iters as f64,
        _ => f64::NAN,
    };
    (best, cpu)
}

fn micro() {
    for n in [10usize, 100, 1_000] {
        let mut pool = BlockPool::new(100_000, 128, true).expect("pool");
        let mut blocks = Vec::with_capacity(n);
        let iters = 20_000_000 / n;
        let (wall, cpu) = measure(iters, || {
            blocks.clear();
            pool.allocate_n(n, &mut blocks).expect("room");
            pool.release_all(black_box(&blocks)).expect("held");
        });
        println!(
            "allocate+free {n:>5} blocks: {:.1} ns/block by CPU time, {:.1} ns/block best wall",
            cpu * 1e9 / n as f64,
            wall * 1e9 / n as f64
        );
    }
    let tokens: Vec<u32> = (0..131_072u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let mut h = BlockHasher::new(HashAlgo::Xxh3_128, 0);
    let mut out = Vec::new();
    let (wall, cpu) = measure(2_000, || {
        out.clear();
        h.hash_chain(black_box(&tokens), 128, &ExtraKeys::none(), &mut out);
    });
    println!(
        "chained xxh3-128 hashing: {:.0} M tokens/s by CPU time, {:.0} M tokens/s best wall",
        tokens.len() as f64 / cpu / 1e6,
        tokens.len() as f64 / wall / 1e6
    );
    let prompt: Vec<u32> = (0..100_000u32).map(|i| i % 50_000).collect();
    let mut m = BlockManager::new(BlockManagerConfig::new(2_000, 128)).expect("config");
    m.allocate(1, &prompt, AllocateOptions::default())
        .expect("room");
    m.mark_computed(1, prompt.len()).expect("known");
    let (wall, cpu) = measure(2_000, || {
        let pm = m.match_prefix(black_box(&prompt), &ExtraKeys::none());
        assert_eq!(pm.blocks.len(), 781);
    });
    println!(
        "prefix match, 100,000-token prompt, warm cache: {:.0} us by CPU time, {:.0} us best wall",
        cpu * 1e6,
        wall * 1e6
    );
}

fn main() {
    micro();
    let prompts = trace::prompts();
    // CPU time has a 10 ms tick: measure all runs together and divide.
    let runs = 10;
    let mut best_wall = f64::MAX;
    let mut rate = 0.0;
    let cpu_start = cpu_seconds();
    for _ in 0..runs {
        let t = Instant::now();
        rate = trace::run(&prompts);
        best_wall = best_wall.min(t.elapsed().as_secs_f64());
    }
    let cpu = match (cpu_start, cpu_seconds()) {
        (Some(a), Some(b)) => (b - a) / runs as f64,
        _ => f64::NAN,
    };
    let n = trace::REQUESTS as f64;
    println!(
        "deepinfer-kv trace: {:.0} requests/s by wall time (best of {runs}), {:.0} requests/s by CPU time (mean), hit rate {rate:.4}",
        n / best_wall,
        n / cpu
    );
}
