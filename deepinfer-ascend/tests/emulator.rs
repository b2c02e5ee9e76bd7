//! Emulated kernels against straightforward f64 references, on both chips, with ragged shapes.
//!
//! Tolerances (per kernel, documented in the README):
//! - bf16 outputs (rmsnorm, rope, hc_mix, attention): one bf16 ulp of the output's magnitude
//!   scale (2^-8 relative) plus 1e-6 absolute.
//! - MXFP8 codes of rmsnorm: exactly the whole-row quantisation of the bf16 output.
//! - gemv (f32 out): 1e-5 × Σ|x·w| (f32 accumulation error bound with margin).
//! - router: ids exact unless two selection keys are within 1e-5; weights 1e-5 relative.
//! - sampling: exact (integer CDF).
//!
//! Every emulator run also checks that each output index is written exactly once and that its
//! UB plan fits the chip (the run fails otherwise), so each passing case asserts both.

#![allow(clippy::needless_range_loop)]

mod common;

use common::*;
use deepinfer_ascend::emu::{self, AttentionInputs, GemvInputs};
use deepinfer_ascend::mx::{self, MX_BLOCK, MxFormat};
use deepinfer_ascend::tiling::*;
use deepinfer_ascend::{AscendError, Chip};
use half::bf16;

fn chips() -> [deepinfer_ascend::ChipSpec; 2] {
    [Chip::Ascend950.spec(), Chip::Ascend910B.spec()]
}

#[test]
fn rmsnorm_matches_f64_reference_with_tails() {
    let mut rng = Rng::new(1);
    for spec in chips() {
        for &(rows, dim, quant) in &[
            (1, 5120, true),
            (3, 100, false),
            (70, 64, true),
            (2, 20_000, false),
            (5, 16_416, true),
            (1, 7, false),
        ] {
            let x = rng.bf16s(rows * dim, -3.0, 3.0);
            let w = rng.vec(dim, 0.5, 1.5);
            let shape = RmsNormShape {
                rows,
                dim,
                eps: 1e-6,
                quant,
            };
            let t = RmsNormTiling::plan(&spec, &shape).unwrap();
            let out = emu::rmsnorm_quant(&spec, &t, &x, &w).unwrap();
            let wf: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
            let want = rmsnorm_ref(&f(&x), &wf, rows, dim, 1e-6);
            for (i, (g, r)) in f(&out.y).iter().zip(&want).enumerate() {
                assert!(
                    (g - r).abs() <= bf16_tol(r.abs()),
                    "{:?} {rows}x{dim} [{i}] {g} vs {r}",
                    spec.chip
                );
            }
            if quant {
                let yf: Vec<f32> = out.y.iter().map(|v| v.to_f32()).collect();
                let (codes, scales) = mx::quantize(MxFormat::Fp8E4M3, &yf);
                assert_eq!(out.q, codes);
                assert_eq!(out.scales, scales);
                let deq = mx::dequantize(MxFormat::Fp8E4M3, &out.q, &out.scales, yf.len());
                for (i, (d, y)) in deq.iter().zip(&yf).enumerate() {
                    let s = mx::scale_value(out.scales[i / MX_BLOCK]);
                    assert!(
                        (d - y).abs() <= y.abs() / 16.0 + s * 2f32.powi(-10),
                        "[{i}] {d} vs {y}"
                    );
                }
            } else {
                assert!(out.q.is_empty() && out.scales.is_empty());
            }
        }
    }
}

#[test]
fn rmsnorm_rejects_unquantisable_dims() {
    let spec = Chip::Ascend950.spec();
    let e = RmsNormTiling::plan(
        &spec,
        &RmsNormShape {
            rows: 1,
            dim: 100,
            eps: 1e-6,
            quant: true,
        },
    );
    assert!(matches!(e, Err(AscendError::Shape(_))));
}

fn tables(len: usize, inv_freq: &[f64]) -> (Vec<f32>, Vec<f32>) {
    let mut c = Vec::new();
    let mut s = Vec::new();
    for p in 0..len {
        for fr in inv_freq {
            let a = p as f64 * fr;
            c.push(a.cos() as f32);
            s.push(a.sin() as f32);
        }
    }
    (c, s)
}

