//! The Ascend backend (emulated mode) against the deepinfer-kernels CPU reference backend.
//!
//! Tolerances: the Ascend ops take bf16 activations and return bf16 results (except matmul and
//! routing weights, f32), so they agree with the f32 CPU reference within bf16 rounding of the
//! inputs and outputs: stated per test below.

mod common;

use common::Rng;
use deepinfer_ascend::runtime::{LibraryPaths, RuntimeOptions};
use deepinfer_ascend::{ASCEND_OPS, AscendBackend, Chip, Mode};
use deepinfer_kernels::{
    Backend, CpuBackend, DType, QuantFormat, QuantMatrix, RouteParams, RouteScore, ScaleFormat,
    TensorInfo,
};
use half::bf16;

fn rb(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

fn close(got: &[f32], want: &[f32], rel: f32, abs: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel * w.abs() + abs,
            "{what} [{i}]: {g} vs {w}"
        );
    }
}

/// `x [m, k] · wᵀ` on backend `b`, with the weight already uploaded, read back as f32.
fn matmul_host<B: Backend>(b: &B, x: &[f32], m: usize, k: usize, w: &B::Tensor) -> Vec<f32> {
    b.download_f32(&b.matmul(&b.upload_f32(x, &[m, k]).unwrap(), w).unwrap())
        .unwrap()
}

fn backends() -> Vec<AscendBackend> {
    vec![
        AscendBackend::emulated(Chip::Ascend950),
        AscendBackend::emulated(Chip::Ascend910B),
    ]
}

#[test]
fn mode_is_explicit_and_device_mode_fails_without_cann() {
    let b = AscendBackend::emulated(Chip::Ascend910B);
    assert!(matches!(b.runner().mode(), Mode::Emulated(_)));
    assert_eq!(b.name(), "ascend-emulated:ascend910b");
    let opts = RuntimeOptions {
        device: 0,
        libraries: LibraryPaths {
            ascendcl: "/nonexistent/libascendcl.so".into(),
            aclrtc: "/nonexistent/librtc.so".into(),
        },
        cache_dir: None,
    };
    assert!(AscendBackend::device(&opts).is_err());
    assert_eq!(ASCEND_OPS.len(), 6);
}

#[test]
fn rms_norm_matches_cpu() {
    let cpu = CpuBackend::new();
    let mut rng = Rng::new(11);
    for b in backends() {
        for &(rows, dim) in &[(3, 5120), (1, 100), (17, 4097)] {
            let x = rb(&rng.vec(rows * dim, -3.0, 3.0));
            let w = rng.vec(dim, 0.5, 1.5);
            let want = cpu
                .download_f32(
                    &cpu.rms_norm(
                        &cpu.upload_f32(&x, &[rows, dim]).unwrap(),
                        Some(&cpu.upload_f32(&w, &[dim]).unwrap()),
                        1e-6,
                    )
                    .unwrap(),
                )
                .unwrap();
            let got = b
                .download_f32(
                    &b.rms_norm(
                        &b.upload_f32(&x, &[rows, dim]).unwrap(),
                        Some(&b.upload_f32(&w, &[dim]).unwrap()),
                        1e-6,
                    )
                    .unwrap(),
                )
                .unwrap();
            close(&got, &want, 2f32.powi(-8), 1e-6, "rms_norm");
        }
    }
}

#[test]
fn rope_matches_cpu_both_directions() {
    let cpu = CpuBackend::new();
    let mut rng = Rng::new(12);
    let inv: Vec<f64> = (0..32)
        .map(|i| 160000f64.powf(-2.0 * i as f64 / 64.0))
        .collect();
    for b in backends() {
        let (s, h, d) = (3, 8, 512);
        let x = rb(&rng.vec(s * h * d, -2.0, 2.0));
        let pos = [0i64, 77, 65_000];
        for inverse in [false, true] {
            let want = cpu
                .download_f32(
                    &cpu.rope(
                        &cpu.upload_f32(&x, &[s, h, d]).unwrap(),
                        &pos,
                        &inv,
                        inverse,
                    )
                    .unwrap(),
                )
                .unwrap();
            let got = b
                .download_f32(
                    &b.rope(&b.upload_f32(&x, &[s, h, d]).unwrap(), &pos, &inv, inverse)
                        .unwrap(),
                )
                .unwrap();
            // bf16 output rounding of values bounded by |a| + |b| ≤ 4.
            close(&got, &want, 2f32.powi(-8), 1e-4, "rope");
        }
    }
}

