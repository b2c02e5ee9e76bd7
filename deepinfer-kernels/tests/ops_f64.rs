//! Each CPU op against a plain f64 reference on random inputs (and edge cases).

mod common;

use common::{Rng, assert_close, linear64, rms64, sigmoid64, softplus64, to64};
use deepinfer_kernels::{Backend, CpuBackend, CpuConfig, DType, TensorInfo, Unary};
use half::{bf16, f16};
use proptest::prelude::*;

/// A scalar f64 reference function.
type F64Fn = fn(f64) -> f64;

fn backends() -> Vec<CpuBackend> {
    vec![
        CpuBackend::new(),
        CpuBackend::batch_invariant(),
        CpuBackend::with_config(CpuConfig {
            batch_invariant: false,
            threads: Some(1),
        })
        .unwrap(),
    ]
}

#[test]
fn matmul_f32_bf16_f16_weights_all_paths() {
    let mut rng = Rng::new(1);
    // m below and above the fast-path switch, k not a multiple of the lane count.
    for &(m, k, n) in &[(1, 37, 5), (3, 64, 17), (8, 100, 130), (33, 257, 70)] {
        let x = rng.vec(m * k, 1.0);
        let w = rng.vec(n * k, 0.5);
        let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        let wh: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
        for b in backends() {
            let xt = b.upload_f32(&x, &[m, k]).unwrap();
            let cases = [
                (b.upload_f32(&w, &[n, k]).unwrap(), to64(&w)),
                (
                    b.upload_bf16(&wb, &[n, k]).unwrap(),
                    wb.iter().map(|v| v.to_f64()).collect(),
                ),
                (
                    b.upload_f16(&wh, &[n, k]).unwrap(),
                    wh.iter().map(|v| v.to_f64()).collect(),
                ),
            ];
            for (wt, w64) in cases {
                let y = b.download_f32(&b.matmul(&xt, &wt).unwrap()).unwrap();
                let want = linear64(&to64(&x), m, k, &w64, n);
                assert_close(
                    &format!("matmul {m}x{k}x{n} {:?} {}", wt.dtype(), b.name()),
                    &y,
                    &want,
                    1e-5,
                    1e-5,
                );
            }
        }
    }
}

#[test]
fn matmul_keeps_leading_dims_and_rejects_bad_shapes() {
    let b = CpuBackend::new();
    let x = b.upload_f32(&[1.0; 24], &[2, 3, 4]).unwrap();
    let w = b.upload_f32(&[1.0; 20], &[5, 4]).unwrap();
    assert_eq!(b.matmul(&x, &w).unwrap().shape(), &[2, 3, 5]);
    let bad = b.upload_f32(&[1.0; 15], &[5, 3]).unwrap();
    assert!(b.matmul(&x, &bad).is_err());
    let ints = b.upload_i32(&[1; 20], &[5, 4]).unwrap();
    assert!(b.matmul(&x, &ints).is_err());
    assert!(b.upload_f32(&[1.0; 3], &[2, 2]).is_err());
}

#[test]
fn bmm_and_grouped_matmul() {
    let mut rng = Rng::new(2);
    let b = CpuBackend::new();
    let (bt, m, k, n) = (3, 4, 9, 5);
    let a = rng.vec(bt * m * k, 1.0);
    let c = rng.vec(bt * n * k, 1.0);
    let y = b
        .download_f32(
            &b.bmm(
                &b.upload_f32(&a, &[bt, m, k]).unwrap(),
                &b.upload_f32(&c, &[bt, n, k]).unwrap(),
            )
            .unwrap(),
        )
        .unwrap();
    let mut want = Vec::new();
    for i in 0..bt {
        want.extend(linear64(
            &to64(&a[i * m * k..(i + 1) * m * k]),
            m,
            k,
            &to64(&c[i * n * k..(i + 1) * n * k]),
            n,
        ));
    }
    assert_close("bmm", &y, &want, 1e-5, 1e-5);

    let (s, g, ii, r) = (5, 4, 6, 3);
    let x = rng.vec(s * g * ii, 1.0);
    let w = rng.vec(g * r * ii, 1.0);
    let y = b
        .download_f32(
            &b.grouped_matmul(
                &b.upload_f32(&x, &[s, g, ii]).unwrap(),
                &b.upload_f32(&w, &[g, r, ii]).unwrap(),
            )
            .unwrap(),
        )
        .unwrap();
    let mut want = vec![0.0f64; s * g * r];
    for si in 0..s {
        for gi in 0..g {
            for ri in 0..r {
                want[(si * g + gi) * r + ri] = (0..ii)
                    .map(|t| x[(si * g + gi) * ii + t] as f64 * w[(gi * r + ri) * ii + t] as f64)
                    .sum();
            }
        }
    }
    assert_close("grouped_matmul", &y, &want, 1e-5, 1e-5);
}

