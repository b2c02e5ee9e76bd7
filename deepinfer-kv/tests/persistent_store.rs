//! The persistent store: corrupt data is never served, expiry, reclaim order, crash recovery.

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;

use deepinfer_kv::{BlockHash, ManualClock, PersistentStore, PersistentStoreConfig, TrafficClass};

const DAY: u64 = 24 * 3600;
const HEADER: u64 = 56;

fn open(dir: &std::path::Path, capacity: u64, clock: &ManualClock) -> PersistentStore {
    PersistentStore::open_with_clock(
        PersistentStoreConfig::new(dir, capacity),
        Arc::new(clock.clone()),
    )
    .unwrap()
}

fn file_of(dir: &std::path::Path, h: BlockHash) -> PathBuf {
    dir.join(format!("{}.kvb", h.to_hex()))
}

#[test]
fn round_trip_and_recovery_after_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000);
    let mut s = open(tmp.path(), 1 << 20, &clock);
    s.put(BlockHash(1), TrafficClass::CHAT, b"hello").unwrap();
    s.put(BlockHash(2), TrafficClass::AGENT, &[7u8; 300])
        .unwrap();
    assert_eq!(s.get(BlockHash(1)).unwrap().as_deref(), Some(&b"hello"[..]));
    assert_eq!(s.usage().bytes, 2 * HEADER + 5 + 300);
    drop(s);
    // "Crash" and reopen: the index is rebuilt from the directory.
    let mut s = open(tmp.path(), 1 << 20, &clock);
    assert_eq!(s.usage().entries, 2);
    assert_eq!(s.get(BlockHash(2)).unwrap(), Some(vec![7u8; 300]));
    assert_eq!(s.get(BlockHash(3)).unwrap(), None);
    assert_eq!(s.stats().hits, 1);
    assert_eq!(s.stats().misses, 1);
}

#[test]
fn leftover_temp_file_is_removed_and_never_served() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(0);
    let h = BlockHash(0xabc);
    // A write interrupted before its rename: a full, valid-looking temp file.
    {
        let mut s = open(tmp.path(), 1 << 20, &clock);
        s.put(h, TrafficClass::CHAT, b"payload").unwrap();
    }
    let tmp_name = tmp
        .path()
        .join(format!("{}.kvb.tmp-999-0", BlockHash(0xdef).to_hex()));
    fs::copy(file_of(tmp.path(), h), &tmp_name).unwrap();
    let mut s = open(tmp.path(), 1 << 20, &clock);
    assert_eq!(s.stats().temp_files_removed, 1);
    assert!(!tmp_name.exists());
    assert!(!s.contains(BlockHash(0xdef)));
    assert_eq!(s.get(BlockHash(0xdef)).unwrap(), None);
    assert_eq!(s.get(h).unwrap().as_deref(), Some(&b"payload"[..]));
}

#[test]
fn truncated_block_is_detected_on_read_and_at_recovery() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(0);
    let mut s = open(tmp.path(), 1 << 20, &clock);
    let (a, b) = (BlockHash(10), BlockHash(11));
    s.put(a, TrafficClass::CHAT, &[1u8; 100]).unwrap();
    s.put(b, TrafficClass::CHAT, &[2u8; 100]).unwrap();
    // Truncate a while the store is open: the read must fail verification.
    let fa = fs::OpenOptions::new()
        .write(true)
        .open(file_of(tmp.path(), a))
        .unwrap();
    fa.set_len(HEADER + 50).unwrap();
    assert_eq!(s.get(a).unwrap(), None);
    assert!(!file_of(tmp.path(), a).exists());
    assert_eq!(s.stats().corrupt, 1);
    drop(s);
    // Truncate b while closed: recovery drops it.
    let fb = fs::OpenOptions::new()
        .write(true)
        .open(file_of(tmp.path(), b))
        .unwrap();
    fb.set_len(20).unwrap();
    let mut s = open(tmp.path(), 1 << 20, &clock);
    assert_eq!(s.stats().corrupt, 1);
    assert_eq!(s.get(b).unwrap(), None);
    assert!(!file_of(tmp.path(), b).exists());
}