#[test]
fn matmul_bf16_and_mx_weights_match_cpu() {
    let cpu = CpuBackend::new();
    let mut rng = Rng::new(13);
    for b in backends() {
        let (m, n, k) = (20, 70, 256);
        let x = rb(&rng.vec(m * k, -1.0, 1.0));
        let w = rng.vec(n * k, -0.5, 0.5);
        // bf16 weights: f32 accumulation on both sides.
        let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        let want = matmul_host(&cpu, &x, m, k, &cpu.upload_bf16(&wb, &[n, k]).unwrap());
        let got = matmul_host(&b, &x, m, k, &b.upload_bf16(&wb, &[n, k]).unwrap());
        close(&got, &want, 1e-4, 1e-4, "matmul bf16");
        // MX weights: the Ascend path also quantises activations to MXFP8 (per-32 E4M3), so it
        // differs from the CPU's f32-activation product by that rounding: |Δ| ≤ 2^-4 Σ|x||w|.
        for fmt in [
            QuantFormat::Mxfp4,
            QuantFormat::Fp8 {
                block_rows: 1,
                block_cols: 32,
                scale: ScaleFormat::Ue8m0,
            },
        ] {
            let q = QuantMatrix::quantize(&w, n, k, fmt).unwrap();
            let want = matmul_host(&cpu, &x, m, k, &cpu.upload_quant(&q).unwrap());
            let wt = b.upload_quant(&q).unwrap();
            assert!(wt.dtype().is_quantized());
            let got = matmul_host(&b, &x, m, k, &wt);
            let wd = q.dequantize();
            for i in 0..m {
                for j in 0..n {
                    let mag: f32 = (0..k)
                        .map(|kk| (x[i * k + kk] * wd[j * k + kk]).abs())
                        .sum();
                    let (g, e) = (got[i * n + j], want[i * n + j]);
                    assert!(
                        (g - e).abs() <= mag / 16.0 + 1e-5,
                        "{fmt:?} [{i},{j}] {g} vs {e}"
                    );
                }
            }
        }
        // f32 weights are not an Ascend kernel format: CPU reference result, bit for bit.
        let want = matmul_host(&cpu, &x, m, k, &cpu.upload_f32(&w, &[n, k]).unwrap());
        let got = matmul_host(&b, &x, m, k, &b.upload_f32(&w, &[n, k]).unwrap());
        assert_eq!(got, want);
    }
}

#[test]
fn sparse_attention_matches_cpu() {
    let cpu = CpuBackend::new();
    let mut rng = Rng::new(14);
    for b in backends() {
        let (s, h, d, j, kk) = (2, 8, 64, 40, 12);
        let q = rb(&rng.vec(s * h * d, -1.0, 1.0));
        let kv = rb(&rng.vec(j * d, -1.0, 1.0));
        let sink = rng.vec(h, -1.0, 1.0);
        let mut idx: Vec<i64> = (0..s * kk).map(|i| (i as i64 * 7) % j as i64).collect();
        idx[3] = -1;
        idx[kk + 5] = -1;
        let want = {
            let t = cpu
                .sparse_attention(
                    &cpu.upload_f32(&q, &[s, h, d]).unwrap(),
                    &cpu.upload_f32(&kv, &[j, d]).unwrap(),
                    &cpu.upload_i64(&idx, &[s, kk]).unwrap(),
                    &cpu.upload_f32(&sink, &[h]).unwrap(),
                    0.125,
                )
                .unwrap();
            cpu.download_f32(&t).unwrap()
        };
        let t = b
            .sparse_attention(
                &b.upload_f32(&q, &[s, h, d]).unwrap(),
                &b.upload_f32(&kv, &[j, d]).unwrap(),
                &b.upload_i64(&idx, &[s, kk]).unwrap(),
                &b.upload_f32(&sink, &[h]).unwrap(),
                0.125,
            )
            .unwrap();
        let got = b.download_f32(&t).unwrap();
        close(&got, &want, 2f32.powi(-8), 2e-6, "sparse_attention");
    }
}