#[test]
fn rope_matches_f64_reference_and_inverts() {
    let mut rng = Rng::new(2);
    for spec in chips() {
        for &(rows, heads, d, r) in &[
            (3, 64, 512, 64),
            (1, 1, 24, 8),
            (5, 7, 40, 40),
            (2, 3, 130, 6),
        ] {
            let inv: Vec<f64> = (0..r / 2)
                .map(|i| 10000f64.powf(-2.0 * i as f64 / r as f64))
                .collect();
            let table = 300;
            let (c, s) = tables(table, &inv);
            let x = rng.bf16s(rows * heads * d, -2.0, 2.0);
            let pos: Vec<u32> = (0..rows).map(|i| (i * 97 % table) as u32).collect();
            for inverse in [false, true] {
                let shape = RopeShape {
                    rows,
                    heads,
                    head_dim: d,
                    rope_dim: r,
                    table_len: table,
                    inverse,
                };
                let t = RopeTiling::plan(&spec, &shape).unwrap();
                let y = emu::rope(&spec, &t, &x, &pos, &c, &s).unwrap();
                let want = rope_ref(&f(&x), rows, heads, d, &pos, &inv, inverse);
                let xf = f(&x);
                for (i, (g, w)) in f(&y).iter().zip(&want).enumerate() {
                    let pair = i - (i % d) + (i % d) / 2 * 2;
                    let mag = xf[pair].abs() + xf.get(pair + 1).map_or(0.0, |v| v.abs());
                    assert!(
                        (g - w).abs() <= bf16_tol(mag) + 1e-6 * mag,
                        "[{i}] {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn rope_rejects_positions_outside_the_table() {
    let spec = Chip::Ascend950.spec();
    let t = RopeTiling::plan(
        &spec,
        &RopeShape {
            rows: 1,
            heads: 1,
            head_dim: 16,
            rope_dim: 8,
            table_len: 4,
            inverse: false,
        },
    )
    .unwrap();
    let x = vec![bf16::ONE; 16];
    let c = vec![1.0; 16];
    assert!(emu::rope(&spec, &t, &x, &[4], &c, &c).is_err());
}

fn mx_operands(
    rng: &mut Rng,
    m: usize,
    n: usize,
    k: usize,
    wf: MxFormat,
) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>) {
    let x = rng.vec(m * k, -2.0, 2.0);
    let w = rng.vec(n * k, -0.5, 0.5);
    let (xq, xs) = mx::quantize(MxFormat::Fp8E4M3, &x);
    let mut wq = Vec::new();
    let mut ws = Vec::new();
    for row in w.chunks(k) {
        let (q, s) = mx::quantize(wf, row);
        wq.extend(q);
        ws.extend(s);
    }
    (xq, xs, wq, ws)
}

#[test]
fn gemv_bf16_and_mx_match_f64_reference() {
    let mut rng = Rng::new(3);
    for spec in chips() {
        for &(m, n, k) in &[
            (1, 72, 5120),
            (4, 1000, 96),
            (16, 13, 4160),
            (3, 4099, 64),
            (2, 8, 8192),
        ] {
            // bf16
            let x = rng.bf16s(m * k, -2.0, 2.0);
            let w = rng.bf16s(n * k, -0.5, 0.5);
            let t = GemvTiling::plan(
                &spec,
                &GemvShape {
                    m,
                    n,
                    k,
                    format: GemvFormat::Bf16,
                },
            )
            .unwrap();
            let y = emu::gemv(&spec, &t, GemvInputs::Bf16 { x: &x, w: &w }).unwrap();
            let (want, mag) = gemv_ref(&f(&x), &f(&w), m, n, k);
            for i in 0..m * n {
                assert!(
                    (f64::from(y[i]) - want[i]).abs() <= 1e-5 * mag[i] + 1e-30,
                    "bf16 {m}x{n}x{k} [{i}]"
                );
            }
            // MX
            for wf in [MxFormat::Fp8E4M3, MxFormat::Fp4E2M1] {
                let (xq, xs, wq, ws) = mx_operands(&mut rng, m, n, k, wf);
                let t = GemvTiling::plan(
                    &spec,
                    &GemvShape {
                        m,
                        n,
                        k,
                        format: GemvFormat::Mx(wf),
                    },
                )
                .unwrap();
                let y = emu::gemv(
                    &spec,
                    &t,
                    GemvInputs::Mx {
                        format: wf,
                        x: &xq,
                        x_scales: &xs,
                        w: &wq,
                        w_scales: &ws,
                    },
                )
                .unwrap();
                let xd: Vec<f64> = mx::dequantize(MxFormat::Fp8E4M3, &xq, &xs, m * k)
                    .iter()
                    .map(|&v| f64::from(v))
                    .collect();
                let wd: Vec<f64> = (0..n)
                    .flat_map(|j| {
                        let row = &wq[j * wf.bytes(k)..(j + 1) * wf.bytes(k)];
                        let sc = &ws[j * k / 32..(j + 1) * k / 32];
                        mx::dequantize(wf, row, sc, k)
                    })
                    .map(f64::from)
                    .collect();
                let (want, mag) = gemv_ref(&xd, &wd, m, n, k);
                for i in 0..m * n {
                    assert!(
                        (f64::from(y[i]) - want[i]).abs() <= 1e-5 * mag[i] + 1e-30,
                        "{wf:?} {m}x{n}x{k} [{i}]"
                    );
                }
            }
        }
    }
}

#[test]
fn gemv_rejects_bad_shapes_and_mismatched_inputs() {
    let spec = Chip::Ascend910B.spec();
    assert!(
        GemvTiling::plan(
            &spec,
            &GemvShape {
                m: 17,
                n: 8,
                k: 32,
                format: GemvFormat::Bf16
            }
        )
        .is_err()
    );
    assert!(
        GemvTiling::plan(
            &spec,
            &GemvShape {
                m: 1,
                n: 8,
                k: 48,
                format: GemvFormat::Mx(MxFormat::Fp8E4M3)
            }
        )
        .is_err()
    );
    let t = GemvTiling::plan(
        &spec,
        &GemvShape {
            m: 1,
            n: 8,
            k: 32,
            format: GemvFormat::Bf16,
        },
    )
    .unwrap();
    let x = vec![bf16::ONE; 31];
    let w = vec![bf16::ONE; 8 * 32];
    assert!(emu::gemv(&spec, &t, GemvInputs::Bf16 { x: &x, w: &w }).is_err());
}

#[test]
fn router_matches_f64_reference() {
    let mut rng = Rng::new(4);
    for spec in chips() {
        for &(rows, experts, k, score, renorm) in &[
            (5, 384, 6, ScoreFunc::SqrtSoftplus, true),
            (70, 256, 8, ScoreFunc::Softmax, false),
            (1, 13, 13, ScoreFunc::Softmax, true),
            (3, 128, 3, ScoreFunc::SqrtSoftplus, false),
        ] {
            let logits = rng.vec(rows * experts, -6.0, 30.0);
            let bias = rng.vec(experts, -0.2, 0.2);
            let temp = 1.3f32;
            let shape = RouterShape {
                rows,
                experts,
                top_k: k,
                score,
                temperature: temp,
                renorm,
                route_scale: 1.5,
            };
            let t = RouterTiling::plan(&spec, &shape).unwrap();
            let out = emu::router(&spec, &t, &logits, &bias).unwrap();
            let lf: Vec<f64> = logits.iter().map(|&v| f64::from(v)).collect();
            let bf: Vec<f64> = bias.iter().map(|&v| f64::from(v)).collect();
            let (keys, ids, wts) = router_ref(
                &lf,
                &bf,
                experts,
                k,
                score == ScoreFunc::Softmax,
                f64::from(temp),
                renorm,
                1.5,
            );
            for i in 0..rows * k {
                let r = i / k;
                if out.ids[i] != ids[i] {
                    let (a, b) = (keys[r][out.ids[i] as usize], keys[r][ids[i] as usize]);
                    assert!(
                        (a - b).abs() < 1e-5,
                        "row {r}: id {} vs {} (keys {a} {b})",
                        out.ids[i],
                        ids[i]
                    );
                    continue;
                }
                let w = f64::from(out.weights[i]);
                assert!(
                    (w - wts[i]).abs() <= 1e-5 * wts[i].abs() + 1e-12,
                    "row {r} slot {} {w} vs {}",
                    i % k,
                    wts[i]
                );
            }
        }
    }
}

#[test]
fn router_ties_go_to_the_lowest_expert() {
    let spec = Chip::Ascend950.spec();
    let shape = RouterShape {
        rows: 1,
        experts: 6,
        top_k: 3,
        score: ScoreFunc::Softmax,
        temperature: 1.0,
        renorm: true,
        route_scale: 1.0,
    };
    let t = RouterTiling::plan(&spec, &shape).unwrap();
    let out = emu::router(&spec, &t, &[1.0, 2.0, 2.0, 0.0, 2.0, 1.0], &[0.0; 6]).unwrap();
    assert_eq!(out.ids, vec![1, 2, 4]);
    let s: f32 = out.weights.iter().sum();
    assert!((s - 1.0).abs() < 1e-6);
}

#[test]
fn hc_mix_matches_f64_reference() {
    let mut rng = Rng::new(5);
    for spec in chips() {
        for &(rows, ns, d) in &[(2, 4, 5120), (1, 4, 100), (9, 3, 4097), (3, 1, 16)] {
            let x = rng.bf16s(rows * ns * d, -4.0, 4.0);
            let out = rng.bf16s(rows * d, -4.0, 4.0);
            let post = rng.vec(rows * ns, 0.0, 2.0);
            let comb = rng.vec(rows * ns * ns, 0.0, 1.0);
            let t = HcMixTiling::plan(
                &spec,
                &HcMixShape {
                    rows,
                    streams: ns,
                    dim: d,
                },
            )
            .unwrap();
            let y = emu::hc_mix(&spec, &t, &x, &out, &post, &comb).unwrap();
            let pf: Vec<f64> = post.iter().map(|&v| f64::from(v)).collect();
            let cf: Vec<f64> = comb.iter().map(|&v| f64::from(v)).collect();
            let (want, mag) = hc_mix_ref(&f(&x), &f(&out), &pf, &cf, rows, ns, d);
            for (i, g) in f(&y).iter().enumerate() {
                assert!(
                    (g - want[i]).abs() <= bf16_tol(mag[i]),
                    "{rows}x{ns}x{d} [{i}] {g} vs {}",
                    want[i]
                );
            }
        }
    }
}

#[test]
fn attention_matches_f64_reference() {
    let mut rng = Rng::new(6);
    for spec in chips() {
        for &(heads, d, nw, nc, crow) in &[
            (64, 512, 128, 300, 1000),
            (3, 64, 1, 0, 0),
            (10, 32, 7, 77, 90),
            (49, 16, 130, 5, 5),
        ] {
            let q = rng.bf16s(heads * d, -1.0, 1.0);
            let win = rng.bf16s(nw * d, -1.0, 1.0);
            let comp = rng.bf16s(crow * d, -1.0, 1.0);
            let idx: Vec<u32> = (0..nc).map(|i| ((i * 7919) % crow.max(1)) as u32).collect();
            let sinks = rng.vec(heads, -2.0, 2.0);
            let scale = 1.0 / (d as f32).sqrt() * 4.0;
            let shape = AttentionShape {
                heads,
                head_dim: d,
                n_window: nw,
                n_comp: nc,
                comp_rows: crow,
                scale,
            };
            let t = AttentionTiling::plan(&spec, &shape).unwrap();
            let o = emu::attention(
                &spec,
                &t,
                AttentionInputs {
                    q: &q,
                    window: &win,
                    comp: &comp,
                    comp_idx: &idx,
                    sinks: &sinks,
                },
            )
            .unwrap();
            let mut keys = f(&win);
            let cf = f(&comp);
            for &i in &idx {
                keys.extend_from_slice(&cf[i as usize * d..(i as usize + 1) * d]);
            }
            let sf: Vec<f64> = sinks.iter().map(|&v| f64::from(v)).collect();
            let want = attention_ref(&f(&q), &keys, &sf, heads, d, f64::from(scale));
            for (i, g) in f(&o).iter().enumerate() {
                assert!(
                    (g - want[i]).abs() <= bf16_tol(want[i].abs()) + 2e-6,
                    "h{} [{i}] {g} vs {}",
                    i / d,
                    want[i]
                );
            }
        }
    }
}

#[test]
fn attention_rejects_out_of_range_indices() {
    let spec = Chip::Ascend950.spec();
    let shape = AttentionShape {
        heads: 1,
        head_dim: 16,
        n_window: 1,
        n_comp: 1,
        comp_rows: 2,
        scale: 1.0,
    };
    let t = AttentionTiling::plan(&spec, &shape).unwrap();
    let z = vec![bf16::ZERO; 32];
    let r = emu::attention(
        &spec,
        &t,
        AttentionInputs {
            q: &z[..16],
            window: &z[..16],
            comp: &z,
            comp_idx: &[2],
            sinks: &[0.0],
        },
    );
    assert!(r.is_err());
}

/// The integer-CDF pick, written as plainly as possible.
fn sample_ref(p: &[f32], u: u32) -> u32 {
    let w: Vec<u128> = p
        .iter()
        .map(|&x| u128::from(emu::fixed_weight(x, 24)))
        .collect();
    let total: u128 = w.iter().sum();
    if total == 0 {
        return p.len() as u32;
    }
    let target = (u128::from(u) * total) >> 32;
    let mut run = 0;
    for (i, x) in w.iter().enumerate() {
        run += x;
        if run > target {
            return i as u32;
        }
    }
    unreachable!()
}

#[test]
fn sampling_is_exact_and_tiling_independent() {
    let mut rng = Rng::new(7);
    for spec in chips() {
        for &(rows, vocab) in &[(3, 129_280), (70, 1000), (2, 5), (1, 40_001)] {
            let mut probs = Vec::new();
            for _ in 0..rows {
                let raw = rng.vec(vocab, 0.0, 1.0);
                let sum: f32 = raw.iter().map(|v| v.powi(8)).sum();
                probs.extend(raw.iter().map(|v| v.powi(8) / sum));
            }
            let us: Vec<u32> = (0..rows).map(|_| rng.next_u64() as u32).collect();
            let t = SamplingTiling::plan(&spec, &SamplingShape { rows, vocab }).unwrap();
            let toks = emu::sampling(&spec, &t, &probs, &us).unwrap();
            for r in 0..rows {
                assert_eq!(
                    toks[r],
                    sample_ref(&probs[r * vocab..(r + 1) * vocab], us[r]),
                    "row {r}"
                );
            }
            // A smaller tile (more tiles, a different tail) picks the same tokens.
            let mut small = t;
            small.tile_len = 8;
            small.tile_num = vocab.div_ceil(8) as u32;
            small.tail_len = (vocab - (vocab.div_ceil(8) - 1) * 8) as u32;
            small.in_bytes = 32;
            small.tmp_bytes = 64;
            assert_eq!(emu::sampling(&spec, &small, &probs, &us).unwrap(), toks);
        }
    }
}

#[test]
fn sampling_edge_cases() {
    let spec = Chip::Ascend910B.spec();
    let t = SamplingTiling::plan(&spec, &SamplingShape { rows: 3, vocab: 4 }).unwrap();
    let probs = [
        0.0,
        0.0,
        0.0,
        0.0,
        /* */ 0.0,
        1.0,
        0.0,
        0.0,
        /* */ f32::NAN,
        -1.0,
        0.5,
        0.5,
    ];
    let toks = emu::sampling(&spec, &t, &probs, &[123, u32::MAX, 0]).unwrap();
    assert_eq!(toks, vec![4, 1, 2]);
    // Probabilities far above one would overflow the device's int32 sums: rejected.
    let t = SamplingTiling::plan(&spec, &SamplingShape { rows: 1, vocab: 2 }).unwrap();
    assert!(emu::sampling(&spec, &t, &[100.0, 100.0], &[0]).is_err());
}

#[test]
fn emulator_catches_an_over_budget_tiling() {
    let spec = Chip::Ascend910B.spec();
    let mut t = HcMixTiling::plan(
        &spec,
        &HcMixShape {
            rows: 1,
            streams: 4,
            dim: 5120,
        },
    )
    .unwrap();
    t.x_bytes = 64 * 1024;
    let x = vec![bf16::ONE; 4 * 5120];
    let o = vec![bf16::ONE; 5120];
    let e = emu::hc_mix(&spec, &t, &x, &o, &[1.0; 4], &[0.25; 16]).unwrap_err();
    assert!(matches!(e, AscendError::Emulator { .. }), "{e}");
    // A buffer too small for its tile is caught as well.
    let mut t = HcMixTiling::plan(
        &spec,
        &HcMixShape {
            rows: 1,
            streams: 4,
            dim: 5120,
        },
    )
    .unwrap();
    t.o_bytes = 32;
    assert!(emu::hc_mix(&spec, &t, &x, &o, &[1.0; 4], &[0.25; 16]).is_err());
}
