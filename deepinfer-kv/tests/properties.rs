//! Property tests of the hit rule, the hash chain, the window-state store and the persistent store.

use std::sync::Arc;

use deepinfer_kv::{
    BlockHash, BlockHasher, ExtraKeys, HashAlgo, HitRule, ManualClock, PersistentStore,
    PersistentStoreConfig, TrafficClass, WindowStateStore,
};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn hit_plan_is_consistent(
        len in 0usize..5000, matched in 0usize..5000, bs in 1usize..300,
        window in 0usize..300, slack in 0usize..10, present in any::<bool>(),
    ) {
        let rule = HitRule { window, spec_slack: slack };
        let p = rule.plan(len, matched, bs, |_| present);
        prop_assert_eq!(p.reused_tokens % bs, 0);
        prop_assert!(p.reused_tokens <= matched.min(len));
        prop_assert!(p.reused_tokens <= len.saturating_sub((window + slack).max(1)));
        prop_assert_eq!(p.reused_tokens + p.computed_tokens, len);
        prop_assert!(p.replayed_tokens <= p.reused_tokens);
        prop_assert!(p.replayed_tokens <= window);
        if present || window == 0 {
            prop_assert_eq!(p.replayed_tokens, 0);
            prop_assert_eq!(p.reused_tokens, (matched.min(len) / bs * bs).min(rule.max_reusable_tokens(len, bs)));
        }
    }

    #[test]
    fn chain_prefix_property(
        tokens in prop::collection::vec(0u32..1000, 0..200), bs in 1usize..17,
        cut in 0usize..200, sha in any::<bool>(), seed in any::<u64>(),
    ) {
        let algo = if sha { HashAlgo::Sha256 } else { HashAlgo::Xxh3_128 };
        let mut h = BlockHasher::new(algo, seed);
        let mut full = Vec::new();
        h.hash_chain(&tokens, bs, &ExtraKeys::none(), &mut full);
        prop_assert_eq!(full.len(), tokens.len() / bs);
        // A prefix of the tokens yields a prefix of the chain.
        let cut = cut.min(tokens.len());
        let mut part = Vec::new();
        h.hash_chain(&tokens[..cut], bs, &ExtraKeys::none(), &mut part);
        prop_assert_eq!(&full[..part.len()], &part[..]);
        // Changing one token changes its block's hash and every later one.
        if !full.is_empty() {
            let i = cut.min(full.len() * bs - 1);
            let mut changed = tokens.clone();
            changed[i] ^= 1;
            let mut other = Vec::new();
            h.hash_chain(&changed, bs, &ExtraKeys::none(), &mut other);
            for b in 0..full.len() {
                prop_assert_eq!(full[b] == other[b], b < i / bs);
            }
        }
    }

    #[test]
    fn window_store_stays_within_capacity(
        ops in prop::collection::vec((0u128..20, 1u64..400, any::<bool>()), 1..80),
        capacity in 400u64..2000,
    ) {
        let mut s = WindowStateStore::new(capacity);
        for (h, bytes, get) in ops {
            if get {
                let had = s.contains(BlockHash(h));
                prop_assert_eq!(s.get(BlockHash(h)).is_some(), had);
            } else {
                let evicted = s.insert(BlockHash(h), h, bytes).unwrap();
                prop_assert!(!evicted.contains(&BlockHash(h)));
                prop_assert!(s.contains(BlockHash(h)));
            }
            prop_assert!(s.usage().bytes <= capacity);
        }
    }
}

proptest! {
    // File I/O per case: keep the count modest.
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn a_damaged_block_is_never_served(
        payload in prop::collection::vec(any::<u8>(), 1..300),
        pos in any::<prop::sample::Index>(), bit in 0u8..8, truncate in any::<bool>(),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let mut s = PersistentStore::open_with_clock(
            PersistentStoreConfig::new(tmp.path(), 1 << 20),
            Arc::new(ManualClock::new(5)),
        ).unwrap();
        let h = BlockHash(77);
        s.put(h, TrafficClass::CHAT, &payload).unwrap();
        let path = tmp.path().join(format!("{}.kvb", h.to_hex()));
        let mut bytes = std::fs::read(&path).unwrap();
        if truncate {
            bytes.truncate(pos.index(bytes.len()));
        } else {
            let i = pos.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        std::fs::write(&path, &bytes).unwrap();
        prop_assert_eq!(s.get(h).unwrap(), None);
        prop_assert!(!path.exists());
    }
}