#[test]
fn norms_and_elementwise() {
    let mut rng = Rng::new(3);
    let b = CpuBackend::new();
    let (rows, d) = (7, 33);
    let x = rng.vec(rows * d, 3.0);
    let g = rng.vec(d, 1.0);
    let xt = b.upload_f32(&x, &[rows, d]).unwrap();
    let gt = b.upload_f32(&g, &[d]).unwrap();
    let y = b
        .download_f32(&b.rms_norm(&xt, Some(&gt), 1e-6).unwrap())
        .unwrap();
    assert_close(
        "rms_norm",
        &y,
        &rms64(&to64(&x), d, Some(&to64(&g)), 1e-6),
        1e-5,
        1e-5,
    );
    let y = b
        .download_f32(&b.rms_norm(&xt, None, 1e-6).unwrap())
        .unwrap();
    assert_close(
        "rms_norm no weight",
        &y,
        &rms64(&to64(&x), d, None, 1e-6),
        1e-5,
        1e-5,
    );

    let x64 = to64(&x);
    let funcs: [(Unary, F64Fn); 8] = [
        (Unary::Silu, |v| v * sigmoid64(v)),
        (Unary::Sigmoid, sigmoid64),
        (Unary::Softplus, softplus64),
        (Unary::SqrtSoftplus, |v| softplus64(v).sqrt()),
        (Unary::Relu, |v| v.max(0.0)),
        (Unary::Exp, f64::exp),
        (Unary::Neg, |v| -v),
        (Unary::SignedSqrtSigmoid, |v| {
            sigmoid64(v.abs().max(1e-6).sqrt().copysign(v))
        }),
    ];
    for (u, f) in funcs {
        let y = b.download_f32(&b.unary(&xt, u).unwrap()).unwrap();
        let want: Vec<f64> = x64.iter().map(|&v| f(v)).collect();
        assert_close(&format!("{u:?}"), &y, &want, 1e-6, 1e-5);
    }
    // softmax, with -inf entries and an all -inf row
    let mut sm = x.clone();
    sm[0] = f32::NEG_INFINITY;
    for v in &mut sm[d..2 * d] {
        *v = f32::NEG_INFINITY;
    }
    let y = b
        .download_f32(&b.softmax(&b.upload_f32(&sm, &[rows, d]).unwrap()).unwrap())
        .unwrap();
    let mut want = Vec::new();
    for row in sm.chunks(d) {
        let mx = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        if mx == f64::NEG_INFINITY {
            want.extend(std::iter::repeat_n(0.0, d));
            continue;
        }
        let e: Vec<f64> = row.iter().map(|&v| (v as f64 - mx).exp()).collect();
        let s: f64 = e.iter().sum();
        want.extend(e.iter().map(|v| v / s));
    }
    assert_close("softmax", &y, &want, 1e-6, 1e-5);

    // swiglu with and without clamp
    let u = rng.vec(rows * d, 3.0);
    let ut = b.upload_f32(&u, &[rows, d]).unwrap();
    for lim in [0.0f32, 1.5] {
        let y = b.download_f32(&b.swiglu(&xt, &ut, lim).unwrap()).unwrap();
        let want: Vec<f64> = x
            .iter()
            .zip(&u)
            .map(|(&g, &u)| {
                let (g, u) = if lim > 0.0 {
                    (
                        (g as f64).min(lim as f64),
                        (u as f64).clamp(-lim as f64, lim as f64),
                    )
                } else {
                    (g as f64, u as f64)
                };
                g * sigmoid64(g) * u
            })
            .collect();
        assert_close("swiglu", &y, &want, 1e-6, 1e-5);
    }
    // broadcasting add / mul, affine
    let y = b.download_f32(&b.add(&xt, &gt).unwrap()).unwrap();
    let want: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| v as f64 + g[i % d] as f64)
        .collect();
    assert_close("add", &y, &want, 1e-6, 1e-6);
    let y = b.download_f32(&b.mul(&xt, &gt).unwrap()).unwrap();
    let want: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| v as f64 * g[i % d] as f64)
        .collect();
    assert_close("mul", &y, &want, 1e-6, 1e-6);
    let y = b.download_f32(&b.affine(&xt, 2.0, -1.0).unwrap()).unwrap();
    let want: Vec<f64> = x.iter().map(|&v| v as f64 * 2.0 - 1.0).collect();
    assert_close("affine", &y, &want, 1e-6, 1e-6);
    assert!(b.add(&gt, &xt).is_err(), "a larger b does not broadcast");
}

