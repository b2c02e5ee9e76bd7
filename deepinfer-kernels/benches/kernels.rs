//! CPU kernel benchmarks: GEMV (decode) against a plain streaming read of the same bytes,
//! GEMM (prefill) against `matrixmultiply::sgemm` called directly (quantisation: `benches/quant.rs`).
//!
//!   cargo bench -p deepinfer-kernels --bench kernels
//!
//! Compare ratios within one run (the machine may be shared).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use deepinfer_kernels::{Backend, CpuBackend};

mod common;
use common::{data, gemv_w_bf16, gemv_w_f32, gemv_x, sgemm_reference, stream_read, stream_words};

fn gemv(c: &mut Criterion) {
    let b = CpuBackend::new();
    let k = 4096;
    let bytes = 64usize << 20;
    let mut g = c.benchmark_group("gemv_64MiB");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Bytes(bytes as u64));
    let words = stream_words(bytes);
    g.bench_function("stream_read", |bch| {
        bch.iter(|| black_box(stream_read(black_box(&words), 1 << 16)))
    });
    drop(words);
    let x = gemv_x(&b, k);
    let w32 = gemv_w_f32(&b, bytes, k);
    g.bench_function("f32", |bch| {
        bch.iter(|| black_box(b.matmul(&x, &w32).unwrap()))
    });
    drop(w32);
    let wb = gemv_w_bf16(&b, bytes, k);
    g.bench_function("bf16", |bch| {
        bch.iter(|| black_box(b.matmul(&x, &wb).unwrap()))
    });
    g.finish();
}

fn gemm(c: &mut Criterion) {
    let (m, k, n) = (512usize, 4096usize, 4096usize);
    let mut g = c.benchmark_group("gemm_512x4096x4096");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Elements((2 * m * k * n) as u64)); // FLOP per iteration
    let xv = data(m * k, 5);
    let wv = data(n * k, 6);
    let b = CpuBackend::new();
    let x = b.upload_f32(&xv, &[m, k]).unwrap();
    let w = b.upload_f32(&wv, &[n, k]).unwrap();
    g.bench_function("backend_matmul", |bch| {
        bch.iter(|| black_box(b.matmul(&x, &w).unwrap()))
    });
    let mut out = vec![0.0f32; m * n];
    g.bench_function("matrixmultiply_sgemm_1thread", |bch| {
        bch.iter(|| {
            sgemm_reference(m, k, n, &xv, &wv, &mut out);
            black_box(out[0])
        })
    });
    g.finish();
}

criterion_group!(benches, gemv, gemm);
criterion_main!(benches);
