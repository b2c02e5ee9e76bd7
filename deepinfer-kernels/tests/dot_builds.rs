//! The SIMD dot products (selected at run time) are bit-identical to the portable build, so
//! GEMV results and batch-invariant mode do not depend on the CPU.

mod common;

use common::Rng;
use deepinfer_kernels::cpu::gemm::{dot_bf16, dot_bf16_portable, dot_f32, dot_f32_portable};
use half::bf16;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn simd_dot_matches_portable_bits(seed in 0u64..1_000_000, n in 0usize..700, mag in -20i32..20) {
        let mut rng = Rng::new(seed);
        let s = 2f32.powi(mag);
        let x = rng.vec(n, s);
        let extra = rng.below(3);
        let w = rng.vec(n + extra, 1.0 / s);
        prop_assert_eq!(dot_f32(&x, &w).to_bits(), dot_f32_portable(&x, &w).to_bits());
        let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        prop_assert_eq!(dot_bf16(&x, &wb).to_bits(), dot_bf16_portable(&x, &wb).to_bits());
    }
}

#[test]
fn dot_is_exact_on_small_integers() {
    // 1..=100 squared sums to 338350, exact in f32 whatever the order.
    let x: Vec<f32> = (1..=100).map(|v| v as f32).collect();
    assert_eq!(dot_f32(&x, &x), 338_350.0);
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    assert_eq!(dot_bf16(&x, &xb), 338_350.0);
}
