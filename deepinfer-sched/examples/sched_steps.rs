//! Runs the scheduler bench workload (1,024 running, N waiting) for a number of
//! steps and prints time per step. Meant for load-independent instruction
//! counts: run it under
//! `valgrind --tool=callgrind --toggle-collect='*sched_steps*measured*'`
//! (counts the measured steps only, fake engine included; the inclusive
//! counts of `schedule_into` and `update` are the scheduler's share) and divide
//! by the steps.
//!
//! `cargo run --release -p deepinfer-sched --example sched_steps -- [waiting] [steps]`

use std::time::Duration;

use deepinfer_sched::{StepOutput, StepPlan};

#[path = "../benches/workload/mod.rs"]
mod workload;

fn main() {
    let mut args = std::env::args().skip(1);
    let waiting: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let steps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let (mut s, mut next) = workload::setup(waiting);
    let mut out = StepOutput::default();
    let mut plan = StepPlan::default();
    let cpu0 = workload::cpu_ns();
    let total = measured(&mut s, &mut plan, &mut out, &mut next, steps);
    let cpu = workload::cpu_us_per_step(cpu0, steps);
    println!(
        "waiting {waiting}: {steps} steps, schedule+update {:.1} us/step (wall), on-CPU incl. fake engine {} us/step, running {}",
        total.as_secs_f64() * 1e6 / steps as f64,
        cpu.map_or("n/a".into(), |c| format!("{c:.1}")),
        s.num_running()
    );
}

/// The steady-state steps (a separate function, so callgrind can count only them).
#[inline(never)]
fn measured(
    s: &mut deepinfer_sched::Scheduler,
    plan: &mut StepPlan,
    out: &mut StepOutput,
    next: &mut u64,
    steps: usize,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..steps {
        total += workload::step(s, plan, out, next, 1);
    }
    total
}
