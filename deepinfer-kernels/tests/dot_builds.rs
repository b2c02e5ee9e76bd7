//! The SIMD dot products (selected at run time) are bit-identical to the portable build, so
//! GEMV results and batch-invariant mode do not depend on the CPU; the backend's matmul, in
//! both modes and whichever kernel it picks for f32 and bf16 weights, gives every output as
//! that dot product.

mod common;

use common::Rng;
use deepinfer_kernels::cpu::gemm::{dot_bf16, dot_bf16_portable, dot_f32, dot_f32_portable};
use deepinfer_kernels::{Backend, CpuBackend, CpuConfig};
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn matmul_outputs_are_portable_dots(
        seed in 0u64..1_000_000,
        m in 1usize..14,
        k in 1usize..300,
        n in 1usize..40,
        invariant in any::<bool>(),
        threads in 1usize..3,
    ) {
        let mut rng = Rng::new(seed);
        let x = rng.vec(m * k, 1.0);
        let w = rng.vec(n * k, 1.0);
        let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        let b = CpuBackend::with_config(CpuConfig { batch_invariant: invariant, threads: Some(threads) }).unwrap();
        let xt = b.upload_f32(&x, &[m, k]).unwrap();
        let y32 = b.download_f32(&b.matmul(&xt, &b.upload_f32(&w, &[n, k]).unwrap()).unwrap()).unwrap();
        let y16 = b.download_f32(&b.matmul(&xt, &b.upload_bf16(&wb, &[n, k]).unwrap()).unwrap()).unwrap();
        for i in 0..m {
            for j in 0..n {
                let (xr, wr, wbr) = (&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k], &wb[j * k..(j + 1) * k]);
                prop_assert_eq!(y32[i * n + j].to_bits(), dot_f32_portable(xr, wr).to_bits(), "f32 ({}, {})", i, j);
                prop_assert_eq!(y16[i * n + j].to_bits(), dot_bf16_portable(xr, wbr).to_bits(), "bf16 ({}, {})", i, j);
            }
        }
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