#[test]
fn sum_last_matches_f64_and_default_impl() {
    let mut rng = Rng::new(4);
    let b = CpuBackend::new();
    let x = rng.vec(5 * 37, 2.0);
    let t = b.upload_f32(&x, &[5, 37]).unwrap();
    let y = b.sum_last(&t).unwrap();
    assert_eq!(y.shape(), &[5]);
    let want: Vec<f64> = x
        .chunks(37)
        .map(|r| r.iter().map(|&v| v as f64).sum())
        .collect();
    assert_close("sum_last", &b.download_f32(&y).unwrap(), &want, 1e-5, 1e-5);
}

#[test]
fn layout_ops() {
    let b = CpuBackend::new();
    let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let t = b.upload_f32(&v, &[2, 3, 4]).unwrap();
    let n = b.narrow(&t, 1, 1, 2).unwrap();
    assert_eq!(n.shape(), &[2, 2, 4]);
    assert_eq!(b.download_f32(&n).unwrap()[..4], [4.0, 5.0, 6.0, 7.0]);
    let c = b.concat(&[&t, &n], 1).unwrap();
    assert_eq!(c.shape(), &[2, 5, 4]);
    assert_eq!(b.download_f32(&c).unwrap()[12..16], [4.0, 5.0, 6.0, 7.0]);
    let tr = b.transpose(&t, 0, 2).unwrap();
    assert_eq!(tr.shape(), &[4, 3, 2]);
    let tv = b.download_f32(&tr).unwrap();
    for i in 0..2 {
        for j in 0..3 {
            for k in 0..4 {
                assert_eq!(tv[(k * 3 + j) * 2 + i], v[(i * 3 + j) * 4 + k]);
            }
        }
    }
    assert!(b.narrow(&t, 1, 2, 2).is_err());
    assert!(b.reshape(&t, &[5, 5]).is_err());
    // gather (embedding) from f32 and bf16 tables
    let ids = b.upload_i64(&[2, 0, 2], &[3]).unwrap();
    let table = b.upload_f32(&v[..12], &[3, 4]).unwrap();
    let g = b.gather_rows(&table, &ids).unwrap();
    assert_eq!(g.shape(), &[3, 4]);
    assert_eq!(b.download_f32(&g).unwrap()[..4], [8.0, 9.0, 10.0, 11.0]);
    let tb = b.cast(&table, DType::BF16).unwrap();
    assert_eq!(
        b.download_f32(&b.gather_rows(&tb, &ids).unwrap()).unwrap(),
        b.download_f32(&g).unwrap()
    );
    assert!(
        b.gather_rows(&table, &b.upload_i32(&[3], &[1]).unwrap())
            .is_err()
    );
    // mean over streams, argmax with ties to the lower index
    let m = b.download_f32(&b.mean_axis1(&t).unwrap()).unwrap();
    assert_eq!(m[0], 4.0);
    let am = b
        .argmax(&b.upload_f32(&[1.0, 3.0, 3.0, 0.0], &[1, 4]).unwrap())
        .unwrap();
    assert_eq!(b.download_i32(&am).unwrap(), vec![1]);
}

