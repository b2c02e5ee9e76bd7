//! Bad input returns a typed error, never a panic.

use deepinfer_kv::{
    AllocateOptions, BlockManager, BlockManagerConfig, KvError, KvLayout, PersistentStore,
    PersistentStoreConfig,
};

#[test]
fn zero_block_size() {
    assert_eq!(
        BlockManager::new(BlockManagerConfig::new(8, 0)).err(),
        Some(KvError::ZeroBlockSize)
    );
    assert_eq!(KvLayout::new(0).err(), Some(KvError::ZeroBlockSize));
}

#[test]
fn bad_pool_and_watermark() {
    assert!(matches!(
        BlockManager::new(BlockManagerConfig::new(0, 16)),
        Err(KvError::InvalidBlockCount(0))
    ));
    let mut cfg = BlockManagerConfig::new(8, 16);
    cfg.watermark = 1.5;
    assert!(matches!(
        BlockManager::new(cfg),
        Err(KvError::InvalidConfig(_))
    ));
}

#[test]
fn unknown_and_duplicate_sequence() {
    let mut m = BlockManager::new(BlockManagerConfig::new(8, 4)).unwrap();
    assert_eq!(m.append_slots(5, &[1]), Err(KvError::UnknownSequence(5)));
    assert_eq!(m.free(5), Err(KvError::UnknownSequence(5)));
    assert_eq!(m.rollback(5, 1), Err(KvError::UnknownSequence(5)));
    assert_eq!(m.fork(5, 6), Err(KvError::UnknownSequence(5)));
    assert_eq!(m.mark_computed(5, 0), Err(KvError::UnknownSequence(5)));
    assert!(m.block_table(5).is_err());
    m.allocate(1, &[1, 2], AllocateOptions::default()).unwrap();
    assert_eq!(
        m.allocate(1, &[1], AllocateOptions::default()).err(),
        Some(KvError::SequenceExists(1))
    );
    assert_eq!(m.fork(1, 1), Err(KvError::SequenceExists(1)));
    assert!(matches!(
        m.mark_computed(1, 3),
        Err(KvError::ComputedPastEnd { .. })
    ));
}

#[test]
fn out_of_blocks_changes_nothing() {
    let mut cfg = BlockManagerConfig::new(4, 4);
    cfg.watermark = 0.0;
    let mut m = BlockManager::new(cfg).unwrap();
    assert!(m.can_allocate(16));
    assert!(!m.can_allocate(17));
    assert!(matches!(
        m.allocate(1, &[0; 17], AllocateOptions::default()),
        Err(KvError::OutOfBlocks {
            needed: 5,
            available: 4
        })
    ));
    m.allocate(1, &[0; 15], AllocateOptions::default()).unwrap();
    assert!(matches!(
        m.append_slots(1, &[1, 2]),
        Err(KvError::OutOfBlocks { .. })
    ));
    assert_eq!(m.tokens(1).unwrap().len(), 15);
    assert!(matches!(m.fork(1, 2), Err(KvError::OutOfBlocks { .. })));
    assert!(!m.contains(2));
    assert_eq!(m.usage().used, 4);
}

#[test]
fn watermark_holds_back_new_prompts() {
    let mut cfg = BlockManagerConfig::new(100, 4);
    cfg.watermark = 0.1;
    let m = BlockManager::new(cfg).unwrap();
    assert_eq!(m.watermark_blocks(), 10);
    assert!(m.can_allocate(90 * 4));
    assert!(!m.can_allocate(90 * 4 + 1));
}

#[test]
fn rollback_past_start() {
    let mut m = BlockManager::new(BlockManagerConfig::new(8, 4)).unwrap();
    m.allocate(1, &[1, 2, 3], AllocateOptions::default())
        .unwrap();
    assert_eq!(
        m.rollback(1, 4),
        Err(KvError::RollbackPastStart {
            requested: 4,
            len: 3
        })
    );
    assert_eq!(m.rollback(1, 3), Ok(None));
    assert_eq!(m.block_table(1).unwrap().len(), 0);
    assert_eq!(m.usage().used, 0);
}

#[test]
fn unwritable_store_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    // A directory cannot be created under a regular file, even as root.
    let r = PersistentStore::open(PersistentStoreConfig::new(file.join("store"), 1 << 20));
    assert!(matches!(r, Err(KvError::UnwritableDirectory { .. })));
}
