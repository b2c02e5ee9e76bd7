//! Emulator cost against the CPU reference backend for the same op (the baseline).
//! The emulator checks every copy and write; this shows what that bookkeeping costs.

use criterion::{Criterion, criterion_group, criterion_main};
use deepinfer_ascend::{AscendBackend, Chip};
use deepinfer_kernels::{Backend, CpuBackend};
use std::hint::black_box;
use std::time::Duration;

fn data(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

fn bench(c: &mut Criterion) {
    let cpu = CpuBackend::new();
    let asc = AscendBackend::emulated(Chip::Ascend950);
    let (rows, dim) = (16, 5120);
    let x = data(rows * dim);
    let w = vec![1.0f32; dim];
    let mut g = c.benchmark_group("rms_norm_16x5120");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    let (cx, cw) = (
        cpu.upload_f32(&x, &[rows, dim]).unwrap(),
        cpu.upload_f32(&w, &[dim]).unwrap(),
    );
    g.bench_function("cpu_reference", |b| {
        b.iter(|| black_box(cpu.rms_norm(&cx, Some(&cw), 1e-6).unwrap()))
    });
    let (ax, aw) = (
        asc.upload_f32(&x, &[rows, dim]).unwrap(),
        asc.upload_f32(&w, &[dim]).unwrap(),
    );
    g.bench_function("ascend_emulated", |b| {
        b.iter(|| black_box(asc.rms_norm(&ax, Some(&aw), 1e-6).unwrap()))
    });
    g.finish();

    let (s, n, d) = (8, 4, 5120);
    let xs = data(s * n * d);
    let out = data(s * d);
    let post = vec![1.0f32; s * n];
    let comb = vec![0.25f32; s * n * n];
    let mut g = c.benchmark_group("hc_expand_8x4x5120");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500));
    let ct = [
        cpu.upload_f32(&xs, &[s, n, d]).unwrap(),
        cpu.upload_f32(&out, &[s, d]).unwrap(),
        cpu.upload_f32(&post, &[s, n]).unwrap(),
        cpu.upload_f32(&comb, &[s, n, n]).unwrap(),
    ];
    g.bench_function("cpu_reference", |b| {
        b.iter(|| black_box(cpu.hc_expand(&ct[0], &ct[1], &ct[2], &ct[3]).unwrap()))
    });
    let at = [
        asc.upload_f32(&xs, &[s, n, d]).unwrap(),
        asc.upload_f32(&out, &[s, d]).unwrap(),
        asc.upload_f32(&post, &[s, n]).unwrap(),
        asc.upload_f32(&comb, &[s, n, n]).unwrap(),
    ];
    g.bench_function("ascend_emulated", |b| {
        b.iter(|| black_box(asc.hc_expand(&at[0], &at[1], &at[2], &at[3]).unwrap()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
