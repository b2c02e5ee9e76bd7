//! The persistent prefix cache on the embedded default model: time to first token of
//! requests whose shared prefix a previous "process" (an engine dropped before the next is
//! built, with a fresh model load) left in `kv_cache_dir`, against the same requests cold.
//! Both are run back to back in this process.
//!
//! 1. 16 requests sharing a 2,000-token prefix (each with 32 tokens of its own), submitted
//!    together: mean and max TTFT, wall time, prompt tokens computed.
//! 2. One request per prefix length (256 … 4,000 tokens): TTFT cold and from disk, to show
//!    where loading stops paying (the crossover).
//!
//! The state files are read back from the page cache (they were just written); a cold
//! SSD adds its read time. `cargo bench -p deepinfer-engine --bench kv_cache_dir`

mod common;
use common::tokens;
use deepinfer_engine::runtime::{Engine, EngineConfig, GenParams, Output, Request, load_default};
use deepinfer_kernels::CpuBackend;
use std::path::Path;
use std::time::Instant;

fn shared_requests(prefix: usize, n: u64, tail_seed: u64) -> Vec<Request> {
    let shared = tokens(7, prefix);
    (0..n)
        .map(|i| {
            let mut p = shared.clone();
            p.extend(tokens(tail_seed + i, 32));
            let mut g = GenParams::greedy(1);
            g.stop_at_eos = false;
            Request::new(i, p, g)
        })
        .collect()
}

struct Run {
    outs: Vec<Output>,
    wall_ms: f64,
    computed: u64,
    disk: u64,
}

fn run(dir: Option<&Path>, reqs: Vec<Request>) -> Run {
    let model = load_default(CpuBackend::new()).expect("the embedded default model");
    let mut e = Engine::new(
        model,
        EngineConfig {
            kv_cache_dir: dir.map(Path::to_path_buf),
            ..EngineConfig::default()
        },
    )
    .expect("engine");
    let t = Instant::now();
    let outs = e.generate(reqs).expect("generate");
    let wall_ms = t.elapsed().as_secs_f64() * 1e3;
    let m = e.metrics();
    e.flush_kv_cache_dir();
    Run {
        outs,
        wall_ms,
        computed: m.prompt_tokens - m.cached_prompt_tokens,
        disk: m.cached_disk_tokens,
    }
}

fn ttft(r: &Run) -> (f64, f64) {
    let t: Vec<f64> = r.outs.iter().map(|o| o.timing.ttft_ms).collect();
    let mean = t.iter().sum::<f64>() / t.len() as f64;
    (mean, t.iter().copied().fold(0.0, f64::max))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    // 1. 16 requests sharing 2,000 tokens: the first process fills the directory.
    let cold = run(None, shared_requests(2000, 16, 1000));
    let _fill = run(Some(tmp.path()), shared_requests(2000, 16, 2000));
    let warm = run(Some(tmp.path()), shared_requests(2000, 16, 1000));
    let same = cold
        .outs
        .iter()
        .zip(&warm.outs)
        .all(|(a, b)| a.token_ids == b.token_ids);
    println!("16 requests sharing a 2,000-token prefix (32 own tokens each), 1 new token:");
    println!("| run | mean TTFT ms | max TTFT ms | wall ms | prompt tokens computed | from disk |");
    println!("|---|---|---|---|---|---|");
    for (name, r) in [("cold", &cold), ("second process, disk tier", &warm)] {
        let (mean, max) = ttft(r);
        println!(
            "| {name} | {mean:.1} | {max:.1} | {:.1} | {} | {} |",
            r.wall_ms, r.computed, r.disk
        );
    }
    println!("same tokens: {same}\n");

    // 2. One request per prefix length.
    println!("One request, prefix of L tokens + 32 own:");
    println!("| L | cold TTFT ms | disk TTFT ms | ratio |");
    println!("|---|---|---|---|");
    for len in [256usize, 512, 1000, 2000, 4000] {
        let d = tempfile::tempdir().expect("temp dir");
        let cold = run(None, shared_requests(len, 1, 10));
        let _fill = run(Some(d.path()), shared_requests(len, 1, 20));
        let warm = run(Some(d.path()), shared_requests(len, 1, 10));
        let (c, w) = (ttft(&cold).0, ttft(&warm).0);
        println!("| {len} | {c:.1} | {w:.1} | {:.2} |", c / w);
    }
}
