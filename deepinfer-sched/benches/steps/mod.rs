//! The criterion body of the schedule+update bench, shared by `benches/sched.rs`
//! (the system allocator) and `benches/sched_mimalloc.rs` (the allocator the
//! `deepinfer` binary runs with), so the two differ only in the allocator.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use deepinfer_sched::{StepOutput, StepPlan};

use crate::workload::{RUNNING, cpu_ns, cpu_us_per_step, setup, step};

/// Prints wall and on-CPU time per step over 2,000 steps at each waiting count.
fn cpu_report(label: &str) {
    for waiting in [100usize, 10_000, 100_000] {
        let (mut s, mut next) = setup(waiting);
        let mut out = StepOutput::default();
        let mut plan = StepPlan::default();
        let steps = 2000;
        // On-CPU time of the whole loop (fake engine included: an upper bound).
        let t0 = cpu_ns();
        let mut wall = Duration::ZERO;
        for _ in 0..steps {
            wall += step(&mut s, &mut plan, &mut out, &mut next, 1);
        }
        let cpu = cpu_us_per_step(t0, steps);
        eprintln!(
            "{label}, waiting {waiting:>6}: schedule+update wall {:.1} us/step; on-CPU (incl. fake engine) {cpu:.1?} us/step; running {}",
            wall.as_secs_f64() * 1e6 / steps as f64,
            s.num_running()
        );
    }
}

/// schedule() + update() per step with 1,024 running requests and 100 / 10,000 /
/// 100,000 waiting, in the group `group`.
pub fn bench_steps(c: &mut Criterion, group: &str) {
    cpu_report(group);
    let mut g = c.benchmark_group(group);
    // Long windows: on a shared VM the same code runs 30-50 µs per step
    // depending on what its neighbours do for seconds at a time, and a 3 s
    // window lands in one such period; 10 s averages over several.
    g.sample_size(30);
    g.measurement_time(Duration::from_secs(10));
    g.warm_up_time(Duration::from_secs(1));
    for waiting in [100usize, 10_000, 100_000] {
        let (mut s, mut next) = setup(waiting);
        let mut out = StepOutput::default();
        let mut plan = StepPlan::default();
        g.bench_with_input(BenchmarkId::from_parameter(waiting), &waiting, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += step(&mut s, &mut plan, &mut out, &mut next, 1);
                }
                total
            })
        });
        assert!(
            s.num_running() > RUNNING - 16,
            "running fell to {}",
            s.num_running()
        );
    }
    g.finish();
}