#[test]
fn hc_expand_matches_cpu() {
    let cpu = CpuBackend::new();
    let mut rng = Rng::new(15);
    for b in backends() {
        let (s, n, d) = (3, 4, 1000);
        let x = rb(&rng.vec(s * n * d, -2.0, 2.0));
        let out = rb(&rng.vec(s * d, -2.0, 2.0));
        let post = rng.vec(s * n, 0.0, 2.0);
        let comb = rng.vec(s * n * n, 0.0, 1.0);
        let want = cpu
            .download_f32(
                &cpu.hc_expand(
                    &cpu.upload_f32(&x, &[s, n, d]).unwrap(),
                    &cpu.upload_f32(&out, &[s, d]).unwrap(),
                    &cpu.upload_f32(&post, &[s, n]).unwrap(),
                    &cpu.upload_f32(&comb, &[s, n, n]).unwrap(),
                )
                .unwrap(),
            )
            .unwrap();
        let got = b
            .download_f32(
                &b.hc_expand(
                    &b.upload_f32(&x, &[s, n, d]).unwrap(),
                    &b.upload_f32(&out, &[s, d]).unwrap(),
                    &b.upload_f32(&post, &[s, n]).unwrap(),
                    &b.upload_f32(&comb, &[s, n, n]).unwrap(),
                )
                .unwrap(),
            )
            .unwrap();
        // Output magnitudes are bounded by 2·2 + 4·2 = 12; one bf16 ulp of that.
        close(
            &got,
            &want,
            2f32.powi(-8),
            12.0 * 2f32.powi(-9),
            "hc_expand",
        );
    }
}

#[test]
fn moe_route_matches_cpu() {
    let cpu = CpuBackend::new();
    let mut rng = Rng::new(16);
    for b in backends() {
        for score in [
            RouteScore::SqrtSoftplus,
            RouteScore::Softmax,
            RouteScore::Sigmoid,
        ] {
            let (s, e) = (9, 384);
            let logits = rng.vec(s * e, -4.0, 4.0);
            let bias = rng.vec(e, -0.1, 0.1);
            let p = RouteParams {
                score,
                top_k: 6,
                renormalize: true,
                scale: 1.5,
            };
            let (wi, ww) = cpu
                .moe_route(
                    &cpu.upload_f32(&logits, &[s, e]).unwrap(),
                    Some(&cpu.upload_f32(&bias, &[e]).unwrap()),
                    p,
                )
                .unwrap();
            let (gi, gw) = b
                .moe_route(
                    &b.upload_f32(&logits, &[s, e]).unwrap(),
                    Some(&b.upload_f32(&bias, &[e]).unwrap()),
                    p,
                )
                .unwrap();
            assert_eq!(gi.shape(), &[s, 6]);
            assert_eq!(
                b.download_i32(&gi).unwrap(),
                cpu.download_i32(&wi).unwrap(),
                "{score:?}"
            );
            close(
                &b.download_f32(&gw).unwrap(),
                &cpu.download_f32(&ww).unwrap(),
                1e-5,
                1e-7,
                "moe_route weights",
            );
        }
    }
}

#[test]
fn other_ops_are_the_cpu_reference_exactly() {
    let cpu = CpuBackend::new();
    let b = AscendBackend::emulated(Chip::Ascend950);
    let mut rng = Rng::new(17);
    let x = rng.vec(4 * 33, -3.0, 3.0);
    let want = cpu
        .download_f32(&cpu.softmax(&cpu.upload_f32(&x, &[4, 33]).unwrap()).unwrap())
        .unwrap();
    let got = b
        .download_f32(&b.softmax(&b.upload_f32(&x, &[4, 33]).unwrap()).unwrap())
        .unwrap();
    assert_eq!(got, want);
    let z = b.zeros(&[2, 3], DType::BF16).unwrap();
    assert_eq!(b.download_f32(&z).unwrap(), vec![0.0; 6]);
}

#[test]
fn shape_errors_are_errors() {
    let b = AscendBackend::emulated(Chip::Ascend910B);
    let x = b.upload_f32(&[1.0; 8], &[8]).unwrap();
    assert!(b.rope(&x, &[0], &[1.0], false).is_err());
    let q = b.upload_f32(&[1.0; 8], &[1, 1, 8]).unwrap();
    let kv = b.upload_f32(&[1.0; 16], &[2, 8]).unwrap();
    let idx = b.upload_i64(&[5], &[1, 1]).unwrap();
    let sink = b.upload_f32(&[0.0], &[1]).unwrap();
    assert!(b.sparse_attention(&q, &kv, &idx, &sink, 1.0).is_err());
}
