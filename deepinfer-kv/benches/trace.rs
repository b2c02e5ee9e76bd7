//! The shared-system-prompt trace used by the `kv` bench (and mirrored by
//! `compare/nano_vllm_trace.py` for the side-by-side run).
//!
//! 10,000 requests; 8 system prompts of 2,048 tokens, request `i` uses prompt `i % 8`; a unique
//! suffix of `64 + (i * 37) % 449` tokens; 128 decoded tokens each; block size 256; at most 256
//! requests running at once. Each step appends one token to every running request; a request
//! that has decoded its 128 tokens is freed and the next one admitted.

use deepinfer_kv::{AllocateOptions, BlockManager, BlockManagerConfig, Slot};

pub const REQUESTS: usize = 10_000;
pub const SYSTEM_PROMPTS: usize = 8;
pub const SYSTEM_LEN: usize = 2_048;
pub const DECODE: usize = 128;
pub const BLOCK: usize = 256;
pub const RUNNING: usize = 256;
pub const POOL: usize = 8_192;

pub fn prompt(i: usize) -> Vec<u32> {
    let sys = (i % SYSTEM_PROMPTS) as u32;
    let suffix = 64 + (i * 37) % 449;
    let mut p: Vec<u32> = (0..SYSTEM_LEN as u32).map(|t| sys * 10_000 + t).collect();
    p.extend((0..suffix as u32).map(|t| 1_000_000 + (i as u32) * 1_000 + t));
    p
}

/// Prompts are built before timing so the bench measures the block manager only.
pub fn prompts() -> Vec<Vec<u32>> {
    (0..REQUESTS).map(prompt).collect()
}

/// Runs the trace; returns the hit rate.
pub fn run(prompts: &[Vec<u32>]) -> f64 {
    let mut cfg = BlockManagerConfig::new(POOL, BLOCK);
    cfg.watermark = 0.0;
    let mut m = BlockManager::new(cfg).expect("config");
    let mut running: Vec<(u64, usize)> = Vec::with_capacity(RUNNING);
    let mut next = 0usize;
    let mut slots: Vec<Slot> = Vec::with_capacity(1);
    while next < prompts.len() || !running.is_empty() {
        while running.len() < RUNNING && next < prompts.len() {
            let p = &prompts[next];
            m.allocate(next as u64, p, AllocateOptions::default())
                .expect("pool sized for the trace");
            m.mark_computed(next as u64, p.len()).expect("known");
            running.push((next as u64, 0));
            next += 1;
        }
        let mut i = 0;
        while i < running.len() {
            let (seq, done) = &mut running[i];
            slots.clear();
            m.append(*seq, &[7 + *done as u32], &mut slots)
                .expect("room");
            let len = m.tokens(*seq).expect("known").len();
            m.mark_computed(*seq, len).expect("known");
            *done += 1;
            if *done == DECODE {
                m.free(*seq).expect("known");
                running.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }
    m.stats().hit_rate()
}
