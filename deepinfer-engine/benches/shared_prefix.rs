//! A shared-prefix trace through the engine's one KV pool, against `deepinfer-kv` alone.
//!
//! `REQUESTS` requests (default 256) over 16 system prompts of `PREFIX` tokens (default 512)
//! with 32 tokens of their own each, one new token, arriving one after another in a fixed
//! random order (each runs before the next arrives). Reports the prompt tokens the engine
//! computed against the trace's minimum (each system prompt once, plus what the hit rule
//! always recomputes), and the cached tokens against those a bare `BlockManager` with the
//! same block size and hit rule reuses on the same trace: with one pool the two must match.
//! Run twice: exact (a hit replays from the nearest stored state) and `bounded_replay`.
//! `cargo bench -p deepinfer-engine --bench shared_prefix` (env `REQUESTS`, `PREFIX`).

mod common;
use common::tokens;
use deepinfer_engine::runtime::{Engine, EngineConfig, GenParams, Request, load_default};
use deepinfer_kernels::CpuBackend;
use deepinfer_kv::{AllocateOptions, BlockManager, BlockManagerConfig, HitRule};
use std::time::Instant;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (requests, prefix) = (env("REQUESTS", 256), env("PREFIX", 512));
    let systems: Vec<Vec<u32>> = (0..16).map(|s| tokens(1000 + s, prefix)).collect();
    let order = tokens(7, requests);
    let trace: Vec<Vec<u32>> = (0..requests)
        .map(|i| {
            let sys = &systems[order[i] as usize % systems.len()];
            [sys.clone(), tokens(5000 + i as u64, 32)].concat()
        })
        .collect();

    let mut rows = Vec::new();
    let (mut pool, mut window, mut slack) = (None, 0, 0);
    for bounded_replay in [false, true] {
        let model = load_default(CpuBackend::new()).expect("the embedded default model");
        let cfg = EngineConfig {
            bounded_replay,
            ..EngineConfig::default()
        };
        (window, slack) = (model.cfg.sliding_window, cfg.spec_slack);
        let mut e = Engine::new(model, cfg).expect("engine");
        pool = Some(e.kv_pool());
        let t0 = Instant::now();
        for (i, p) in trace.iter().enumerate() {
            let mut g = GenParams::greedy(1);
            g.stop_at_eos = false;
            e.generate(vec![Request::new(i as u64, p.clone(), g)])
                .expect("generate");
        }
        rows.push((bounded_replay, t0.elapsed().as_secs_f64(), e.metrics()));
    }
    let pool = pool.expect("one run");

    // deepinfer-kv alone, same blocks and hit rule, each request computed before the next.
    let mut cfg = BlockManagerConfig::new(pool.num_blocks, pool.block_size);
    cfg.hit_rule = HitRule {
        window,
        spec_slack: slack,
    };
    let mut kv = BlockManager::new(cfg).expect("kv");
    let mut kv_reused = 0;
    for (i, p) in trace.iter().enumerate() {
        let a = kv
            .allocate(i as u64, p, AllocateOptions::default())
            .expect("allocate");
        kv_reused += a.plan.reused_tokens;
        kv.mark_computed(i as u64, p.len()).expect("computed");
        kv.free(i as u64).expect("free");
    }

    let total: usize = trace.iter().map(Vec::len).sum();
    // Minimum: every system prompt once; every later request recomputes what the hit rule
    // cannot reuse (its tail, and the prefix past the last reusable block).
    let mut seen = std::collections::HashSet::new();
    let minimum: usize = trace
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let sys = order[i] as usize % systems.len();
            if seen.insert(sys) {
                p.len()
            } else {
                let cap = p.len().saturating_sub(window + slack);
                p.len() - cap.min(prefix) / pool.block_size * pool.block_size
            }
        })
        .sum();
    println!(
        "{requests} requests over 16 system prompts of {prefix} tokens (+32 each), block {}, one after another:",
        pool.block_size
    );
    println!("| | prompt tokens | computed | cached | replayed | wall s |");
    println!("|---|---|---|---|---|---|");
    for (bounded, wall, m) in &rows {
        println!(
            "| engine{} | {total} | {} | {} | {} | {wall:.1} |",
            if *bounded { ", --bounded-replay" } else { "" },
            m.prompt_tokens - m.cached_prompt_tokens,
            m.cached_prompt_tokens,
            m.replayed_tokens,
        );
    }
    println!(
        "| deepinfer-kv alone | {total} | {} | {kv_reused} | | |",
        total - kv_reused
    );
    println!(
        "| trace minimum | {total} | {minimum} | {} | | |",
        total - minimum
    );
}
