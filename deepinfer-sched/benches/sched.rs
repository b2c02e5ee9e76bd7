//! schedule() + update() per step with 1,024 running requests and 100 / 10,000 /
//! 100,000 waiting, with the system allocator; the cost must not grow with the
//! waiting count. (`sched_mimalloc` runs the same steps with the allocator of
//! the `deepinfer` binary.)

use criterion::{Criterion, criterion_group, criterion_main};

mod steps;
mod workload;

fn bench(c: &mut Criterion) {
    steps::bench_steps(c, "schedule_update_1024_running");
}

criterion_group!(benches, bench);
criterion_main!(benches);
