//! On-device check of the CUDA backend against the CPU backend: `#[ignore]`d, because it needs
//! a GPU. Run by `scripts/device-check.sh` (or
//! `cargo test -p deepinfer-kernels --release --test cuda_device -- --ignored --nocapture --test-threads=1`).
//!
//! Contract checked, op by op (one line per op, all ops run before the test fails):
//! - bit-exact: sampling tokens, MoE expert indices, top-k indices, embedding gather, block copy,
//!   dequantise (FP8 / MXFP4 / NVFP4), quantise (MXFP4, FP8 1×32 UE8M0: codes and scales);
//! - GEMV / GEMM (f32, bf16, FP8, FP4 weights): `|gpu - ref| <= 2e-5 · Σ|x_i w_i| + 1e-30`
//!   per output, `ref` in f64 (the bound of a different f32 summation order at these sizes);
//!   bf16 GEMM through cuBLAS rounds the activations to bf16 first, so its reference does too;
//! - RMSNorm, softmax, SwiGLU, RoPE, MoE weights, sink attention, indexer scores, compressor
//!   pooling: `|gpu - cpu| <= 1e-5 · max(1, |cpu|)`
//!   (libm `expf` / `sincos` / `rsqrtf` differ from Rust's by a few ulp).
//!
//! `cuda_bandwidth_report` prints the bandwidth GEMV (f32, bf16; portable and, on SM100, the
//! 256-bit-load kernels) and sink-attention decode reach, against a device-to-device copy.
//!
//! Run on one NVIDIA H200 (sm_90a) on 2026-11-29: every check passed (figures in the README).

mod common;

use std::time::Instant;

use common::Rng;
use deepinfer_kernels::cuda::CudaBackend;
use deepinfer_kernels::{
    Backend, CpuBackend, QuantFormat, QuantMatrix, RouteParams, RouteScore, SampleRow, ScaleFormat,
};
use half::bf16;

/// Collects one line per check; failures are reported together at the end.
struct Report {
    lines: Vec<String>,
    failed: usize,
}

impl Report {
    fn check(&mut self, what: &str, ok: bool, detail: String) {
        self.lines.push(format!(
            "{} {what}: {detail}",
            if ok { "PASS" } else { "FAIL" }
        ));
        if !ok {
            self.failed += 1;
        }
    }
    fn exact<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, got: &[T], want: &[T]) {
        let bad =
            got.iter().zip(want).filter(|(a, b)| a != b).count() + got.len().abs_diff(want.len());
        self.check(
            what,
            bad == 0,
            format!("{bad} of {} differ (bit-exact)", want.len()),
        );
    }
    fn exact_f32(&mut self, what: &str, got: &[f32], want: &[f32]) {
        let g: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
        let w: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        self.exact(what, &g, &w);
    }
    /// `|g - w| <= rtol · max(1, |w|)`.
    fn close(&mut self, what: &str, got: &[f32], want: &[f32], rtol: f64) {
        let worst = got
            .iter()
            .zip(want)
            .map(|(&g, &w)| (g as f64 - w as f64).abs() / (w.abs() as f64).max(1.0))
            .fold(
                0.0f64,
                |m, e| if e.is_nan() { f64::INFINITY } else { m.max(e) },
            );
        let ok = got.len() == want.len() && worst <= rtol;
        self.check(
            what,
            ok,
            format!("max rel err {worst:.2e} (tol {rtol:.0e})"),
        );
    }
    /// `|g - ref| <= tol · Σ|x w|` per output, with the reference and the bound in f64.
    fn dot_bound(&mut self, what: &str, got: &[f32], x: &[f32], w: &[f32], m: usize, k: usize) {
        let n = w.len() / k;
        let mut worst = 0.0f64;
        for i in 0..m {
            for j in 0..n {
                let (mut r, mut a) = (0.0f64, 0.0f64);
                for t in 0..k {
                    let p = x[i * k + t] as f64 * w[j * k + t] as f64;
                    r += p;
                    a += p.abs();
                }
                let e = (got[i * n + j] as f64 - r).abs() / (a + 1e-30);
                worst = if e.is_nan() {
                    f64::INFINITY
                } else {
                    worst.max(e)
                };
            }
        }
        self.check(
            what,
            worst <= 2e-5,
            format!("max err / Σ|xw| {worst:.2e} (tol 2e-5)"),
        );
    }
}

