//! Quantised formats: scalar codecs, quantise / dequantise error bounds, GEMV against them.

mod common;

use common::{Rng, assert_close, linear64, to64};
use deepinfer_kernels::quant::fp4::{E2M1_VALUES, e2m1_decode, e2m1_encode};
use deepinfer_kernels::quant::fp8::{E4M3_LUT, e4m3_decode, e4m3_encode, ue8m0_decode};
use deepinfer_kernels::{
    Backend, CpuBackend, DType, QuantFormat, QuantMatrix, ScaleFormat, TensorInfo,
};
use proptest::prelude::*;

#[test]
fn e4m3_codec_round_trips_every_finite_byte() {
    for b in 0u8..=255 {
        let v = e4m3_decode(b);
        if v.is_nan() {
            assert!(b & 0x7f == 0x7f);
            continue;
        }
        let back = e4m3_encode(v);
        // ±0 both decode to 0; everything else is exact.
        assert_eq!(e4m3_decode(back), v, "byte {b:#x}");
        if v != 0.0 {
            assert_eq!(back, b);
        }
    }
    assert_eq!(e4m3_decode(0x7e), 448.0);
    assert_eq!(e4m3_decode(0x01), 2f32.powi(-9));
    assert_eq!(e4m3_encode(1e6), 0x7e, "saturates");
    assert_eq!(E4M3_LUT[0x38], 1.0);
    assert_eq!(ue8m0_decode(127), 1.0);
    assert_eq!(ue8m0_decode(130), 8.0);
}

#[test]
fn e2m1_codec() {
    for (c, &v) in E2M1_VALUES.iter().enumerate() {
        assert_eq!(e2m1_encode(v), c as u8);
        assert_eq!(e2m1_encode(-v) & 7, c as u8);
        assert_eq!(e2m1_decode(c as u8), v);
    }
    assert_eq!(e2m1_decode(e2m1_encode(0.75)), 1.0, "tie to even");
    assert_eq!(e2m1_decode(e2m1_encode(2.5)), 2.0, "tie to even");
    assert_eq!(e2m1_decode(e2m1_encode(5.0)), 4.0, "tie to even");
    assert_eq!(e2m1_decode(e2m1_encode(100.0)), 6.0, "saturates");
}

fn formats() -> Vec<(QuantFormat, f64)> {
    // (format, bound on |err| / block amax): half an ulp at the top binade, plus slack for the
    // coarser power-of-two scales.
    vec![
        (
            QuantFormat::Fp8 {
                block_rows: 4,
                block_cols: 32,
                scale: ScaleFormat::F32,
            },
            1.0 / 16.0,
        ),
        (
            QuantFormat::Fp8 {
                block_rows: 1,
                block_cols: 32,
                scale: ScaleFormat::Ue8m0,
            },
            1.0 / 8.0,
        ),
        (QuantFormat::Mxfp4, 0.5),
        (QuantFormat::Nvfp4, 0.25),
    ]
}

#[test]
fn quantize_dequantize_error_is_bounded() {
    let mut rng = Rng::new(9);
    let (rows, cols) = (8, 96);
    let x = rng.vec(rows * cols, 2.0);
    for (f, bound) in formats() {
        let q = QuantMatrix::quantize(&x, rows, cols, f).unwrap();
        assert_eq!(
            q.format().dtype(),
            match f {
                QuantFormat::Fp8 { .. } => DType::F8E4M3,
                QuantFormat::Mxfp4 => DType::Mxfp4,
                QuantFormat::Nvfp4 => DType::Nvfp4,
            }
        );
        let y = q.dequantize();
        let bc = f.block_cols();
        for r in 0..rows {
            for (bj, (xs, ys)) in x[r * cols..(r + 1) * cols]
                .chunks(bc)
                .zip(y[r * cols..(r + 1) * cols].chunks(bc))
                .enumerate()
            {
                let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
                for (a, b) in xs.iter().zip(ys) {
                    let err = (*a as f64 - *b as f64).abs();
                    assert!(
                        err <= bound * amax + 1e-12,
                        "{f:?} row {r} block {bj}: {a} -> {b}"
                    );
                }
            }
        }
        // Re-quantising the dequantised matrix is exact for power-of-two scales.
        if matches!(
            f,
            QuantFormat::Mxfp4
                | QuantFormat::Fp8 {
                    scale: ScaleFormat::Ue8m0,
                    ..
                }
        ) {
            let q2 = QuantMatrix::quantize(&y, rows, cols, f).unwrap();
            assert_eq!(q2.dequantize(), y, "{f:?} idempotent");
        }
    }
}

