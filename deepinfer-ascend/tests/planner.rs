//! Planner properties on both chips: every plan fits the UB (and the cube plan fits L1/L0),
//! buffers are whole 32-byte blocks, DataCopy counts are aligned, the block split covers the
//! work exactly once, and the tiling ABI serialises to its declared layout.

use deepinfer_ascend::Chip;
use deepinfer_ascend::mx::MxFormat;
use deepinfer_ascend::tiling::*;
use proptest::prelude::*;

fn spec(i: usize) -> deepinfer_ascend::ChipSpec {
    Chip::ALL[i % 2].spec()
}

fn check<T: KernelTiling>(t: &T, s: &deepinfer_ascend::ChipSpec) {
    t.validate().unwrap();
    let b = t.budget();
    assert!(
        b.total() <= s.ub_bytes,
        "{} uses {} of {} UB bytes",
        T::C_NAME,
        b.total(),
        s.ub_bytes
    );
    b.check(s, T::C_NAME).unwrap();
    assert_eq!(t.to_bytes().len(), 4 * T::FIELDS.len());
    for (i, f) in T::FIELDS.iter().enumerate() {
        assert_eq!(f.offset, 4 * i);
    }
}

fn covers(p: Partition, units: usize, max_blocks: u32) {
    assert!(p.block_dim >= 1 && p.block_dim <= max_blocks);
    let total: usize = (0..p.block_dim).map(|b| p.range(b).1).sum();
    assert_eq!(total, units);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn rmsnorm_plans_fit(c in 0usize..2, rows in 1usize..300, dim32 in 1usize..2000, quant: bool) {
        let s = spec(c);
        let dim = if quant { dim32 * 32 } else { dim32 * 17 };
        let t = RmsNormTiling::plan(&s, &RmsNormShape { rows, dim, eps: 1e-6, quant }).unwrap();
        check(&t, &s);
        prop_assert_eq!((t.tile_num as usize - 1) * t.tile_len as usize + t.tail_len as usize, dim);
        covers(Partition { block_dim: t.block_dim, per_block: t.rows_per_block, last: t.last_rows }, rows, s.vector_cores);
    }

    #[test]
    fn rope_plans_fit(c in 0usize..2, rows in 1usize..64, heads in 1usize..128, half in 1usize..64, nope in 0usize..512) {
        let s = spec(c);
        let d = 2 * half + nope;
        let t = RopeTiling::plan(&s, &RopeShape { rows, heads, head_dim: d, rope_dim: 2 * half, table_len: 8, inverse: false }).unwrap();
        check(&t, &s);
        covers(Partition { block_dim: t.block_dim, per_block: t.vecs_per_block, last: t.last_vecs }, rows * heads, s.vector_cores);
    }

    #[test]
    fn gemv_plans_fit(c in 0usize..2, m in 1usize..=16, n in 1usize..20000, k32 in 1usize..400, f in 0usize..3) {
        let s = spec(c);
        let format = [GemvFormat::Bf16, GemvFormat::Mx(MxFormat::Fp8E4M3), GemvFormat::Mx(MxFormat::Fp4E2M1)][f];
        let k = k32 * 32;
        let t = GemvTiling::plan(&s, &GemvShape { m, n, k, format }).unwrap();
        check(&t, &s);
        prop_assert_eq!((t.k_tiles as usize - 1) * t.k_tile as usize + t.k_tail as usize, k);
        covers(Partition { block_dim: t.block_dim, per_block: t.n_per_block, last: t.last_n }, n, s.vector_cores);
    }

    #[test]
    fn cube_plans_fit_l1_and_l0(c in 0usize..2, m in 1usize..=16, n in 1usize..20000, k in 1usize..20000, f in 0usize..3) {
        let s = spec(c);
        let format = [GemvFormat::Bf16, GemvFormat::Mx(MxFormat::Fp8E4M3), GemvFormat::Mx(MxFormat::Fp4E2M1)][f];
        match plan_cube_gemv(&s, m, n, k, format) {
            Ok(p) => {
                prop_assert!(p.l0a_used <= s.l0a_bytes && p.l0b_used <= s.l0b_bytes);
                prop_assert!(p.l0c_used <= s.l0c_bytes && p.l1_used <= s.l1_bytes);
                prop_assert_eq!(p.base_m, 16);
            }
            Err(e) => {
                // Only MX on a chip without native MX is refused.
                prop_assert!(!s.native_mx && f > 0, "{e}");
            }
        }
    }

    #[test]
    fn router_hc_attention_sampling_plans_fit(c in 0usize..2, rows in 1usize..200, e in 1usize..1024, d16 in 1usize..40, heads in 1usize..128, keys in 0usize..2000, vocab in 1usize..200_000) {
        let s = spec(c);
        let t = RouterTiling::plan(&s, &RouterShape { rows, experts: e, top_k: e.min(8), score: ScoreFunc::SqrtSoftplus, temperature: 1.0, renorm: true, route_scale: 1.0 }).unwrap();
        check(&t, &s);
        let t = HcMixTiling::plan(&s, &HcMixShape { rows, streams: 4, dim: d16 * 16 + rows }).unwrap();
        check(&t, &s);
        covers(Partition { block_dim: t.block_dim, per_block: t.cols_per_block, last: t.last_cols }, d16 * 16 + rows, s.vector_cores);
        let t = AttentionTiling::plan(&s, &AttentionShape { heads, head_dim: d16 * 16, n_window: keys.min(130), n_comp: keys, comp_rows: keys + 1, scale: 0.1 }).unwrap();
        check(&t, &s);
        covers(Partition { block_dim: t.block_dim, per_block: t.heads_per_block, last: t.last_heads }, heads, s.vector_cores);
        let t = SamplingTiling::plan(&s, &SamplingShape { rows, vocab }).unwrap();
        check(&t, &s);
    }
}

