//! The host window-state store: bounded bytes, least recently used out, keyed by the hash of the
//! block where the window ends.
//!
//! A window state is a fixed-size per-sequence record (the last `window` rows of every
//! sliding-window layer), so its size comes from the [`KvLayout`](crate::KvLayout). The store
//! holds whatever the engine gives it as the value (`V`): host bytes, or a handle into a pinned
//! host buffer. When it is missing, the hit rule backs off one block and replays the window.

use std::collections::BTreeMap;

use crate::error::{KvError, Result};
use crate::hash::BlockHash;
use crate::pool::HashIndex;

/// Byte counts of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreUsage {
    /// Entries held.
    pub entries: usize,
    /// Bytes held.
    pub bytes: u64,
    /// Capacity in bytes.
    pub capacity: u64,
    /// Entries evicted (window store) or reclaimed (persistent store) so far.
    pub evictions: u64,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    bytes: u64,
    tick: u64,
}

/// A bounded, LRU map from block hash to window state.
#[derive(Debug)]
pub struct WindowStateStore<V> {
    map: HashIndex<Entry<V>>,
    order: BTreeMap<u64, BlockHash>,
    capacity: u64,
    bytes: u64,
    tick: u64,
    evictions: u64,
}

impl<V> WindowStateStore<V> {
    /// A store holding at most `capacity_bytes`.
    pub fn new(capacity_bytes: u64) -> Self {
        Self {
            map: HashIndex::default(),
            order: BTreeMap::new(),
            capacity: capacity_bytes,
            bytes: 0,
            tick: 0,
            evictions: 0,
        }
    }

    /// A store sized to hold `entries` window states of `entry_bytes` each (from
    /// [`KvLayout::bytes_per_sequence`](crate::KvLayout::bytes_per_sequence)).
    pub fn with_entries(entries: u64, entry_bytes: u64) -> Self {
        Self::new(entries.saturating_mul(entry_bytes))
    }

    /// Byte counts.
    pub fn usage(&self) -> StoreUsage {
        StoreUsage {
            entries: self.map.len(),
            bytes: self.bytes,
            capacity: self.capacity,
            evictions: self.evictions,
        }
    }

    /// True when a state is stored under `hash` (does not refresh recency).
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.map.contains_key(&hash)
    }

    fn touch(&mut self, hash: BlockHash) {
        self.tick += 1;
        if let Some(e) = self.map.get_mut(&hash) {
            self.order.remove(&e.tick);
            e.tick = self.tick;
            self.order.insert(self.tick, hash);
        }
    }

    /// The state stored under `hash`, marking it most recently used.
    pub fn get(&mut self, hash: BlockHash) -> Option<&V> {
        if !self.map.contains_key(&hash) {
            return None;
        }
        self.touch(hash);
        self.map.get(&hash).map(|e| &e.value)
    }

    /// Stores `value` of `bytes` bytes under `hash`, evicting least recently used entries to make
    /// room. Returns the evicted hashes. Errors if `bytes` exceeds the whole capacity.
    pub fn insert(&mut self, hash: BlockHash, value: V, bytes: u64) -> Result<Vec<BlockHash>> {
        if bytes > self.capacity {
            return Err(KvError::EntryTooLarge {
                size: bytes,
                capacity: self.capacity,
            });
        }
        self.remove(hash);
        let mut evicted = Vec::new();
        while self.bytes + bytes > self.capacity {
            let Some((_, victim)) = self.order.pop_first() else {
                break;
            };
            if let Some(e) = self.map.remove(&victim) {
                self.bytes -= e.bytes;
                self.evictions += 1;
                evicted.push(victim);
            }
        }
        self.tick += 1;
        self.order.insert(self.tick, hash);
        self.map.insert(
            hash,
            Entry {
                value,
                bytes,
                tick: self.tick,
            },
        );
        self.bytes += bytes;
        Ok(evicted)
    }

    /// Removes and returns the least recently used state, with its hash (`None` when empty):
    /// for callers that must free what the states pin elsewhere before inserting.
    pub fn pop_lru(&mut self) -> Option<(BlockHash, V)> {
        let (_, hash) = self.order.pop_first()?;
        let e = self.map.remove(&hash)?;
        self.bytes -= e.bytes;
        self.evictions += 1;
        Some((hash, e.value))
    }

    /// Removes and returns the state under `hash`.
    pub fn remove(&mut self, hash: BlockHash) -> Option<V> {
        let e = self.map.remove(&hash)?;
        self.order.remove(&e.tick);
        self.bytes -= e.bytes;
        Some(e.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KvLayout;

    #[test]
    fn published_entry_sizes() {
        // V4.1-Flash as published: 20 layers x 134 tokens (window 128 + slack 6) x 528 B.
        let published = KvLayout::new(128)
            .unwrap()
            .with_window_state("window", 20, 134, 528);
        assert_eq!(published.bytes_per_sequence(), 1_415_040);
        // What the reference implementations keep: 40 layers x 128 rows x 528 B.
        let reference = KvLayout::new(128)
            .unwrap()
            .with_window_state("window", 40, 128, 528);
        assert_eq!(reference.bytes_per_sequence(), 2_703_360);
        // The global cache: 890 B per token.
        let global = KvLayout::new(128)
            .unwrap()
            .with_block_part_per_token("global", 890);
        assert_eq!(global.bytes_per_block(), 113_920);

        let entry = reference.bytes_per_sequence();
        let mut s = WindowStateStore::with_entries(3, entry);
        for i in 0..3 {
            assert!(s.insert(BlockHash(i), (), entry).unwrap().is_empty());
        }
        assert_eq!(s.usage().bytes, 8_110_080);
        // A fourth evicts the least recently used (1, after 0 is touched).
        assert!(s.get(BlockHash(0)).is_some());
        assert_eq!(
            s.insert(BlockHash(3), (), entry).unwrap(),
            vec![BlockHash(1)]
        );
        assert!(!s.contains(BlockHash(1)));
        assert_eq!(s.usage().evictions, 1);
    }

    #[test]
    fn too_large_entry_is_an_error_and_reinsert_replaces() {
        let mut s = WindowStateStore::new(10);
        assert!(matches!(
            s.insert(BlockHash(1), 1u8, 11),
            Err(KvError::EntryTooLarge { .. })
        ));
        s.insert(BlockHash(1), 1u8, 6).unwrap();
        s.insert(BlockHash(1), 2u8, 6).unwrap();
        assert_eq!(s.usage().bytes, 6);
        assert_eq!(s.get(BlockHash(1)), Some(&2));
        assert_eq!(s.remove(BlockHash(1)), Some(2));
        assert_eq!(s.usage().bytes, 0);
    }

    #[test]
    fn pop_lru_takes_the_least_recently_used() {
        let mut s = WindowStateStore::new(100);
        for i in 0..3u8 {
            s.insert(BlockHash(u128::from(i)), i, 10).unwrap();
        }
        assert!(s.get(BlockHash(0)).is_some());
        assert_eq!(s.pop_lru(), Some((BlockHash(1), 1)));
        assert_eq!(s.pop_lru(), Some((BlockHash(2), 2)));
        assert_eq!(s.usage().bytes, 10);
        assert_eq!(s.usage().evictions, 2);
        assert_eq!(s.pop_lru(), Some((BlockHash(0), 0)));
        assert_eq!(s.pop_lru(), None);
        assert_eq!(s.usage().entries, 0);
    }
}
