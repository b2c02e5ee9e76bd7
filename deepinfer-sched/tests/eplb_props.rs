//! EPLB placements are valid, and the incremental mode respects its move budget.

use deepinfer_sched::testing::{check_placement, expert_load_case as case};
use deepinfer_sched::{EplbConfig, ExpertLoad, Placement, rebalance, rebalance_incremental};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn rebalance_is_valid((load, cfg) in case()) {
        match rebalance(&load, &cfg) {
            Ok(p) => {
                check_placement(&p, &load, &cfg).map_err(TestCaseError::fail)?;
                let lb = p.moe_lb(&load);
                prop_assert!(lb.max >= 1.0 - 1e-9 && lb.mean >= 1.0 - 1e-9 && lb.mean <= lb.max + 1e-9);
                if cfg.is_hierarchical() {
                    // Every replica sits on the node its group was packed to.
                    let gsize = load.experts() / cfg.groups;
                    let per_node = cfg.slots / cfg.nodes;
                    for l in 0..load.layers() {
                        let mut node_of_group = vec![usize::MAX; cfg.groups];
                        for (s, &e) in p.layer(l).iter().enumerate() {
                            let g = e as usize / gsize;
                            let n = s / per_node;
                            prop_assert!(node_of_group[g] == usize::MAX || node_of_group[g] == n);
                            node_of_group[g] = n;
                        }
                    }
                }
            }
            // Only shape errors are allowed (e.g. hierarchical with too few slots per node).
            Err(e) => prop_assert!(matches!(e, deepinfer_sched::EplbError::Shape(_)), "{e}"),
        }
    }

    #[test]
    fn incremental_respects_budget_and_never_worsens((load, cfg) in case(), moves in 0usize..12, seed in 0u64..1000) {
        let flat = EplbConfig { groups: 1, nodes: 1, ..cfg };
        let start = rebalance(&load, &flat).unwrap();
        // The load shifts: scramble it and rebalance incrementally from the old placement.
        let mut data: Vec<f64> = (0..load.layers())
            .flat_map(|l| load.layer(l).to_vec())
            .collect();
        let n = data.len();
        for i in 0..n {
            let j = (seed as usize).wrapping_mul(31).wrapping_add(i * 17) % n;
            data.swap(i, j);
        }
        let shifted = ExpertLoad::new(load.layers(), load.experts(), data).unwrap();
        let next = rebalance_incremental(&shifted, &start, moves).unwrap();
        check_placement(&next, &shifted, &flat).map_err(TestCaseError::fail)?;
        for (l, &m) in next.moved_from(&start).iter().enumerate() {
            prop_assert!(m <= moves, "layer {l} moved {m} > {moves}");
            let before = start.device_loads(l, &shifted).iter().copied().fold(0.0, f64::max);
            let after = next.device_loads(l, &shifted).iter().copied().fold(0.0, f64::max);
            prop_assert!(after <= before * (1.0 + 1e-12));
        }
    }
}

#[test]
fn skewed_load_is_balanced_well() {
    // 4 layers × 256 experts, Zipf-like skew, 32 redundant slots over 32 devices.
    let experts = 256;
    let mut data = Vec::new();
    for l in 0..4 {
        for e in 0..experts {
            let rank = (e * 37 + l * 11) % experts + 1;
            data.push(1e4 / rank as f64);
        }
    }
    let load = ExpertLoad::new(4, experts, data).unwrap();
    let cfg = EplbConfig {
        slots: 288,
        groups: 8,
        nodes: 1,
        devices: 32,
    };
    let p = rebalance(&load, &cfg).unwrap();
    let lb = p.moe_lb(&load);
    // Identity-like placement for comparison: expert e on device e / 8, redundant slots idle copies.
    let naive: Vec<u32> = (0..4)
        .flat_map(|_| (0..288u32).map(|s| if s < 256 { s } else { s - 256 }))
        .collect();
    let naive = Placement::from_slots(4, experts, 32, naive).unwrap();
    let naive_lb = naive.moe_lb(&load);
    assert!(lb.max < 1.15, "moe_lb {}", lb.max);
    assert!(
        naive_lb.max > 2.0 * lb.max,
        "naive {} vs {}",
        naive_lb.max,
        lb.max
    );
}

#[test]
fn incremental_improves_within_budget() {
    let experts = 64;
    let uniform = ExpertLoad::new(1, experts, vec![1.0; experts]).unwrap();
    let cfg = EplbConfig {
        slots: 80,
        groups: 1,
        nodes: 1,
        devices: 8,
    };
    let start = rebalance(&uniform, &cfg).unwrap();
    // Now four single-replica experts become very hot.
    let mut data = vec![1.0; experts];
    for e in [16, 24, 32, 40] {
        data[e] = 30.0;
    }
    let hot = ExpertLoad::new(1, experts, data).unwrap();
    let before = start.moe_lb(&hot).max;
    let next = rebalance_incremental(&hot, &start, 8).unwrap();
    let after = next.moe_lb(&hot).max;
    let full = rebalance(&hot, &cfg).unwrap();
    assert!(next.moved_from(&start)[0] <= 8);
    assert!(after < before * 0.8, "{before} -> {after}");
    // A full rebalance moves far more experts for its extra balance.
    assert!(full.moved_from(&start)[0] > 8);
}