#[test]
fn deepseek_v41_decode_shapes_plan_on_both_chips() {
    for chip in Chip::ALL {
        let s = chip.spec();
        check(
            &RmsNormTiling::plan(
                &s,
                &RmsNormShape {
                    rows: 64,
                    dim: 5120,
                    eps: 1e-20,
                    quant: true,
                },
            )
            .unwrap(),
            &s,
        );
        check(
            &RopeTiling::plan(
                &s,
                &RopeShape {
                    rows: 64,
                    heads: 64,
                    head_dim: 512,
                    rope_dim: 64,
                    table_len: 1 << 20,
                    inverse: true,
                },
            )
            .unwrap(),
            &s,
        );
        for f in [
            GemvFormat::Bf16,
            GemvFormat::Mx(MxFormat::Fp8E4M3),
            GemvFormat::Mx(MxFormat::Fp4E2M1),
        ] {
            check(
                &GemvTiling::plan(
                    &s,
                    &GemvShape {
                        m: 16,
                        n: 2304,
                        k: 5120,
                        format: f,
                    },
                )
                .unwrap(),
                &s,
            );
            check(
                &GemvTiling::plan(
                    &s,
                    &GemvShape {
                        m: 1,
                        n: 129_280,
                        k: 5120,
                        format: f,
                    },
                )
                .unwrap(),
                &s,
            );
        }
        check(
            &RouterTiling::plan(
                &s,
                &RouterShape {
                    rows: 64,
                    experts: 384,
                    top_k: 6,
                    score: ScoreFunc::SqrtSoftplus,
                    temperature: 1.0,
                    renorm: true,
                    route_scale: 1.5,
                },
            )
            .unwrap(),
            &s,
        );
        check(
            &HcMixTiling::plan(
                &s,
                &HcMixShape {
                    rows: 64,
                    streams: 4,
                    dim: 5120,
                },
            )
            .unwrap(),
            &s,
        );
        check(
            &AttentionTiling::plan(
                &s,
                &AttentionShape {
                    heads: 64,
                    head_dim: 512,
                    n_window: 128,
                    n_comp: 2048,
                    comp_rows: 1 << 19,
                    scale: 0.044,
                },
            )
            .unwrap(),
            &s,
        );
        check(
            &SamplingTiling::plan(
                &s,
                &SamplingShape {
                    rows: 64,
                    vocab: 129_280,
                },
            )
            .unwrap(),
            &s,
        );
    }
    // With the same core split, the 950's larger UB never buys a smaller key tile.
    let a = AttentionShape {
        heads: 64,
        head_dim: 512,
        n_window: 128,
        n_comp: 2048,
        comp_rows: 4096,
        scale: 0.044,
    };
    let s950 = Chip::Ascend950.spec().with_cores(24, 8);
    let s910 = Chip::Ascend910B.spec().with_cores(24, 8);
    let t950 = AttentionTiling::plan(&s950, &a).unwrap();
    let t910 = AttentionTiling::plan(&s910, &a).unwrap();
    assert_eq!(t950.heads_per_block, t910.heads_per_block);
    assert!(
        t950.keys_per_tile >= t910.keys_per_tile,
        "{} vs {}",
        t950.keys_per_tile,
        t910.keys_per_tile
    );
    // MX on the 910B cube is refused, bf16 is planned.
    assert!(
        plan_cube_gemv(
            &Chip::Ascend910B.spec(),
            4,
            4096,
            5120,
            GemvFormat::Mx(MxFormat::Fp4E2M1)
        )
        .is_err()
    );
    assert!(plan_cube_gemv(&Chip::Ascend910B.spec(), 4, 4096, 5120, GemvFormat::Bf16).is_ok());
}

#[test]
fn impossible_shapes_are_budget_errors() {
    // A head_dim so large that one query head and one key row overflow the UB.
    let s = Chip::Ascend910B.spec();
    let e = AttentionTiling::plan(
        &s,
        &AttentionShape {
            heads: 1,
            head_dim: 65536,
            n_window: 1,
            n_comp: 0,
            comp_rows: 0,
            scale: 1.0,
        },
    );
    assert!(
        matches!(
            e,
            Err(deepinfer_ascend::AscendError::Budget { buffer: "UB", .. })
        ),
        "{e:?}"
    );
}
