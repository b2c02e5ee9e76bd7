//! schedule() + update() per step with 1,024 running requests and 100 / 10,000 /
//! 100,000 waiting; the cost must not grow with the waiting count.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use deepinfer_kv::{BlockManager, BlockManagerConfig};
use deepinfer_sched::{NewRequest, Scheduler, SchedulerConfig, StepOutput};

const RUNNING: usize = 1024;

fn setup(waiting: usize) -> (Scheduler, u64) {
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
    // Prefill everyone, then queue the waiting requests.
    while s.num_waiting() > 0 || s.num_running() < RUNNING {
        step(&mut s, &mut out, &mut next, 0);
    }
    for _ in 0..waiting {
        s.add_request(NewRequest::new(next, vec![9; 64], 512))
            .unwrap();
        next += 1;
    }
    (s, next)
}

/// One step; every finished request is replaced by a new waiting one when `refill` is set.
fn step(s: &mut Scheduler, out: &mut StepOutput, next: &mut u64, refill: usize) -> Duration {
    let t0 = Instant::now();
    let plan = s.schedule().unwrap();
    let t_sched = t0.elapsed();
    out.clear(plan.step);
    for c in &plan.prefill {
        if c.samples {
            out.push(c.request, &[1], false);
        } else {
            out.push(c.request, &[], false);
        }
    }
    for d in &plan.decode {
        out.push(d.request, &[1], false);
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

/// Nanoseconds this thread spent on a CPU (Linux schedstat), so figures taken on
/// a shared, oversubscribed machine exclude time spent waiting for a core.
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn cpu_report() {
    for waiting in [100usize, 10_000, 100_000] {
        let (mut s, mut next) = setup(waiting);
        let mut out = StepOutput::default();
        let steps = 2000;
        // On-CPU time of the whole loop (fake engine included: an upper bound).
        let t0 = cpu_ns();
        let mut wall = Duration::ZERO;
        for _ in 0..steps {
            wall += step(&mut s, &mut out, &mut next, 1);
        }
        let cpu = cpu_ns()
            .zip(t0)
            .map(|(b, a)| (b - a) as f64 / steps as f64 / 1e3);
        eprintln!(
            "waiting {waiting:>6}: schedule+update wall {:.1} us/step; on-CPU (incl. fake engine) {cpu:.1?} us/step; running {}",
            wall.as_secs_f64() * 1e6 / steps as f64,
            s.num_running()
        );
    }
}

fn bench(c: &mut Criterion) {
    cpu_report();
    let mut g = c.benchmark_group("schedule_update_1024_running");
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_millis(500));
    for waiting in [100usize, 10_000, 100_000] {
        let (mut s, mut next) = setup(waiting);
        let mut out = StepOutput::default();
        g.bench_with_input(BenchmarkId::from_parameter(waiting), &waiting, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    total += step(&mut s, &mut out, &mut next, 1);
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

criterion_group!(benches, bench);
criterion_main!(benches);
