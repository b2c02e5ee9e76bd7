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
use rayon::prelude::*;

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1 << 24) as f32 - 0.5
        })
        .collect()
}

/// A plain streaming read: the sum of every 32-bit word, all threads (the bandwidth baseline).
fn stream_read(words: &[u32]) -> u32 {
    words
        .par_chunks(1 << 16)
        .map(|c| {
            let mut acc = [0u32; 16];
            for ch in c.chunks_exact(16) {
                for l in 0..16 {
                    acc[l] = acc[l].wrapping_add(ch[l]);
                }
            }
            acc.iter().fold(0u32, |a, &b| a.wrapping_add(b))
        })
        .reduce(|| 0, |a, b| a.wrapping_add(b))
}

fn gemv(c: &mut Criterion) {
    let b = CpuBackend::new();
    let k = 4096;
    let bytes = 64usize << 20;
    let mut g = c.benchmark_group("gemv_64MiB");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Bytes(bytes as u64));
    let words: Vec<u32> = data(bytes / 4, 1).iter().map(|v| v.to_bits()).collect();
    g.bench_function("stream_read", |bch| {
        bch.iter(|| black_box(stream_read(black_box(&words))))
    });
    drop(words);
    let x = b.upload_f32(&data(k, 2), &[1, k]).unwrap();
    let n32 = bytes / 4 / k;
    let w32 = b.upload_f32(&data(n32 * k, 3), &[n32, k]).unwrap();
    g.bench_function("f32", |bch| {
        bch.iter(|| black_box(b.matmul(&x, &w32).unwrap()))
    });
    drop(w32);
    let n16 = bytes / 2 / k;
    let wb: Vec<half::bf16> = data(n16 * k, 4)
        .iter()
        .map(|&v| half::bf16::from_f32(v))
        .collect();
    let wb = b.upload_bf16(&wb, &[n16, k]).unwrap();
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
            // SAFETY: x is [m, k] (row stride k), wᵀ is read with strides (1, k) from the
            // [n, k] buffer, out is [m, n]; all in bounds and out does not alias the inputs.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    1.0,
                    xv.as_ptr(),
                    k as isize,
                    1,
                    wv.as_ptr(),
                    1,
                    k as isize,
                    0.0,
                    out.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
            black_box(out[0])
        })
    });
    g.finish();
}

criterion_group!(benches, gemv, gemm);
criterion_main!(benches);
