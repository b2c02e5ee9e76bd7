//! The `sched` bench's steps with mimalloc as the global allocator, as the
//! `deepinfer` binary runs the scheduler.
//!
//! Why the allocator shows in a scheduler bench: a step touches the history
//! end, KV sequence vectors and record of each of its 1,024 requests, about a
//! thousand small heap objects. The system allocator interleaves them over as
//! many 4 KiB pages; mimalloc keeps equal sizes together and backs its
//! segments with transparent huge pages where the kernel allows them, so the
//! same steps take fewer TLB and cache misses.

use criterion::{Criterion, criterion_group, criterion_main};

mod steps;
mod workload;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn bench(c: &mut Criterion) {
    steps::bench_steps(c, "schedule_update_1024_running_mimalloc");
}

criterion_group!(benches, bench);
criterion_main!(benches);