fn backend() -> CudaBackend {
    CudaBackend::new(0).expect("a CUDA device (this test is for machines with a GPU)")
}

fn bf16_bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()
}

fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

#[test]
#[ignore = "needs a CUDA GPU; run by scripts/device-check.sh"]
fn cuda_ops_match_cpu() {
    let g = backend();
    let c = CpuBackend::batch_invariant();
    let mut rng = Rng::new(2026);
    let mut r = Report {
        lines: vec![format!("device {g:?}, cuBLAS: {}", g.has_cublas())],
        failed: 0,
    };

    // ---- GEMV / GEMM -------------------------------------------------------------------
    for (m, n, k) in [(1usize, 512usize, 4096usize), (4, 300, 1000), (3, 64, 4104)] {
        let x = rng.vec(m * k, 1.0);
        let w = rng.vec(n * k, 1.0);
        let (xd, wd) = (g.upload(&x).unwrap(), g.upload(&w).unwrap());
        let y = g.download(&g.gemv_f32(&xd, &wd, m, n, k).unwrap()).unwrap();
        let wide = g.wide_gemv(k, 8);
        r.dot_bound(
            &format!("gemv_f32 {m}x{n}x{k} wide={wide}"),
            &y,
            &x,
            &w,
            m,
            k,
        );
        let wb = bf16_round(&w);
        let wbd = g.upload(&bf16_bits(&w)).unwrap();
        let y = g
            .download(&g.gemv_bf16(&xd, &wbd, m, n, k).unwrap())
            .unwrap();
        let wide = g.wide_gemv(k, 16);
        r.dot_bound(
            &format!("gemv_bf16 {m}x{n}x{k} wide={wide}"),
            &y,
            &x,
            &wb,
            m,
            k,
        );
    }
    {
        let (m, n, k) = (130usize, 200usize, 260usize);
        let x = rng.vec(m * k, 1.0);
        let w = rng.vec(n * k, 1.0);
        let (xd, wd) = (g.upload(&x).unwrap(), g.upload(&w).unwrap());
        let y = g.download(&g.gemm_f32(&xd, &wd, m, n, k).unwrap()).unwrap();
        r.dot_bound("gemm_f32 (cuBLAS if present)", &y, &x, &w, m, k);
        let y = g
            .download(&g.gemm_f32_portable(&xd, &wd, m, n, k).unwrap())
            .unwrap();
        r.dot_bound("gemm_f32_portable", &y, &x, &w, m, k);
        let wbd = g.upload(&bf16_bits(&w)).unwrap();
        let y = g
            .download(&g.gemm_bf16(&xd, &wbd, m, n, k).unwrap())
            .unwrap();
        // cuBLAS rounds x to bf16; the GEMV fallback does not.
        let xr = if g.has_cublas() {
            bf16_round(&x)
        } else {
            x.clone()
        };
        r.dot_bound("gemm_bf16", &y, &xr, &bf16_round(&w), m, k);
    }

    // ---- quantised weights: dequantise exact, GEMV within the dot bound ------------------
    let formats = [
        ("fp8_128x128_f32", QuantFormat::FP8_128_F32),
        (
            "fp8_1x32_ue8m0",
            QuantFormat::Fp8 {
                block_rows: 1,
                block_cols: 32,
                scale: ScaleFormat::Ue8m0,
            },
        ),
        ("mxfp4", QuantFormat::Mxfp4),
        ("nvfp4", QuantFormat::Nvfp4),
    ];
    for (name, f) in formats {
        let (n, k) = (160usize, 512usize);
        let w = rng.vec(n * k, 3.0);
        let q = QuantMatrix::quantize(&w, n, k, f).unwrap();
        let deq = q.dequantize();
        let qd = g.upload_quant(&q).unwrap();
        let got = g.download(&g.dequantize(&qd).unwrap()).unwrap();
        r.exact_f32(&format!("dequantize {name}"), &got, &deq);
        let x = rng.vec(2 * k, 1.0);
        let y = g
            .download(&g.gemv_quant(&g.upload(&x).unwrap(), &qd, 2).unwrap())
            .unwrap();
        r.dot_bound(&format!("gemv {name}"), &y, &x, &deq, 2, k);
    }
    {
        let (rows, cols) = (24usize, 256usize);
        let x = rng.vec(rows * cols, 5.0);
        let xd = g.upload(&x).unwrap();
        let (qc, sc) = g.quantize_mxfp4(&xd, rows, cols).unwrap();
        let want = QuantMatrix::quantize(&x, rows, cols, QuantFormat::Mxfp4).unwrap();
        r.exact(
            "quantize_mxfp4 codes",
            &g.download(&qc).unwrap(),
            want.data(),
        );
        r.exact(
            "quantize_mxfp4 scales",
            &g.download(&sc).unwrap(),
            want.scale_bytes().unwrap(),
        );
        let f8 = QuantFormat::Fp8 {
            block_rows: 1,
            block_cols: 32,
            scale: ScaleFormat::Ue8m0,
        };
        let (qc, sc) = g.quantize_fp8_ue8m0(&xd, rows, cols).unwrap();
        let want = QuantMatrix::quantize(&x, rows, cols, f8).unwrap();
        r.exact(
            "quantize_fp8_ue8m0 codes",
            &g.download(&qc).unwrap(),
            want.data(),
        );
        r.exact(
            "quantize_fp8_ue8m0 scales",
            &g.download(&sc).unwrap(),
            want.scale_bytes().unwrap(),
        );
    }

    // ---- norm, gather, SwiGLU, RoPE ------------------------------------------------------
    {
        let (s, d) = (5usize, 1000usize);
        let x = rng.vec(s * d, 2.0);
        let w = rng.vec(d, 1.0);
        let got = g
            .download(
                &g.rms_norm(&g.upload(&x).unwrap(), &g.upload(&w).unwrap(), d, 1e-6)
                    .unwrap(),
            )
            .unwrap();
        let want = c
            .download_f32(
                &c.rms_norm(
                    &c.upload_f32(&x, &[s, d]).unwrap(),
                    Some(&c.upload_f32(&w, &[d]).unwrap()),
                    1e-6,
                )
                .unwrap(),
            )
            .unwrap();
        r.close("rms_norm", &got, &want, 1e-5);

        let (rows, row) = (50usize, 96usize);
        let table = rng.vec(rows * row, 1.0);
        let ids: Vec<i64> = (0..17).map(|_| rng.below(rows) as i64).collect();
        let idd = g.upload(&ids).unwrap();
        let want = c
            .download_f32(
                &c.gather_rows(
                    &c.upload_f32(&table, &[rows, row]).unwrap(),
                    &c.upload_i64(&ids, &[ids.len()]).unwrap(),
                )
                .unwrap(),
            )
            .unwrap();
        let got = g
            .download(
                &g.gather_rows_f32(&g.upload(&table).unwrap(), row, &idd)
                    .unwrap(),
            )
            .unwrap();
        r.exact_f32("gather_rows_f32", &got, &want);
        let tb = bf16_round(&table);
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| tb[i as usize * row..(i as usize + 1) * row].to_vec())
            .collect();
        let got = g
            .download(
                &g.gather_rows_bf16(&g.upload(&bf16_bits(&table)).unwrap(), row, &idd)
                    .unwrap(),
            )
            .unwrap();
        r.exact_f32("gather_rows_bf16", &got, &want);

        let n = 3000usize;
        let (gt, up) = (rng.vec(n, 12.0), rng.vec(n, 12.0));
        for limit in [0.0f32, 7.0] {
            let got = g
                .download(
                    &g.swiglu(&g.upload(&gt).unwrap(), &g.upload(&up).unwrap(), limit)
                        .unwrap(),
                )
                .unwrap();
            let want = c
                .download_f32(
                    &c.swiglu(
                        &c.upload_f32(&gt, &[n]).unwrap(),
                        &c.upload_f32(&up, &[n]).unwrap(),
                        limit,
                    )
                    .unwrap(),
                )
                .unwrap();
            r.close(&format!("swiglu limit {limit}"), &got, &want, 1e-5);
        }

        let (s, h, d, half) = (6usize, 4usize, 64usize, 16usize);
        let x = rng.vec(s * h * d, 1.0);
        let pos: Vec<i64> = (0..s as i64).map(|p| p * 37 + 5).collect();
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| 10000f64.powf(-(i as f64) / half as f64))
            .collect();
        for inverse in [false, true] {
            let mut xd = g.upload(&x).unwrap();
            g.rope(&mut xd, s, h, d, &pos, &inv_freq, inverse).unwrap();
            let got = g.download(&xd).unwrap();
            let want = c
                .download_f32(
                    &c.rope(
                        &c.upload_f32(&x, &[s, h, d]).unwrap(),
                        &pos,
                        &inv_freq,
                        inverse,
                    )
                    .unwrap(),
                )
                .unwrap();
            r.close(&format!("rope inverse={inverse}"), &got, &want, 1e-5);
        }
    }

    // ---- MoE routing, attention, block copy, sampling ----------------------------------
    {
        let (s, e) = (9usize, 64usize);
        let logits = rng.vec(s * e, 4.0);
        let bias = rng.vec(e, 0.5);
        for (score, with_bias) in [
            (RouteScore::SqrtSoftplus, true),
            (RouteScore::Softmax, false),
            (RouteScore::Sigmoid, true),
        ] {
            let p = RouteParams {
                score,
                top_k: 6,
                renormalize: score != RouteScore::Softmax,
                scale: 1.5,
            };
            let bd = g.upload(&bias).unwrap();
            let (gi, gw) = g
                .moe_route(&g.upload(&logits).unwrap(), with_bias.then_some(&bd), e, p)
                .unwrap();
            let cb = c.upload_f32(&bias, &[e]).unwrap();
            let (ci, cw) = c
                .moe_route(
                    &c.upload_f32(&logits, &[s, e]).unwrap(),
                    with_bias.then_some(&cb),
                    p,
                )
                .unwrap();
            r.exact(
                &format!("moe_route {score:?} indices"),
                &g.download(&gi).unwrap(),
                &c.download_i32(&ci).unwrap(),
            );
            r.close(
                &format!("moe_route {score:?} weights"),
                &g.download(&gw).unwrap(),
                &c.download_f32(&cw).unwrap(),
                1e-5,
            );
        }

        let (s, h, d, j, kk) = (3usize, 8usize, 128usize, 300usize, 160usize);
        let q = rng.vec(s * h * d, 1.0);
        let kv = rng.vec(j * d, 1.0);
        let sink = rng.vec(h, 1.0);
        let idx: Vec<i32> = (0..s * kk)
            .map(|i| if i % 7 == 3 { -1 } else { rng.below(j) as i32 })
            .collect();
        let scale = 1.0 / (d as f32).sqrt();
        let got = g
            .download(
                &g.sparse_attention(
                    &g.upload(&q).unwrap(),
                    &g.upload(&kv).unwrap(),
                    &g.upload(&idx).unwrap(),
                    &g.upload(&sink).unwrap(),
                    h,
                    d,
                    scale,
                )
                .unwrap(),
            )
            .unwrap();
        let want = c
            .download_f32(
                &c.sparse_attention(
                    &c.upload_f32(&q, &[s, h, d]).unwrap(),
                    &c.upload_f32(&kv, &[j, d]).unwrap(),
                    &c.upload_i32(&idx, &[s, kk]).unwrap(),
                    &c.upload_f32(&sink, &[h]).unwrap(),
                    scale,
                )
                .unwrap(),
            )
            .unwrap();
        r.close("sparse_attention", &got, &want, 1e-5);

        let (blocks, words) = (10usize, 300usize);
        let cache: Vec<u32> = (0..blocks * words)
            .map(|i| i as u32 * 2_654_435_761)
            .collect();
        let pairs = [(1usize, 4usize), (4, 7), (7, 1), (2, 2)];
        let mut cd = g.upload(&cache).unwrap();
        g.copy_blocks(&mut cd, words, &pairs).unwrap();
        let mut want = cache.clone();
        for &(s, d) in &pairs {
            want[d * words..(d + 1) * words].copy_from_slice(&cache[s * words..(s + 1) * words]);
        }
        r.exact("copy_blocks", &g.download(&cd).unwrap(), &want);

        let vocab = 5000usize;
        let rows: Vec<SampleRow> = (0..16)
            .map(|i| SampleRow {
                seed: 1000 + i as u64,
                position: 7 * i as u64,
                temperature: [0.0f32, 0.6, 1.0, 1.7][i % 4],
            })
            .collect();
        let logits = rng.vec(rows.len() * vocab, 6.0);
        let got = g.sample(&g.upload(&logits).unwrap(), vocab, &rows).unwrap();
        let want = c
            .download_i32(
                &c.sample(&c.upload_f32(&logits, &[rows.len(), vocab]).unwrap(), &rows)
                    .unwrap(),
            )
            .unwrap();
        r.exact("sample tokens", &got, &want);
    }

    // ---- softmax, indexer, top-k, compressor -------------------------------------------
    {
        let (rows, d) = (7usize, 777usize);
        let mut x = rng.vec(rows * d, 8.0);
        x[5] = f32::NEG_INFINITY;
        for v in &mut x[d..2 * d] {
            *v = f32::NEG_INFINITY;
        }
        let got = g
            .download(&g.softmax(&g.upload(&x).unwrap(), d).unwrap())
            .unwrap();
        let want = c
            .download_f32(&c.softmax(&c.upload_f32(&x, &[rows, d]).unwrap()).unwrap())
            .unwrap();
        r.close("softmax", &got, &want, 1e-5);

        let (s, hi, di, t) = (4usize, 8usize, 64usize, 700usize);
        let q = rng.vec(s * hi * di, 1.0);
        let k = rng.vec(t * di, 1.0);
        let w = rng.vec(s * hi, 1.0);
        let visible = [700usize, 1, 350, 699];
        let got = g
            .download(
                &g.indexer_scores(
                    &g.upload(&q).unwrap(),
                    &g.upload(&k).unwrap(),
                    &g.upload(&w).unwrap(),
                    &visible,
                    hi,
                    di,
                    0.125,
                )
                .unwrap(),
            )
            .unwrap();
        let scores = c
            .indexer_scores(
                &c.upload_f32(&q, &[s, hi, di]).unwrap(),
                &c.upload_f32(&k, &[t, di]).unwrap(),
                &c.upload_f32(&w, &[s, hi]).unwrap(),
                &visible,
                0.125,
            )
            .unwrap();
        let want = c.download_f32(&scores).unwrap();
        let finite = |v: &[f32]| {
            v.iter()
                .map(|x| if x.is_finite() { *x } else { -1e30 })
                .collect::<Vec<f32>>()
        };
        r.close("indexer_scores", &finite(&got), &finite(&want), 1e-5);
        // Top-k on the CPU's scores (the same input on both sides: indices bit-exact).
        let kk = 64usize;
        let got = g
            .download(&g.topk(&g.upload(&want).unwrap(), t, kk).unwrap())
            .unwrap();
        let want_idx = c.download_i32(&c.topk(&scores, kk).unwrap()).unwrap();
        r.exact("topk indices", &got, &want_idx);

        for (overlap, first) in [(false, false), (true, false), (true, true)] {
            let (n, ratio, cdim) = (6usize, 4usize, 40usize);
            let width = if overlap { 2 * cdim } else { cdim };
            let a = rng.vec(n * ratio * width, 1.0);
            let z = rng.vec(n * ratio * width, 3.0);
            let got = g
                .download(
                    &g.compress_pool(
                        &g.upload(&a).unwrap(),
                        &g.upload(&z).unwrap(),
                        width,
                        ratio,
                        overlap,
                        first,
                    )
                    .unwrap(),
                )
                .unwrap();
            let want = c
                .download_f32(
                    &c.compress_pool(
                        &c.upload_f32(&a, &[n * ratio, width]).unwrap(),
                        &c.upload_f32(&z, &[n * ratio, width]).unwrap(),
                        ratio,
                        overlap,
                        first,
                    )
                    .unwrap(),
                )
                .unwrap();
            r.close(
                &format!("compress_pool overlap={overlap} first_is_context={first}"),
                &got,
                &want,
                1e-5,
            );
        }
    }

    println!("{}", r.lines.join("\n"));
    assert_eq!(r.failed, 0, "{} CUDA checks failed (see above)", r.failed);
}

