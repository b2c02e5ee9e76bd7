//! The global state (compressed entries, indexer keys) lives in paged blocks whose ids come
//! from `deepinfer-kv`: snapshots fork (full blocks shared, the partial one copied), a
//! continued snapshot matches the original bit for bit, and no block outlives its states.

mod common;
use common::*;
use deepinfer_engine::{BatchItem, Logits};
use proptest::prelude::*;
use std::collections::BTreeSet;

fn used(m: &deepinfer_engine::Model<deepinfer_kernels::CpuBackend>) -> usize {
    m.global_cache().lock().unwrap().used_blocks()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn block_ids_come_from_kv_and_never_leak(
        cut in 1usize..99,
        extra in 1usize..20,
        v41 in any::<bool>(),
    ) {
        let dir = if v41 { "v41-tiny-dev" } else { "v4-tiny-dev" };
        let m = load(dir);
        let g = golden(dir);
        let ids = g["p3.input_ids"].ids();
        let (head, tail) = ids.split_at(cut);
        let tail = &tail[..extra.min(tail.len())];
        let block_tokens = m.global_cache().lock().unwrap().block_tokens();
        {
            let mut a = m.new_state();
            m.forward(&mut [BatchItem { state: &mut a, tokens: head }], Logits::Last, None).unwrap();
            let snap = a.clone();
            let (ta, ts) = (a.global.block_ids(), snap.global.block_ids());
            prop_assert!(!ta.is_empty() || cut < block_tokens.min(4));
            // Ids are the kv manager's: every live id is referenced, and nothing else is.
            let live: BTreeSet<u32> = ta.iter().chain(&ts).copied().collect();
            prop_assert_eq!(live.len(), used(&m));
            {
                let cache = m.global_cache().lock().unwrap();
                for id in &live {
                    prop_assert!(cache.block_manager().pool().ref_count(*id).unwrap() >= 1);
                }
            }
            // Full blocks shared, the partial last one copied.
            prop_assert_eq!(ta.len(), ts.len());
            if let (Some(x), Some(y)) = (ta.last(), ts.last()) {
                let partial = a.global_entries().iter().zip(&m.cfg.compress_ratios)
                    .any(|(&e, &r)| r > 0 && e * r % block_tokens != 0);
                prop_assert_eq!(x != y, partial);
                prop_assert_eq!(&ta[..ta.len() - 1], &ts[..ts.len() - 1]);
            }
            // Both continue independently and identically.
            let mut b = snap;
            let la = m.forward(&mut [BatchItem { state: &mut a, tokens: tail }], Logits::All, None).unwrap();
            let lb = m.forward(&mut [BatchItem { state: &mut b, tokens: tail }], Logits::All, None).unwrap();
            prop_assert_eq!(la, lb);
            prop_assert_eq!(a.global_entries(), b.global_entries());
            drop(a);
            prop_assert_eq!(b.global.block_ids().len(), used(&m));
        }
        prop_assert_eq!(used(&m), 0);
        prop_assert_eq!(m.global_cache().lock().unwrap().held_tensors(), 0);
    }
}
