//! MX element encoding is round-to-nearest-even onto the representable grid, and quantise →
//! dequantise stays within half a grid step of the scaled value (no saturation).

use deepinfer_ascend::mx::{self, MX_BLOCK, MxFormat};
use proptest::prelude::*;

fn grid(f: MxFormat) -> Vec<(u8, f64)> {
    let n: u8 = if f == MxFormat::Fp8E4M3 { 0x7f } else { 0x8 };
    (0..n).map(|c| (c, f64::from(f.decode(c)))).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn encode_is_nearest_even(v in -500.0f32..500.0, fp4: bool) {
        let f = if fp4 { MxFormat::Fp4E2M1 } else { MxFormat::Fp8E4M3 };
        let a = f64::from(v.abs()).min(f64::from(f.max_value()));
        let g = grid(f);
        let best = g.iter().map(|&(_, x)| (x - a).abs()).fold(f64::INFINITY, f64::min);
        let code = f.encode(v);
        let got = f64::from(f.decode(code)).abs();
        prop_assert!(((got - a).abs() - best).abs() < 1e-12, "{v}: got {got}, nearest distance {best}");
        // On an exact tie the chosen code is even.
        let ties: Vec<u8> = g.iter().filter(|&&(_, x)| ((x - a).abs() - best).abs() < 1e-12).map(|&(c, _)| c).collect();
        if ties.len() == 2 {
            prop_assert_eq!((code & 0x7f) % 2, 0);
        }
        prop_assert_eq!(code & if fp4 { 0x8 } else { 0x80 } != 0, v.is_sign_negative());
    }

    #[test]
    fn quantize_round_trip_bound(seed in 0u64..1000, scale_exp in -20i32..20, fp4: bool) {
        let f = if fp4 { MxFormat::Fp4E2M1 } else { MxFormat::Fp8E4M3 };
        let x: Vec<f32> = (0..4 * MX_BLOCK)
            .map(|i| (((i as u64 * 2_654_435_761 + seed) % 2001) as f32 / 1000.0 - 1.0) * 2f32.powi(scale_exp))
            .collect();
        let (codes, scales) = mx::quantize(f, &x);
        prop_assert_eq!(codes.len(), f.bytes(x.len()));
        let back = mx::dequantize(f, &codes, &scales, x.len());
        let rel = if fp4 { 0.25 } else { 1.0 / 16.0 };
        for (i, (a, b)) in x.iter().zip(&back).enumerate() {
            let s = mx::scale_value(scales[i / MX_BLOCK]);
            // Half a step at the value's binade (relative), or of the subnormal step.
            let sub = if fp4 { 0.25 } else { 2f32.powi(-10) };
            prop_assert!((a - b).abs() <= a.abs() * rel + s * sub, "[{i}] {a} -> {b} (scale {s})");
        }
    }
}
