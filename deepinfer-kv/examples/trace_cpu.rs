//! Runs the shared-system-prompt trace of the `kv` bench several times and prints requests per
//! second by wall time and by CPU time of this process (Linux: from /proc/self/stat). CPU time
//! is what to compare with `benches/compare/nano_vllm_trace.py` on a machine shared with other
//! jobs, where wall time depends on the load.
//!
//! `cargo run --release -p deepinfer-kv --example trace_cpu`

use std::time::Instant;

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

fn main() {
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
