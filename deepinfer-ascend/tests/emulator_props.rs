//! Property tests over ragged shapes: every emulated run writes each output exactly once and
//! stays inside the UB (the emulator fails otherwise), and matches the f64 reference.

#![allow(clippy::needless_range_loop)]

mod common;

use common::*;
use deepinfer_ascend::Chip;
use deepinfer_ascend::emu::{self, AttentionInputs, GemvInputs};
use deepinfer_ascend::tiling::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn rmsnorm_any_shape(c in 0usize..2, rows in 1usize..12, dim in 1usize..3000, seed: u64) {
        let s = Chip::ALL[c].spec();
        let mut rng = common::Rng::new(seed);
        let x = rng.bf16s(rows * dim, -4.0, 4.0);
        let w = rng.vec(dim, -2.0, 2.0);
        let t = RmsNormTiling::plan(&s, &RmsNormShape { rows, dim, eps: 1e-5, quant: dim % 32 == 0 }).unwrap();
        let out = emu::rmsnorm_quant(&s, &t, &x, &w).unwrap();
        let wf: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
        let want = rmsnorm_ref(&f(&x), &wf, rows, dim, 1e-5);
        for (g, r) in f(&out.y).iter().zip(&want) {
            prop_assert!((g - r).abs() <= bf16_tol(r.abs()));
        }
    }

    #[test]
    fn hc_mix_any_shape(c in 0usize..2, rows in 1usize..6, ns in 1usize..6, dim in 1usize..2500, seed: u64) {
        let s = Chip::ALL[c].spec();
        let mut rng = common::Rng::new(seed);
        let x = rng.bf16s(rows * ns * dim, -2.0, 2.0);
        let o = rng.bf16s(rows * dim, -2.0, 2.0);
        let post = rng.vec(rows * ns, 0.0, 2.0);
        let comb = rng.vec(rows * ns * ns, 0.0, 1.0);
        let t = HcMixTiling::plan(&s, &HcMixShape { rows, streams: ns, dim }).unwrap();
        let y = emu::hc_mix(&s, &t, &x, &o, &post, &comb).unwrap();
        let pf: Vec<f64> = post.iter().map(|&v| f64::from(v)).collect();
        let cf: Vec<f64> = comb.iter().map(|&v| f64::from(v)).collect();
        let (want, mag) = hc_mix_ref(&f(&x), &f(&o), &pf, &cf, rows, ns, dim);
        for (i, g) in f(&y).iter().enumerate() {
            prop_assert!((g - want[i]).abs() <= bf16_tol(mag[i]));
        }
    }

    #[test]
    fn gemv_any_shape(c in 0usize..2, m in 1usize..=16, n in 1usize..300, k16 in 1usize..80, seed: u64) {
        let s = Chip::ALL[c].spec();
        let mut rng = common::Rng::new(seed);
        let k = k16 * 16;
        let x = rng.bf16s(m * k, -1.0, 1.0);
        let w = rng.bf16s(n * k, -1.0, 1.0);
        let t = GemvTiling::plan(&s, &GemvShape { m, n, k, format: GemvFormat::Bf16 }).unwrap();
        let y = emu::gemv(&s, &t, GemvInputs::Bf16 { x: &x, w: &w }).unwrap();
        let (want, mag) = gemv_ref(&f(&x), &f(&w), m, n, k);
        for i in 0..m * n {
            prop_assert!((f64::from(y[i]) - want[i]).abs() <= 1e-5 * mag[i] + 1e-30);
        }
    }

    #[test]
    fn attention_any_shape(c in 0usize..2, heads in 1usize..70, d16 in 1usize..6, nw in 0usize..40, nc in 0usize..40, seed: u64) {
        let s = Chip::ALL[c].spec();
        let mut rng = common::Rng::new(seed);
        let d = d16 * 16;
        let crow = nc + 3;
        let q = rng.bf16s(heads * d, -1.0, 1.0);
        let win = rng.bf16s(nw * d, -1.0, 1.0);
        let comp = rng.bf16s(crow * d, -1.0, 1.0);
        let idx: Vec<u32> = (0..nc).map(|_| (rng.next_u64() % crow as u64) as u32).collect();
        let sinks = rng.vec(heads, -1.0, 1.0);
        let shape = AttentionShape { heads, head_dim: d, n_window: nw, n_comp: nc, comp_rows: crow, scale: 0.3 };
        let t = AttentionTiling::plan(&s, &shape).unwrap();
        let o = emu::attention(&s, &t, AttentionInputs { q: &q, window: &win, comp: &comp, comp_idx: &idx, sinks: &sinks }).unwrap();
        let mut keys = f(&win);
        let cf = f(&comp);
        for &i in &idx {
            keys.extend_from_slice(&cf[i as usize * d..(i as usize + 1) * d]);
        }
        let sf: Vec<f64> = sinks.iter().map(|&v| f64::from(v)).collect();
        let want = attention_ref(&f(&q), &keys, &sf, heads, d, 0.3);
        for (i, g) in f(&o).iter().enumerate() {
            prop_assert!((g - want[i]).abs() <= bf16_tol(want[i].abs()) + 2e-6);
        }
    }

    #[test]
    fn sampling_same_token_on_both_chips(rows in 1usize..5, vocab in 1usize..5000, seed: u64) {
        let mut rng = common::Rng::new(seed);
        let raw = rng.vec(rows * vocab, 0.0, 1.0);
        let mut probs = Vec::new();
        for r in raw.chunks(vocab) {
            let sum: f32 = r.iter().sum();
            probs.extend(r.iter().map(|v| v / sum));
        }
        let us: Vec<u32> = (0..rows).map(|_| rng.next_u64() as u32).collect();
        let mut picks = Vec::new();
        for chip in Chip::ALL {
            // Different core counts and UB sizes give different splits and tiles.
            let s = chip.spec();
            let t = SamplingTiling::plan(&s, &SamplingShape { rows, vocab }).unwrap();
            picks.push(emu::sampling(&s, &t, &probs, &us).unwrap());
        }
        prop_assert_eq!(&picks[0], &picks[1]);
        for (r, &tok) in picks[0].iter().enumerate() {
            prop_assert!((tok as usize) < vocab);
            prop_assert!(emu::fixed_weight(probs[r * vocab + tok as usize], 24) > 0);
        }
    }
}
