//! The scheduler bench workload, shared by `benches/sched.rs` and
//! `examples/sched_steps.rs` (instruction counts under callgrind).

use std::time::{Duration, Instant};

use deepinfer_kv::{BlockManager, BlockManagerConfig};
use deepinfer_sched::{NewRequest, Scheduler, SchedulerConfig, StepOutput, StepPlan};

/// Running requests kept in the batch.
pub const RUNNING: usize = 1024;

/// A scheduler with `RUNNING` decoding requests and `waiting` queued ones; returns the next free id.
pub fn setup(waiting: usize) -> (Scheduler, u64) {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 4096,
        max_num_seqs: RUNNING,
        max_model_len: 8192,
        max_chunk_tokens: 512,
        ..Default::default()
    };
    let mut c = BlockManagerConfig::new(80_000, 16);
    c.watermark = 0.0;
    let mut s = Scheduler::new(cfg, BlockManager::new(c).unwrap()).unwrap();
    let mut next = 0u64;
    // Staggered lengths so a few requests finish (and a few are admitted) every step.
    for i in 0..RUNNING {
        s.add_request(NewRequest::new(next, vec![7; 64], 64 + (i * 7) % 512))
            .unwrap();
        next += 1;
    }
    let mut out = StepOutput::default();
    let mut plan = StepPlan::default();
    // Prefill everyone, then queue the waiting requests.
    while s.num_waiting() > 0 || s.num_running() < RUNNING {
        step(&mut s, &mut plan, &mut out, &mut next, 0);
    }
    for _ in 0..waiting {
        s.add_request(NewRequest::new(next, vec![9; 64], 512))
            .unwrap();
        next += 1;
    }
    (s, next)
}

/// One step; every finished request is replaced by a new waiting one when `refill` is set.
pub fn step(
    s: &mut Scheduler,
    plan: &mut StepPlan,
    out: &mut StepOutput,
    next: &mut u64,
    refill: usize,
) -> Duration {
    let t0 = Instant::now();
    s.schedule_into(plan).unwrap();
    let t_sched = t0.elapsed();
    out.clear(plan.step);
    for c in &plan.prefill {
        if c.samples {
            out.push_token(c.request, 1, false);
        } else {
            out.push(c.request, &[], false);
        }
    }
    // Decode rows in the dense form: one sampled token per row, in plan order.
    for _ in &plan.decode {
        out.push_decode(1);
    }
    let t1 = Instant::now();
    let res = s.update(out).unwrap();
    let t_update = t1.elapsed();
    if refill > 0 {
        for _ in 0..res.finished.len() {
            s.add_request(NewRequest::new(*next, vec![9; 64], 512))
                .unwrap();
            *next += 1;
        }
    }
    t_sched + t_update
}

/// Nanoseconds this thread has spent on a CPU (Linux schedstat), so figures
/// taken on a shared, oversubscribed machine can exclude time spent waiting
/// for a core.
pub fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// On-CPU microseconds per step since `start` (a [`cpu_ns`] reading) over `steps` steps.
pub fn cpu_us_per_step(start: Option<u64>, steps: usize) -> Option<f64> {
    cpu_ns()
        .zip(start)
        .map(|(b, a)| (b - a) as f64 / steps as f64 / 1e3)
}