/// Seconds per call, median of `reps` synchronised runs after one warm-up.
fn time(g: &CudaBackend, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    g.synchronize().unwrap();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            g.synchronize().unwrap();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[reps / 2]
}

#[test]
#[ignore = "needs a CUDA GPU; run by scripts/device-check.sh"]
fn cuda_bandwidth_report() {
    let g = backend();
    let mut rng = Rng::new(7);
    let bytes = 1usize << 30;
    let src = g.upload(&vec![1u32; bytes / 4]).unwrap();
    let mut dst = g.upload(&vec![0u32; bytes / 4]).unwrap();
    // A device-to-device copy into an existing buffer reads and writes every byte (the
    // allocating `copy` would time the allocation too).
    let t = time(&g, 10, || g.copy_into(&src, &mut dst).unwrap());
    let copy_bw = 2.0 * bytes as f64 / t / 1e9;
    println!("device copy 1 GiB: {copy_bw:.0} GB/s (read + write)");
    assert_eq!(
        g.download(&dst).unwrap()[bytes / 4 - 1],
        1,
        "copy_into copied"
    );
    drop((src, dst));

    let k = 8192usize;
    let x = g.upload(&rng.vec(k, 1.0)).unwrap();
    let n32 = (512usize << 20) / 4 / k;
    let w32 = g.upload(&rng.vec(n32 * k, 1.0)).unwrap();
    let t = time(&g, 20, || drop(g.gemv_f32(&x, &w32, 1, n32, k).unwrap()));
    let bw = (n32 * k * 4) as f64 / t / 1e9;
    println!(
        "gemv f32 {n32}x{k} (512 MiB), m=1, wide={}: {bw:.0} GB/s = {:.2} of the copy",
        g.wide_gemv(k, 8),
        bw / copy_bw
    );
    drop(w32);
    let n16 = (512usize << 20) / 2 / k;
    let wb = g.upload(&bf16_bits(&rng.vec(n16 * k, 1.0))).unwrap();
    let t = time(&g, 20, || drop(g.gemv_bf16(&x, &wb, 1, n16, k).unwrap()));
    let bw = (n16 * k * 2) as f64 / t / 1e9;
    println!(
        "gemv bf16 {n16}x{k} (512 MiB), m=1, wide={}: {bw:.0} GB/s = {:.2} of the copy",
        g.wide_gemv(k, 16),
        bw / copy_bw
    );
    drop(wb);

    // Decode attention: 64 rows × 64 heads, 512-dim shared KV head, 640 keys per row
    // (128 window + 512 selected). Bytes: every (row, head) block reads its keys once.
    let (s, h, d, j, kk) = (64usize, 64usize, 512usize, 8192usize, 640usize);
    let q = g.upload(&rng.vec(s * h * d, 1.0)).unwrap();
    let kv = g.upload(&rng.vec(j * d, 1.0)).unwrap();
    let idx: Vec<i32> = (0..s * kk).map(|_| rng.below(j) as i32).collect();
    let idx = g.upload(&idx).unwrap();
    let sink = g.upload(&rng.vec(h, 1.0)).unwrap();
    let t = time(&g, 20, || {
        drop(
            g.sparse_attention(&q, &kv, &idx, &sink, h, d, 0.04)
                .unwrap(),
        )
    });
    let read = (s * h * kk * d * 4) as f64;
    println!(
        "sink attention decode S={s} H={h} d={d} K={kk}: {:.1} µs, {:.0} GB/s of KV rows read per head (L2 serves repeats), {:.2} of the copy",
        t * 1e6,
        read / t / 1e9,
        read / t / 1e9 / copy_bw
    );
}
