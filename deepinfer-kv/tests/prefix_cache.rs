//! The prefix cache through the manager: the published hit-rule figures, extra keys, draft
//! tokens, metrics and events.

use std::cell::Cell;

use deepinfer_kv::{
    AllocateOptions, BlockHash, BlockManager, BlockManagerConfig, ExtraKeys, HitRule, KvEvent,
};

fn manager(blocks: usize, bs: usize, rule: HitRule) -> BlockManager {
    let mut cfg = BlockManagerConfig::new(blocks, bs);
    cfg.hit_rule = rule;
    BlockManager::new(cfg).unwrap()
}

fn context() -> Vec<u32> {
    (0..10_000u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % 50_000)
        .collect()
}

#[test]
fn ten_thousand_tokens_window_present() {
    let mut m = manager(200, 128, HitRule::v41_flash());
    let ctx = context();
    m.allocate(1, &ctx, AllocateOptions::default()).unwrap();
    m.mark_computed(1, ctx.len()).unwrap();
    let asked = Cell::new(None);
    let present = |h: BlockHash| {
        asked.set(Some(h));
        true
    };
    let a = m
        .allocate(
            2,
            &ctx,
            AllocateOptions {
                window_state_present: Some(&present),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.plan.reused_tokens, 9_856);
    assert_eq!(a.plan.replayed_tokens, 0);
    assert_eq!(a.plan.computed_tokens, 144);
    // The window state is looked up under the hash of the hit's last block.
    assert_eq!(asked.get(), a.hit_end);
    assert_eq!(m.num_computed(2).unwrap(), 9_856);
    // Two sequences share the 77 reused blocks.
    assert_eq!(m.usage().used, 79 + (79 - 77));
}

#[test]
fn ten_thousand_tokens_window_missing() {
    let mut m = manager(200, 128, HitRule::v41_flash());
    let ctx = context();
    m.allocate(1, &ctx, AllocateOptions::default()).unwrap();
    m.mark_computed(1, ctx.len()).unwrap();
    let missing = |_: BlockHash| false;
    let a = m
        .allocate(
            2,
            &ctx,
            AllocateOptions {
                window_state_present: Some(&missing),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.plan.reused_tokens, 9_728);
    assert_eq!(a.plan.replayed_tokens, 128);
    assert_eq!(a.plan.computed_tokens, 272);
    assert_eq!(a.plan.replayed_tokens + a.plan.computed_tokens, 400);
    assert_eq!(m.stats().replayed_tokens, 128);
}

#[test]
fn ten_thousand_tokens_no_cache() {
    let mut cfg = BlockManagerConfig::new(200, 128);
    cfg.hit_rule = HitRule::v41_flash();
    cfg.enable_prefix_caching = false;
    let mut m = BlockManager::new(cfg).unwrap();
    let ctx = context();
    m.allocate(1, &ctx, AllocateOptions::default()).unwrap();
    m.mark_computed(1, ctx.len()).unwrap();
    let a = m.allocate(2, &ctx, AllocateOptions::default()).unwrap();
    assert_eq!(a.plan.computed_tokens, 10_000);
    assert_eq!(a.plan.reused_tokens, 0);
}

#[test]
fn three_hundred_tokens_hold_three_blocks() {
    let mut m = manager(10, 128, HitRule::v41_flash());
    let prompt: Vec<u32> = (0..300).collect();
    m.allocate(1, &prompt, AllocateOptions::default()).unwrap();
    let u = m.sequence_usage(1).unwrap();
    assert_eq!(u.blocks, 3);
    assert_eq!(u.slots, 384);
    assert_eq!((u.fill() * 100.0).round() as u32, 78);
}

#[test]
fn nothing_is_matchable_before_it_is_computed() {
    let mut m = manager(20, 4, HitRule::none());
    let p: Vec<u32> = (0..13).collect();
    m.allocate(1, &p, AllocateOptions::default()).unwrap();
    assert_eq!(
        m.allocate(2, &p, AllocateOptions::default())
            .unwrap()
            .plan
            .reused_tokens,
        0
    );
    m.mark_computed(1, 8).unwrap();
    assert_eq!(
        m.allocate(3, &p, AllocateOptions::default())
            .unwrap()
            .plan
            .reused_tokens,
        8
    );
}

#[test]
fn extra_keys_separate_caches() {
    let mut m = manager(40, 4, HitRule::none());
    let p: Vec<u32> = (0..13).collect();
    let salted = |s: &[u8]| AllocateOptions {
        extra_keys: ExtraKeys {
            cache_salt: Some(s.to_vec()),
            ..ExtraKeys::default()
        },
        ..Default::default()
    };
    m.allocate(1, &p, salted(b"a")).unwrap();
    m.mark_computed(1, 13).unwrap();
    assert_eq!(
        m.allocate(2, &p, salted(b"b")).unwrap().plan.reused_tokens,
        0
    );
    assert_eq!(
        m.allocate(3, &p, salted(b"a")).unwrap().plan.reused_tokens,
        12
    );
    let lora = AllocateOptions {
        extra_keys: ExtraKeys {
            adapter: Some(1),
            ..ExtraKeys::default()
        },
        ..Default::default()
    };
    assert_eq!(m.allocate(4, &p, lora).unwrap().plan.reused_tokens, 0);
}

#[test]
fn drafts_are_never_cached_until_accepted() {
    let mut m = manager(20, 4, HitRule::none());
    m.allocate(1, &[1, 2], AllocateOptions::default()).unwrap();
    let mut slots = Vec::new();
    m.append_draft(1, &[3, 4, 5], &mut slots).unwrap();
    m.mark_computed(1, 5).unwrap();
    // The first block is full of computed tokens, but two of them are drafts.
    assert_eq!(m.usage().cached, 0);
    assert!(m.append_slots(1, &[9]).is_err());
    m.rollback(1, 1).unwrap();
    m.accept_drafts(1).unwrap();
    assert_eq!(m.usage().cached, 1);
    assert_eq!(m.tokens(1).unwrap(), &[1, 2, 3, 4]);
}

#[test]
fn hit_rate_excludes_recompute_after_preemption() {
    let mut m = manager(40, 4, HitRule::none());
    let p: Vec<u32> = (0..17).collect();
    m.allocate(1, &p, AllocateOptions::default()).unwrap();
    m.mark_computed(1, 17).unwrap();
    m.free(1).unwrap();
    // Re-admitted after preemption: hits its own blocks, not counted.
    let a = m
        .allocate(
            1,
            &p,
            AllocateOptions {
                recompute_after_preemption: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.plan.reused_tokens, 16);
    let s = m.stats();
    assert_eq!(s.query_tokens, 17);
    assert_eq!(s.hit_tokens, 0);
    assert_eq!(s.preempted_hit_tokens, 16);
    assert_eq!(s.hit_rate(), 0.0);
    m.allocate(2, &p, AllocateOptions::default()).unwrap();
    assert!((m.stats().hit_rate() - 16.0 / 34.0).abs() < 1e-12);
}

#[test]
fn lazy_eviction_is_counted_and_reported() {
    let mut cfg = BlockManagerConfig::new(4, 2);
    cfg.emit_events = true;
    let mut m = BlockManager::new(cfg).unwrap();
    m.allocate(1, &[1, 2, 3, 4, 5], AllocateOptions::default())
        .unwrap();
    m.mark_computed(1, 5).unwrap();
    m.free(1).unwrap();
    let stored = m.drain_events();
    assert_eq!(stored.len(), 2);
    assert!(matches!(stored[0], KvEvent::Stored { parent: None, .. }));
    assert_eq!(m.usage().free_cached, 2);
    // Four new blocks: two empty ones first, then both cached ones are evicted, tail first.
    m.allocate(2, &[9; 8], AllocateOptions::default()).unwrap();
    assert_eq!(m.stats().evictions, 2);
    let removed = m.drain_events();
    let KvEvent::Stored { hash: second, .. } = stored[1] else {
        panic!("expected Stored")
    };
    assert_eq!(
        removed[0],
        KvEvent::Removed {
            hashes: vec![second]
        }
    );
    m.reset_prefix_cache();
    assert_eq!(m.drain_events(), vec![KvEvent::Cleared]);
}

#[test]
fn longest_chain_stops_at_first_miss() {
    let mut m = manager(40, 4, HitRule::none());
    let a: Vec<u32> = (0..16).collect();
    m.allocate(1, &a, AllocateOptions::default()).unwrap();
    m.mark_computed(1, 16).unwrap();
    let mut b = a.clone();
    b[9] = 99; // third block differs
    let pm = m.match_prefix(&b, &ExtraKeys::none());
    assert_eq!(pm.blocks.len(), 2);
    assert_eq!(pm.hashes.len(), 4);
    assert_eq!(pm.blocks, m.block_table(1).unwrap()[..2]);
}

#[test]
fn sha256_and_unverified_configurations_hit_the_same_way() {
    use deepinfer_kv::HashAlgo;
    for (algo, verify) in [
        (HashAlgo::Sha256, true),
        (HashAlgo::Xxh3_128, false),
        (HashAlgo::Sha256, false),
    ] {
        let mut cfg = BlockManagerConfig::new(40, 4);
        cfg.hash_algo = algo;
        cfg.verify_tokens = verify;
        cfg.hash_seed = 42;
        let mut m = BlockManager::new(cfg).unwrap();
        let p: Vec<u32> = (0..18).collect();
        m.allocate(1, &p, AllocateOptions::default()).unwrap();
        m.mark_computed(1, 18).unwrap();
        let a = m.allocate(2, &p, AllocateOptions::default()).unwrap();
        assert_eq!(a.plan.reused_tokens, 16, "{algo:?} verify={verify}");
        let mut q = p.clone();
        q[5] = 99;
        let b = m.allocate(3, &q, AllocateOptions::default()).unwrap();
        assert_eq!(b.plan.reused_tokens, 4, "{algo:?} verify={verify}");
    }
}
