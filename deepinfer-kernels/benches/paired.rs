//! Paired ratios for a shared machine: GEMV against a plain streaming read of the same number
//! of bytes, and GEMM against `matrixmultiply::sgemm`, timed alternately round after round
//! so that both sides of each ratio see the same load. Prints the median ratio (and the
//! spread) for 1 and 2 threads.
//!
//!   cargo bench -p deepinfer-kernels --bench paired
//!
//! Criterion's sequential groups (`--bench kernels`) give absolute figures; on a loaded
//! machine their ratios drift with the load between groups, which this bench avoids.

use std::hint::black_box;
use std::time::Instant;

use deepinfer_kernels::{Backend, CpuBackend, CpuConfig, QuantFormat, QuantMatrix};

mod common;
use common::{data, gemv_w_bf16, gemv_w_f32, gemv_x, sgemm_reference, stream_read, stream_words};

fn secs(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// Median, min and max.
fn summary(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn gemv(threads: usize, rounds: usize) {
    let bytes = 64usize << 20;
    let k = 4096;
    let b = CpuBackend::with_config(CpuConfig {
        batch_invariant: false,
        threads: Some(threads),
    })
    .unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let words = stream_words(bytes);
    let x = gemv_x(&b, k);
    let w32 = gemv_w_f32(&b, bytes, k);
    let wb = gemv_w_bf16(&b, bytes, k);
    // Quantised weights of 16384 rows (64 MiB as f32): bytes moved are the packed values and
    // scales, so their ratio is in weight bytes per second, not f32 bytes.
    let nq = bytes / 4 / k * 4;
    let wq_f32 = data(nq * k, 8);
    let q8 = QuantMatrix::quantize(&wq_f32, nq, k, QuantFormat::FP8_128_F32).unwrap();
    let q4 = QuantMatrix::quantize(&wq_f32, nq, k, QuantFormat::Mxfp4).unwrap();
    drop(wq_f32);
    let (b8, b4) = (q8.nbytes(), q4.nbytes());
    let (w8, w4) = (b.upload_quant(&q8).unwrap(), b.upload_quant(&q4).unwrap());
    drop((q8, q4));
    let (mut r8, mut r4) = (Vec::new(), Vec::new());
    let (mut r32, mut r16, mut bw) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds + 2 {
        let ts = secs(|| {
            let piece = words.len().div_ceil(threads);
            black_box(pool.install(|| stream_read(black_box(&words), piece)));
        });
        let t32 = secs(|| {
            black_box(b.matmul(&x, &w32).unwrap());
        });
        let t16 = secs(|| {
            black_box(b.matmul(&x, &wb).unwrap());
        });
        let t8 = secs(|| {
            black_box(b.matmul(&x, &w8).unwrap());
        });
        let t4 = secs(|| {
            black_box(b.matmul(&x, &w4).unwrap());
        });
        if round >= 2 {
            // Same bytes on both sides: the time ratio is the bandwidth ratio.
            r32.push(ts / t32);
            r16.push(ts / t16);
            r8.push((b8 as f64 / t8) / (bytes as f64 / ts));
            r4.push((b4 as f64 / t4) / (bytes as f64 / ts));
            bw.push(bytes as f64 / ts / 1e9);
        }
    }
    let (m, lo, hi) = summary(bw);
    println!(
        "gemv threads={threads}: stream read {m:.2} GB/s (min {lo:.2}, max {hi:.2}), 64 MiB, {rounds} rounds"
    );
    for (name, r) in [
        ("f32  4096x4096", r32),
        ("bf16 8192x4096", r16),
        ("fp8 128x128 16384x4096 (weight bytes)", r8),
        ("mxfp4 16384x4096 (weight bytes)", r4),
    ] {
        let (m, lo, hi) = summary(r);
        println!(
            "gemv threads={threads}: {name} m=1 / stream read = {m:.2} (min {lo:.2}, max {hi:.2})"
        );
    }
}

fn gemm(threads: usize, rounds: usize) {
    let (m, k, n) = (512usize, 4096usize, 4096usize);
    let flop = (2 * m * k * n) as f64;
    let xv = data(m * k, 5);
    let wv = data(n * k, 6);
    let b = CpuBackend::with_config(CpuConfig {
        batch_invariant: false,
        threads: Some(threads),
    })
    .unwrap();
    let x = b.upload_f32(&xv, &[m, k]).unwrap();
    let w = b.upload_f32(&wv, &[n, k]).unwrap();
    let mut out = vec![0.0f32; m * n];
    let (mut ours, mut theirs, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds + 1 {
        let tb = secs(|| {
            black_box(b.matmul(&x, &w).unwrap());
        });
        let ts = secs(|| {
            sgemm_reference(m, k, n, &xv, &wv, &mut out);
            black_box(out[0]);
        });
        if round >= 1 {
            ours.push(flop / tb / 1e9);
            theirs.push(flop / ts / 1e9);
            ratio.push(ts / tb);
        }
    }
    let (o, _, _) = summary(ours);
    let (t, _, _) = summary(theirs);
    let (r, lo, hi) = summary(ratio);
    println!(
        "gemm 512x4096x4096 threads={threads}: backend {o:.1} GFLOP/s, matrixmultiply::sgemm (its own single-threaded call) {t:.1} GFLOP/s, ratio {r:.2} (min {lo:.2}, max {hi:.2}), {rounds} rounds"
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too, briefly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let (gv, gm) = if quick { (1, 1) } else { (20, 4) };
    for threads in [1, 2] {
        gemv(threads, gv);
    }
    for threads in [1, 2] {
        gemm(threads, gm);
    }
}