#[test]
fn paged_block_copy_and_row_writes() {
    let b = CpuBackend::new();
    let v: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let mut cache = b.upload_f32(&v, &[4, 3]).unwrap();
    let alias = cache.clone();
    // Chain: 0→1 and 1→2 both read the old contents.
    b.copy_blocks(&mut cache, &[(0, 1), (1, 2)]).unwrap();
    assert_eq!(
        b.download_f32(&cache).unwrap(),
        vec![0., 1., 2., 0., 1., 2., 3., 4., 5., 9., 10., 11.]
    );
    assert_eq!(
        b.download_f32(&alias).unwrap(),
        v,
        "copy-on-write leaves clones untouched"
    );
    assert!(b.copy_blocks(&mut cache, &[(0, 4)]).is_err());
    let src = b.upload_f32(&[7.0; 6], &[2, 3]).unwrap();
    b.write_rows(&mut cache, 2, &src).unwrap();
    assert_eq!(b.download_f32(&cache).unwrap()[6..], [7.0; 6]);
    assert!(b.write_rows(&mut cache, 3, &src).is_err());
    let mut ic = b.zeros(&[2, 2], DType::I32).unwrap();
    b.copy_blocks(&mut ic, &[(0, 1)]).unwrap();
    assert_eq!(b.download_i32(&ic).unwrap(), vec![0; 4]);
}

#[test]
fn topk_edge_cases() {
    let b = CpuBackend::new();
    let x = b
        .upload_f32(&[1.0, f32::NEG_INFINITY, 1.0, 0.5], &[1, 4])
        .unwrap();
    assert_eq!(
        b.download_i32(&b.topk(&x, 3).unwrap()).unwrap(),
        vec![0, 2, 3]
    );
    assert_eq!(
        b.download_i32(&b.topk(&x, 6).unwrap()).unwrap(),
        vec![0, 2, 3, -1, -1, -1]
    );
    let bm = b.block_max(&x, 3).unwrap();
    assert_eq!(b.download_f32(&bm).unwrap(), vec![1.0, 0.5]);
    let keep = b.upload_i32(&[1, 1, 0, 1], &[1, 4]).unwrap();
    let mk = b.download_f32(&b.mask_neg_inf(&x, &keep).unwrap()).unwrap();
    assert_eq!(mk[2], f32::NEG_INFINITY);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Top-k equals a stable sort by value (descending) truncated to k.
    #[test]
    fn topk_is_stable_sort(vals in proptest::collection::vec(-4i32..4, 1..40), k in 1usize..12) {
        let b = CpuBackend::new();
        let x: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
        let got = b.download_i32(&b.topk(&b.upload_f32(&x, &[1, x.len()]).unwrap(), k).unwrap()).unwrap();
        let mut order: Vec<usize> = (0..x.len()).collect();
        order.sort_by(|&a, &c| x[c].partial_cmp(&x[a]).unwrap());
        let want: Vec<i32> = (0..k).map(|i| order.get(i).map_or(-1, |&j| j as i32)).collect();
        prop_assert_eq!(got, want);
    }

    /// Sink attention probabilities: with a very negative sink the output is a convex
    /// combination of the selected keys (each coordinate within their range).
    #[test]
    fn attention_output_in_hull(seed in 0u64..1000, nsel in 1usize..6) {
        let mut rng = Rng::new(seed);
        let b = CpuBackend::new();
        let (j, d) = (8, 4);
        let kv = rng.vec(j * d, 1.0);
        let q = rng.vec(d, 1.0);
        let idx: Vec<i32> = (0..nsel as i32).collect();
        let o = b.download_f32(&b.sparse_attention(
            &b.upload_f32(&q, &[1, 1, d]).unwrap(),
            &b.upload_f32(&kv, &[j, d]).unwrap(),
            &b.upload_i32(&idx, &[1, nsel]).unwrap(),
            &b.upload_f32(&[-1e4], &[1]).unwrap(),
            0.5,
        ).unwrap()).unwrap();
        for c in 0..d {
            let lo = (0..nsel).map(|r| kv[r * d + c]).fold(f32::INFINITY, f32::min);
            let hi = (0..nsel).map(|r| kv[r * d + c]).fold(f32::NEG_INFINITY, f32::max);
            prop_assert!(o[c] >= lo - 1e-5 && o[c] <= hi + 1e-5);
        }
    }
}
