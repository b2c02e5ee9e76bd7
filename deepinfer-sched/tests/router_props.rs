//! Router properties, and prefix-aware routing fed by real block-manager events.

use deepinfer_kv::{BlockManager, BlockManagerConfig};
use deepinfer_sched::{CacheEvent, Router, RouterConfig};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Every prefill lands on a replica of its tier; decode loads always add up;
    /// the decode spread in request count stays small under equal-length requests.
    #[test]
    fn routing_invariants(
        lens in prop::collection::vec(1usize..100_000, 1..200),
        replicas in 1usize..12,
    ) {
        let mut r = Router::new(RouterConfig {
            prefill_replicas: replicas,
            decode_replicas: replicas,
            decode_token_weight: 0.0,
            ..Default::default()
        }).unwrap();
        for (i, &len) in lens.iter().enumerate() {
            let p = r.route_prefill(i as u64, len, &[]).unwrap();
            prop_assert_eq!(p.tier, r.tier_of(len));
            prop_assert!(r.tier_replicas(p.tier).contains(&p.replica));
            r.route_decode(i as u64, len).unwrap();
        }
        let loads = r.decode_loads();
        let total: u64 = loads.iter().map(|l| l.0).sum();
        prop_assert_eq!(total, lens.len() as u64);
        let (mx, mn) = (loads.iter().map(|l| l.0).max().unwrap(), loads.iter().map(|l| l.0).min().unwrap());
        prop_assert!(mx - mn <= 1, "{:?}", loads);
        let tok: u64 = loads.iter().map(|l| l.1).sum();
        prop_assert_eq!(tok, lens.iter().map(|&l| l as u64).sum::<u64>());
        for i in 0..lens.len() {
            r.finish_prefill(i as u64).unwrap();
            r.finish_decode(i as u64).unwrap();
        }
        prop_assert!(r.prefill_loads().iter().all(|&l| l == 0));
        prop_assert!(r.decode_loads().iter().all(|&l| l == (0, 0)));
    }
}

#[test]
fn prefix_routing_from_kv_events() {
    let bs = 16;
    let mut kvc = BlockManagerConfig::new(64, bs);
    kvc.emit_events = true;
    let mut kv = BlockManager::new(kvc).unwrap();
    let prompt: Vec<u32> = (0..100).collect();
    kv.allocate(1, &prompt, Default::default()).unwrap();
    kv.mark_computed(1, 100).unwrap();
    let mut router = Router::new(RouterConfig {
        prefill_replicas: 3,
        tier_bounds: vec![],
        block_size: bs,
        ..Default::default()
    })
    .unwrap();
    for ev in kv.drain_events() {
        router.apply(&CacheEvent::from_kv(2, &ev)).unwrap();
    }
    let chain: Vec<u128> = kv
        .prefix_hashes(&prompt, &Default::default())
        .iter()
        .map(|h| h.0)
        .collect();
    assert_eq!(chain.len(), 6);
    let p = router.route_prefill(9, 100, &chain).unwrap();
    assert_eq!((p.replica, p.cached_tokens), (2, 96));
}
