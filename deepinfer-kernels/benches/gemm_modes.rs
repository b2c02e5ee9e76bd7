//! Batch-invariant against fast GEMM, on the shapes the engine runs: the backend's `matmul`
//! in both modes and `matrixmultiply::sgemm` called directly (one thread; the fast mode's
//! kernel), timed alternately round after round so every figure of a row sees the same load.
//! Prints GFLOP/s medians per shape, dtype and thread count.
//!
//!   cargo bench -p deepinfer-kernels --bench gemm_modes

use std::hint::black_box;
use std::time::Instant;

use deepinfer_kernels::{Backend, CpuBackend, CpuConfig, CpuTensor};

mod common;
use common::{data, sgemm_reference};

fn secs(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn backend(invariant: bool, threads: usize) -> CpuBackend {
    CpuBackend::with_config(CpuConfig {
        batch_invariant: invariant,
        threads: Some(threads),
    })
    .unwrap()
}

fn weights(b: &CpuBackend, wv: &[f32], n: usize, k: usize, bf16: bool) -> CpuTensor {
    if bf16 {
        let w: Vec<half::bf16> = wv.iter().map(|&v| half::bf16::from_f32(v)).collect();
        b.upload_bf16(&w, &[n, k]).unwrap()
    } else {
        b.upload_f32(wv, &[n, k]).unwrap()
    }
}

fn shape(name: &str, (m, k, n): (usize, usize, usize), threads: usize, rounds: usize) {
    let flop = (2 * m * k * n) as f64;
    let xv = data(m * k, 5);
    let wv = data(n * k, 6);
    let (inv, fast) = (backend(true, threads), backend(false, threads));
    let x = inv.upload_f32(&xv, &[m, k]).unwrap();
    let mut out = vec![0.0f32; m * n];
    for bf16 in [false, true] {
        let (wi, wf) = (
            weights(&inv, &wv, n, k, bf16),
            weights(&fast, &wv, n, k, bf16),
        );
        let (mut ti, mut tf, mut ts) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds + 1 {
            let a = secs(|| {
                black_box(inv.matmul(&x, &wi).unwrap());
            });
            let b = secs(|| {
                black_box(fast.matmul(&x, &wf).unwrap());
            });
            let c = secs(|| {
                sgemm_reference(m, k, n, &xv, &wv, &mut out);
                black_box(out[0]);
            });
            if round > 0 {
                ti.push(flop / a / 1e9);
                tf.push(flop / b / 1e9);
                ts.push(flop / c / 1e9);
            }
        }
        let (i, f, s) = (median(ti), median(tf), median(ts));
        let dtype = if bf16 { "bf16" } else { "f32 " };
        println!(
            "{name:<22} {m:>5}x{k:>5}x{n:>6} {dtype} threads={threads}: invariant {i:6.1} GFLOP/s, fast {f:6.1}, invariant/fast {:.2}, sgemm 1 thread f32 {s:6.1}",
            i / f
        );
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too, briefly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let rounds = if quick { 1 } else { 5 };
    let shapes: &[(&str, (usize, usize, usize))] = if quick {
        &[("tiny", (16, 64, 48))]
    } else {
        &[
            ("prefill hidden 256", (1024, 256, 1024)),
            ("prefill head_dim 512", (1024, 512, 4096)),
            ("prefill hidden 4096", (512, 4096, 4096)),
            ("vocabulary head", (64, 256, 129_280)),
            ("batched decode", (16, 4096, 4096)),
            ("decode head", (1, 256, 129_280)),
            ("decode hidden 256", (1, 256, 1024)),
            ("decode hidden 4096", (1, 4096, 4096)),
        ]
    };
    // An argument that is not a flag keeps the shapes whose name contains it.
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    for threads in [1, 2] {
        for &(name, s) in shapes {
            if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
                continue;
            }
            shape(name, s, threads, rounds);
        }
    }
}
