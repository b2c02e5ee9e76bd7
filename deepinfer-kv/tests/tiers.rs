//! Lookup across tiers: the longest contiguous run and where each block lives.

use std::sync::Arc;

use deepinfer_kv::{
    AllocateOptions, BlockLocator, BlockManager, BlockManagerConfig, ExtraKeys, ManualClock,
    PersistentStore, PersistentStoreConfig, Tier, TierUsage, TrafficClass, WindowStateStore,
    lookup_tiers,
};

#[test]
fn run_spans_device_then_disk_and_stops_at_gap() {
    let mut m = BlockManager::new(BlockManagerConfig::new(64, 4)).unwrap();
    let prompt: Vec<u32> = (0..24).collect();
    m.allocate(1, &prompt[..9], AllocateOptions::default())
        .unwrap();
    m.mark_computed(1, 9).unwrap(); // blocks 0, 1 on device
    let chain = m.prefix_hashes(&prompt, &ExtraKeys::none());
    assert_eq!(chain.len(), 6);

    let tmp = tempfile::tempdir().unwrap();
    let mut disk = PersistentStore::open_with_clock(
        PersistentStoreConfig::new(tmp.path(), 1 << 20),
        Arc::new(ManualClock::new(0)),
    )
    .unwrap();
    for &h in &chain[..4] {
        disk.put(h, TrafficClass::CHAT, b"kv").unwrap();
    }
    disk.put(chain[5], TrafficClass::CHAT, b"kv").unwrap(); // after a gap: unreachable

    let mut windows = WindowStateStore::new(1 << 20);
    windows.insert(chain[2], (), 100).unwrap();

    let tiers: [(Tier, &dyn BlockLocator); 2] = [(Tier::Device, &m), (Tier::Disk, &disk)];
    let run = lookup_tiers(&chain, &tiers, Some(&windows));
    assert_eq!(
        run.locations,
        vec![Tier::Device, Tier::Device, Tier::Disk, Tier::Disk]
    );
    assert_eq!(run.count(Tier::Disk), 2);
    assert_eq!(run.window_state_blocks, Some(3));
    assert_eq!(lookup_tiers(&chain, &tiers[1..], None).len(), 4);
    assert!(lookup_tiers(&chain[4..], &tiers, None).is_empty());

    let usage = TierUsage::collect(&m, Some(&windows), Some(&disk));
    assert_eq!(usage.device.used, 3);
    assert_eq!(usage.device.cached, 2);
    assert_eq!(usage.host_window.unwrap().bytes, 100);
    assert_eq!(usage.disk.unwrap().entries, 5);
}

#[test]
fn blocks_imported_from_disk_are_hit_by_the_next_allocation() {
    let mut m = BlockManager::new(BlockManagerConfig::new(16, 4)).unwrap();
    let prompt: Vec<u32> = (100..117).collect();
    let imported = m.import_blocks(&prompt, &ExtraKeys::none(), 0, 3).unwrap();
    assert_eq!(imported.len(), 3);
    let chain = m.prefix_hashes(&prompt, &ExtraKeys::none());
    assert_eq!(imported[2].1, chain[2]);
    assert_eq!(m.usage().free_cached, 3);
    // Importing again is a no-op.
    assert!(
        m.import_blocks(&prompt, &ExtraKeys::none(), 1, 2)
            .unwrap()
            .is_empty()
    );
    let a = m.allocate(1, &prompt, AllocateOptions::default()).unwrap();
    assert_eq!(a.plan.reused_tokens, 12);
    let table = m.block_table(1).unwrap();
    assert_eq!(
        table[..3],
        imported.iter().map(|(b, _)| *b).collect::<Vec<_>>()[..]
    );
    assert!(m.import_blocks(&prompt, &ExtraKeys::none(), 3, 2).is_err());
}