#[test]
fn quantize_rejects_bad_input() {
    assert!(
        QuantMatrix::quantize(&[1.0; 10], 1, 10, QuantFormat::Mxfp4).is_err(),
        "cols not a multiple of 32"
    );
    assert!(
        QuantMatrix::quantize(&[1.0; 32], 2, 32, QuantFormat::Mxfp4).is_err(),
        "length"
    );
    assert!(
        QuantMatrix::quantize(&[f32::NAN; 32], 1, 32, QuantFormat::Mxfp4).is_err(),
        "NaN"
    );
    assert!(
        QuantMatrix::from_parts(
            QuantFormat::Mxfp4,
            1,
            32,
            vec![0; 16],
            None,
            Some(vec![127; 2]),
            1.0
        )
        .is_err()
    );
    let ok = QuantMatrix::from_parts(
        QuantFormat::Mxfp4,
        1,
        32,
        vec![0x22; 16],
        None,
        Some(vec![128]),
        1.0,
    )
    .unwrap();
    assert_eq!(ok.dequantize(), vec![2.0; 32]);
}

#[test]
fn gemv_and_gemm_against_quantised_weights() {
    let mut rng = Rng::new(10);
    let (n, k) = (40, 128);
    let w = rng.vec(n * k, 1.0);
    for (f, _) in formats() {
        let q = QuantMatrix::quantize(&w, n, k, f).unwrap();
        let deq = q.dequantize();
        for b in [CpuBackend::new(), CpuBackend::batch_invariant()] {
            let wt = b.upload_quant(&q).unwrap();
            assert_eq!(wt.shape(), &[n, k]);
            for m in [1usize, 3, 16] {
                let x = rng.vec(m * k, 1.0);
                let xt = b.upload_f32(&x, &[m, k]).unwrap();
                let y = b.download_f32(&b.matmul(&xt, &wt).unwrap()).unwrap();
                assert_close(
                    &format!("{f:?} m={m}"),
                    &y,
                    &linear64(&to64(&x), m, k, &to64(&deq), n),
                    1e-4,
                    1e-5,
                );
                // Same bits as multiplying by the dequantised f32 matrix on the dot path.
                if m < 8 || b.config().batch_invariant {
                    let yf = b
                        .download_f32(
                            &b.matmul(&xt, &b.upload_f32(&deq, &[n, k]).unwrap())
                                .unwrap(),
                        )
                        .unwrap();
                    assert_eq!(y, yf);
                }
            }
            // Embedding rows from a quantised table.
            let ids = b.upload_i32(&[3, 0], &[2]).unwrap();
            let g = b.download_f32(&b.gather_rows(&wt, &ids).unwrap()).unwrap();
            assert_eq!(&g[..k], &deq[3 * k..4 * k]);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Dequantised values are exactly representable: e4m3 / e2m1 code times the block scale.
    #[test]
    fn nvfp4_and_mxfp4_dequantise_to_grid(seed in 0u64..10_000, scale in 0.001f32..100.0) {
        let mut rng = Rng::new(seed);
        let x = rng.vec(64, scale);
        for f in [QuantFormat::Mxfp4, QuantFormat::Nvfp4] {
            let q = QuantMatrix::quantize(&x, 1, 64, f).unwrap();
            let y = q.dequantize();
            let bc = f.block_cols();
            for (bj, ys) in y.chunks(bc).enumerate() {
                let s = q.block_scale(0, bj);
                for v in ys {
                    let code = (v / s).abs();
                    prop_assert!(E2M1_VALUES.iter().any(|&g| (g - code).abs() <= 1e-6 * g.max(1.0)), "{} / {} not on the grid", v, s);
                }
            }
        }
    }

    /// The FP8 round trip keeps the sign and never grows a value past its block maximum.
    #[test]
    fn fp8_keeps_sign_and_bound(seed in 0u64..10_000) {
        let mut rng = Rng::new(seed);
        let x = rng.vec(4 * 64, 10.0);
        let f = QuantFormat::Fp8 { block_rows: 2, block_cols: 32, scale: ScaleFormat::F32 };
        let y = QuantMatrix::quantize(&x, 4, 64, f).unwrap().dequantize();
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (a, b) in x.iter().zip(&y) {
            prop_assert!(*b == 0.0 || a.signum() == b.signum());
            prop_assert!(b.abs() <= amax * (1.0 + 1e-6));
        }
    }
}

/// The bit-arithmetic encoders agree with the reference rounding rules (round half to even,
/// saturating) on a dense sweep of f32 bit patterns, ties included.
#[test]
fn fast_encoders_match_reference_rounding() {
    use deepinfer_kernels::quant::fp4::round_e2m1;
    use deepinfer_kernels::quant::fp8::round_e4m3;
    // Every 97th f32 from 0 to 1e4 (both signs), plus all e4m3 / e2m1 midpoints.
    let mut vals: Vec<f32> = (0..0x461c_4000u32)
        .step_by(97)
        .map(f32::from_bits)
        .collect();
    for b in 0u8..0x7e {
        let (lo, hi) = (e4m3_decode(b), e4m3_decode(b + 1));
        vals.push((lo + hi) / 2.0);
    }
    vals.extend([
        0.25f32,
        0.75,
        1.25,
        1.75,
        2.5,
        3.5,
        5.0,
        6.5,
        464.0,
        480.0,
        2f32.powi(-10),
        3.0 * 2f32.powi(-11),
    ]);
    for &a in &vals {
        for v in [a, -a] {
            let want = round_e4m3(v);
            let got = e4m3_decode(e4m3_encode(v));
            assert!(got == want, "e4m3 {v}: {got} vs {want}");
            let c = v.clamp(-6.0, 6.0);
            let (got, want) = (e2m1_decode(e2m1_encode(c)), round_e2m1(c));
            assert!(got == want, "e2m1 {c}: {got} vs {want}");
        }
    }
}

/// The fast encoders are bit-identical to the reference encoders (which round by the NumPy
/// rules) on every input class: a dense sweep of bit patterns, all e4m3 midpoints, specials.
#[test]
fn fast_encoders_are_bit_identical_to_reference_encoders() {
    use deepinfer_kernels::quant::reference::{e2m1_encode_reference, e4m3_encode_reference};
    let mut specials = vec![
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::MAX,
    ];
    for b in 0u8..0x7e {
        let (lo, hi) = (e4m3_decode(b), e4m3_decode(b + 1));
        specials.push((lo + hi) / 2.0);
        specials.push(f32::from_bits(((lo + hi) / 2.0).to_bits() + 1));
    }
    // Every 4099th bit pattern over the whole u32 range: all exponents, both signs, NaNs.
    let sweep = (0..=u32::MAX).step_by(4099).map(f32::from_bits);
    for v in specials.into_iter().chain(sweep) {
        assert_eq!(
            e4m3_encode(v),
            e4m3_encode_reference(v),
            "e4m3 {v:e} ({:#x})",
            v.to_bits()
        );
        assert_eq!(
            e2m1_encode(v),
            e2m1_encode_reference(v),
            "e2m1 {v:e} ({:#x})",
            v.to_bits()
        );
    }
}

fn all_formats() -> Vec<QuantFormat> {
    vec![
        QuantFormat::FP8_128_F32,
        QuantFormat::Fp8 {
            block_rows: 3,
            block_cols: 20,
            scale: ScaleFormat::F32,
        },
        QuantFormat::Fp8 {
            block_rows: 1,
            block_cols: 32,
            scale: ScaleFormat::Ue8m0,
        },
        QuantFormat::Fp8 {
            block_rows: 5,
            block_cols: 7,
            scale: ScaleFormat::Ue8m0,
        },
        QuantFormat::Mxfp4,
        QuantFormat::Nvfp4,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The fast quantise / dequantise kernels give exactly the bytes, scales and values of
    /// the per-element reference, on random blocks with mixed magnitudes (tiny, subnormal,
    /// zero, huge) and random shapes.
    #[test]
    fn fast_quant_is_bit_identical_to_reference(
        seed in 0u64..1_000_000,
        rows in 1usize..9,
        cols32 in 1usize..6,
        log_scale in -140i32..120,
    ) {
        use deepinfer_kernels::quant::reference::{dequantize_reference, quantize_reference};
        let mut rng = Rng::new(seed);
        let cols = cols32 * 32;
        let scale = 2f32.powi(log_scale);
        let x: Vec<f32> = (0..rows * cols)
            .map(|_| match rng.below(8) {
                0 => 0.0,
                1 => -0.0,
                2 => rng.unit() * scale * 1e-30,
                3 => rng.unit() * f32::MAX,
                _ => rng.unit() * scale,
            })
            .collect();
        for f in all_formats() {
            let fast = QuantMatrix::quantize(&x, rows, cols, f);
            let slow = quantize_reference(&x, rows, cols, f);
            match (fast, slow) {
                (Ok(a), Ok(b)) => {
                    prop_assert!(a == b, "{:?}: quantised matrices differ", f);
                    let (da, db) = (a.dequantize(), dequantize_reference(&b));
                    let same = da.iter().zip(&db).all(|(p, q)| p.to_bits() == q.to_bits());
                    prop_assert!(same, "{:?}: dequantised values differ", f);
                }
                (Err(_), Err(_)) => {}
                (a, b) => prop_assert!(false, "{:?}: {:?} vs {:?}", f, a.is_ok(), b.is_ok()),
            }
        }
    }

    /// Non-finite values are rejected by the fast path exactly as by the reference.
    #[test]
    fn quantize_rejects_non_finite_anywhere(pos in 0usize..256, which in 0usize..3) {
        let mut x = vec![0.5f32; 256];
        x[pos] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][which];
        for f in all_formats() {
            prop_assert!(QuantMatrix::quantize(&x, 2, 128, f).is_err());
        }
    }
}

#[test]
fn dequantize_into_checks_length() {
    let x: Vec<f32> = (0..64).map(|i| i as f32 - 30.0).collect();
    let q = QuantMatrix::quantize(&x, 2, 32, QuantFormat::Mxfp4).unwrap();
    let mut buf = vec![0.0; 64];
    q.dequantize_into(&mut buf).unwrap();
    assert_eq!(buf, q.dequantize());
    assert!(q.dequantize_into(&mut buf[..63]).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any column range of a row dequantises to the same values as the whole row.
    #[test]
    fn dequantize_range_matches_rows(seed in 0u64..100_000, a in 0usize..96, len in 0usize..96) {
        let mut rng = Rng::new(seed);
        let (rows, cols) = (3usize, 192usize);
        let x = rng.vec(rows * cols, 4.0);
        for f in all_formats() {
            let q = QuantMatrix::quantize(&x, rows, cols, f).unwrap();
            let full = q.dequantize();
            let c0 = if f.block_cols() % 2 == 0 && matches!(f, QuantFormat::Mxfp4 | QuantFormat::Nvfp4) { a & !1 } else { a };
            let n = len.min(cols - c0);
            let mut out = vec![0.0f32; n];
            q.dequantize_range(2, c0, &mut out);
            prop_assert_eq!(&out[..], &full[2 * cols + c0..2 * cols + c0 + n]);
        }
    }
}

/// The fused quantised GEMV (decoding pieces of a row on the fly) gives the bits of the dot
/// path over the dequantised matrix, for odd block sizes and a row length with a tail.
#[test]
fn fused_quant_gemv_matches_dequantised_f32_bits() {
    let mut rng = Rng::new(77);
    let b = CpuBackend::batch_invariant();
    for (f, k) in [
        (
            QuantFormat::Fp8 {
                block_rows: 5,
                block_cols: 7,
                scale: ScaleFormat::Ue8m0,
            },
            299usize,
        ),
        (
            QuantFormat::Fp8 {
                block_rows: 3,
                block_cols: 20,
                scale: ScaleFormat::F32,
            },
            530,
        ),
        (QuantFormat::Nvfp4, 272),
        (QuantFormat::Mxfp4, 544),
    ] {
        let n = 11;
        let q = QuantMatrix::quantize(&rng.vec(n * k, 2.0), n, k, f).unwrap();
        let x = b.upload_f32(&rng.vec(3 * k, 1.0), &[3, k]).unwrap();
        let yq = b
            .download_f32(&b.matmul(&x, &b.upload_quant(&q).unwrap()).unwrap())
            .unwrap();
        let wf = b.upload_f32(&q.dequantize(), &[n, k]).unwrap();
        let yf = b.download_f32(&b.matmul(&x, &wf).unwrap()).unwrap();
        let same = yq.iter().zip(&yf).all(|(a, c)| a.to_bits() == c.to_bits());
        assert!(same, "{f:?} k={k}");
    }
}

/// Dequantising every e4m3 byte (NaN codes and both zeros included) gives the table's bits
/// times the block scale, whichever decoder the CPU selects.
#[test]
fn fp8_dequantise_every_byte_matches_the_table() {
    let data: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    for scale in [1.0f32, 0.375, 3.0e-3, 2.0f32.powi(-120), 6.0e30] {
        let f = QuantFormat::Fp8 {
            block_rows: 1,
            block_cols: 512,
            scale: ScaleFormat::F32,
        };
        let q =
            QuantMatrix::from_parts(f, 1, 512, data.clone(), Some(vec![scale]), None, 1.0).unwrap();
        let got = q.dequantize();
        for (i, (&b, g)) in data.iter().zip(&got).enumerate() {
            let want = E4M3_LUT[b as usize] * scale;
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "byte {b:#x} at {i}, scale {scale:e}"
            );
        }
    }
}

/// Dequantising every FP4 byte (both nibbles, ±0 included) gives the table's bits times the
/// block scale, whichever decoder the CPU selects.
#[test]
fn fp4_dequantise_every_byte_matches_the_table() {
    use deepinfer_kernels::quant::fp4::E2M1_LUT;
    let data: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect(); // 1024 values
    for scale_byte in [127u8, 100, 140, 1] {
        let q = QuantMatrix::from_parts(
            QuantFormat::Mxfp4,
            1,
            1024,
            data.clone(),
            None,
            Some(vec![scale_byte; 32]),
            1.0,
        )
        .unwrap();
        let s = ue8m0_decode(scale_byte);
        let got = q.dequantize();
        for (i, g) in got.iter().enumerate() {
            let b = data[i / 2];
            let code = if i % 2 == 0 { b & 0xf } else { b >> 4 };
            let want = E2M1_LUT[code as usize] * s;
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "byte {b:#x} value {i}, scale byte {scale_byte}"
            );
        }
    }
}