#[test]
fn flipped_byte_is_a_miss_and_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(0);
    let mut s = open(tmp.path(), 1 << 20, &clock);
    let h = BlockHash(42);
    s.put(h, TrafficClass::CHAT, &[9u8; 64]).unwrap();
    let path = file_of(tmp.path(), h);
    let mut bytes = fs::read(&path).unwrap();
    bytes[HEADER as usize + 30] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    assert!(s.contains(h)); // indexed, not yet read
    assert_eq!(s.get(h).unwrap(), None);
    assert!(!s.contains(h));
    assert!(!path.exists());
    assert_eq!(s.stats().corrupt, 1);
    // A flipped header byte too.
    s.put(h, TrafficClass::CHAT, &[9u8; 64]).unwrap();
    let mut bytes = fs::read(&path).unwrap();
    bytes[33] ^= 0x80; // written-at
    fs::write(&path, &bytes).unwrap();
    assert_eq!(s.get(h).unwrap(), None);
    assert_eq!(s.stats().corrupt, 2);
}

#[test]
fn expiry_per_traffic_class_with_fake_clock() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let mut s = open(tmp.path(), 1 << 20, &clock);
    let (agent, chat) = (BlockHash(1), BlockHash(2));
    s.put(agent, TrafficClass::AGENT, b"a").unwrap();
    s.put(chat, TrafficClass::CHAT, b"c").unwrap();
    clock.advance(3 * DAY - 1);
    assert!(s.contains(agent));
    clock.advance(1);
    assert!(!s.contains(agent));
    assert_eq!(s.get(agent).unwrap(), None);
    assert!(!file_of(tmp.path(), agent).exists());
    assert_eq!(s.get(chat).unwrap().as_deref(), Some(&b"c"[..]));
    clock.advance(4 * DAY);
    assert_eq!(s.purge_expired(), 1);
    assert_eq!(s.usage().entries, 0);
    assert_eq!(s.stats().expired, 2);
    // Expired files are also dropped when reopening.
    s.put(BlockHash(3), TrafficClass::AGENT, b"x").unwrap();
    drop(s);
    clock.advance(3 * DAY);
    let s = open(tmp.path(), 1 << 20, &clock);
    assert_eq!(s.usage().entries, 0);
    assert_eq!(s.stats().expired, 1);
    // Configurable lifetimes.
    let mut cfg = PersistentStoreConfig::new(tmp.path(), 1 << 20);
    cfg.lifetimes.insert(TrafficClass(7), 10);
    assert_eq!(cfg.lifetime(TrafficClass(7)), 10);
    assert_eq!(cfg.lifetime(TrafficClass(8)), 7 * DAY);
}

#[test]
fn reclaim_least_recently_used_over_capacity() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(0);
    let entry = HEADER + 100;
    let mut s = open(tmp.path(), 3 * entry, &clock);
    for i in 1..=3 {
        s.put(BlockHash(i), TrafficClass::CHAT, &[i as u8; 100])
            .unwrap();
        clock.advance(1);
    }
    // Touch 1: now 2 is the least recently used.
    assert!(s.get(BlockHash(1)).unwrap().is_some());
    s.put(BlockHash(4), TrafficClass::CHAT, &[4u8; 100])
        .unwrap();
    assert!(!s.contains(BlockHash(2)));
    assert!(!file_of(tmp.path(), BlockHash(2)).exists());
    s.put(BlockHash(5), TrafficClass::CHAT, &[5u8; 100])
        .unwrap();
    assert!(!s.contains(BlockHash(3)));
    for h in [1, 4, 5] {
        assert!(s.contains(BlockHash(h)), "{h}");
    }
    assert_eq!(s.stats().reclaimed, 2);
    assert!(s.usage().bytes <= 3 * entry);
    // Too large for the whole store: an error, nothing written.
    assert!(
        s.put(BlockHash(9), TrafficClass::CHAT, &[0u8; 1000])
            .is_err()
    );
    // Reopening with a smaller capacity reclaims the oldest writes first.
    drop(s);
    let s = open(tmp.path(), entry, &clock);
    assert_eq!(s.usage().entries, 1);
    assert!(s.contains(BlockHash(5)));
}
