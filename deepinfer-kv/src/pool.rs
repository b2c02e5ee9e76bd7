//! The block pool: ref counts, an O(1) intrusive free list and the hash → block index.
//!
//! Free blocks sit in one of two queues of block ids: blocks without a hash (handed out first)
//! and cached blocks that still hold a valid hash, in least-recently-freed order. A cached block
//! is evicted lazily: its hash is dropped only when its slot is handed out again. A cached block
//! that a new prompt hits is revived in O(1) by leaving its queue entry stale (each entry carries
//! the push stamp its block must still hold); stale entries are skipped when they reach the front
//! and swept out when they outnumber the live ones, so each entry is handled O(1) times. Queues
//! instead of linked lists: the next blocks to hand out are known without following links, so
//! their lines can be asked for ahead.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use crate::error::{KvError, Result};
use crate::events::KvEvent;
use crate::hash::BlockHash;
use crate::prefetch::prefetch_line;

/// Index of a block in the pool (what the engine's block tables hold).
pub type BlockId = u32;

pub(crate) const NIL: u32 = u32::MAX;

/// Keys are already uniformly distributed 128-bit hashes; folding them is enough.
#[derive(Default, Clone, Copy)]
pub(crate) struct FoldHasher(u64);

impl Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(29) ^ u64::from_le_bytes(b))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 ^= (v as u64) ^ ((v >> 64) as u64);
    }
}

pub(crate) type HashIndex<V> = HashMap<BlockHash, V, BuildHasherDefault<FoldHasher>>;

#[derive(Debug, Clone, Copy)]
struct Meta {
    ref_count: u32,
    /// Stamp of the block's live queue entry (only meaningful when `ref_count == 0`).
    stamp: u64,
    /// Which free queue the block is on (only meaningful when `ref_count == 0`).
    cached: bool,
    hashed: bool,
}

/// A free queue: `(block, stamp)` entries in push order; an entry is live while its block is
/// free, on this queue and still holds the stamp.
#[derive(Debug, Clone, Default)]
struct Queue {
    entries: VecDeque<(u32, u64)>,
    /// Live entries.
    len: usize,
}

/// Counts of the pool's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolUsage {
    /// Blocks in the pool.
    pub total: usize,
    /// Blocks referenced by at least one sequence.
    pub used: usize,
    /// Free blocks holding no hash.
    pub free_empty: usize,
    /// Free blocks still holding a cached hash (evictable, revivable).
    pub free_cached: usize,
    /// Blocks whose hash is in the prefix index (used or free).
    pub cached: usize,
}

impl PoolUsage {
    /// All free blocks, cached or not.
    pub fn free(&self) -> usize {
        self.free_empty + self.free_cached
    }

    /// Fraction of blocks in use, in `[0, 1]`.
    pub fn usage(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.used as f64 / self.total as f64
        }
    }
}

/// A fixed pool of blocks with ref counts and a prefix-cache index.
#[derive(Debug, Clone)]
pub struct BlockPool {
    meta: Vec<Meta>,
    /// Hash and parent hash of each cached block (apart from `meta` to keep list walks compact).
    keys: Vec<(BlockHash, Option<BlockHash>)>,
    empty: Queue,
    cached_free: Queue,
    /// Next push stamp (64 bits: never wraps, so a stale entry never matches again).
    next_stamp: u64,
    index: HashIndex<BlockId>,
    /// Token ids of cached blocks, `block_size` per block, kept only when verification is on.
    tokens: Vec<u32>,
    block_size: usize,
    verify_tokens: bool,
    evictions: u64,
    events: Option<Vec<KvEvent>>,
    /// Offset from the front of the queue allocations take from of the next entry
    /// [`BlockPool::prefetch_free_ahead`] asks for (a hint only).
    ahead: usize,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks of `block_size` tokens. When `verify_tokens` is set, each
    /// cached block keeps its token ids so a hit can be checked token by token.
    pub fn new(num_blocks: usize, block_size: usize, verify_tokens: bool) -> Result<Self> {
        if block_size == 0 {
            return Err(KvError::ZeroBlockSize);
        }
        if num_blocks == 0 || num_blocks >= NIL as usize {
            return Err(KvError::InvalidBlockCount(num_blocks));
        }
        let meta = vec![
            Meta {
                ref_count: 0,
                stamp: 0,
                cached: false,
                hashed: false,
            };
            num_blocks
        ];
        let tokens = if verify_tokens {
            // Zeroed allocation: pages are only touched when a block is cached.
            vec![0u32; num_blocks * block_size]
        } else {
            Vec::new()
        };
        Ok(Self {
            meta,
            keys: vec![(BlockHash(0), None); num_blocks],
            empty: Queue {
                entries: (0..num_blocks as u32).map(|b| (b, 0)).collect(),
                len: num_blocks,
            },
            cached_free: Queue::default(),
            next_stamp: 1,
            index: HashIndex::default(),
            tokens,
            block_size,
            verify_tokens,
            evictions: 0,
            events: None,
            ahead: 0,
        })
    }

    /// Starts (or stops) recording [`KvEvent`]s for cache-aware routers.
    pub fn set_events_enabled(&mut self, on: bool) {
        self.events = if on { Some(Vec::new()) } else { None };
    }

    /// Takes the events recorded since the last call.
    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn emit(&mut self, e: KvEvent) {
        if let Some(ev) = self.events.as_mut() {
            ev.push(e);
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.meta.len()
    }

    /// Blocks that can be handed out now (free, cached or not).
    pub fn num_free(&self) -> usize {
        self.empty.len + self.cached_free.len
    }

    /// Cached blocks evicted so far (their slot handed out again, or evicted on request).
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Block counts.
    pub fn usage(&self) -> PoolUsage {
        let free = self.num_free();
        PoolUsage {
            total: self.meta.len(),
            used: self.meta.len() - free,
            free_empty: self.empty.len,
            free_cached: self.cached_free.len,
            cached: self.index.len(),
        }
    }

    /// Reference count of `block` (0 when free). Errors on an id outside the pool.
    pub fn ref_count(&self, block: BlockId) -> Result<u32> {
        self.meta
            .get(block as usize)
            .map(|m| m.ref_count)
            .ok_or(KvError::BlockNotAllocated(block))
    }

    /// The hash `block` is cached under, if any.
    pub fn hash_of(&self, block: BlockId) -> Option<BlockHash> {
        self.meta
            .get(block as usize)
            .filter(|m| m.hashed)
            .map(|_| self.keys[block as usize].0)
    }

    /// The block cached under `hash`, if any (used or free).
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        self.index.get(&hash).copied()
    }

    /// True when a block is cached under `hash`.
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.index.contains_key(&hash)
    }

    /// Finds `hash` and, when verification is on, checks the block's parent and token ids.
    pub fn lookup_verified(
        &self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> Option<BlockId> {
        let b = self.lookup(hash)?;
        if self.verify_tokens {
            let start = b as usize * self.block_size;
            if self.keys[b as usize].1 != parent
                || self.tokens[start..start + self.block_size] != *tokens
            {
                return None;
            }
        }
        Some(b)
    }

    // ---- free queue operations ----

    fn queue(&mut self, cached: bool) -> &mut Queue {
        if cached {
            &mut self.cached_free
        } else {
            &mut self.empty
        }
    }

    fn live(&self, (b, stamp): (u32, u64), cached: bool) -> bool {
        let m = &self.meta[b as usize];
        m.ref_count == 0 && m.cached == cached && m.stamp == stamp
    }

    fn push_back(&mut self, b: u32, cached: bool) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        {
            let m = &mut self.meta[b as usize];
            m.stamp = stamp;
            m.cached = cached;
        }
        let q = self.queue(cached);
        q.entries.push_back((b, stamp));
        q.len += 1;
        self.sweep_if_stale(cached);
    }

    /// Sweeps a queue's stale entries once they outnumber its live ones (amortised O(1) per
    /// entry; keeps each queue under twice its live length plus a constant).
    fn sweep_if_stale(&mut self, cached: bool) {
        let q = self.queue(cached);
        if q.entries.len() > 2 * q.len + 64 {
            let mut entries = std::mem::take(&mut q.entries);
            entries.retain(|&e| self.live(e, cached));
            self.queue(cached).entries = entries;
            self.ahead = 0;
        }
    }

    /// Takes a free block off its queue: its entry goes stale (the caller then gives the block
    /// a reference or pushes it with a new stamp).
    fn unlink(&mut self, b: u32) {
        let m = &mut self.meta[b as usize];
        m.stamp = u64::MAX;
        let cached = m.cached;
        self.queue(cached).len -= 1;
        self.sweep_if_stale(cached);
    }

    /// Takes the first live block of a queue off it (`NIL` if none), dropping the stale entries
    /// before it: one pass that pops each entry once.
    #[inline]
    fn pop_front(&mut self, cached: bool) -> u32 {
        let q = if cached {
            &mut self.cached_free
        } else {
            &mut self.empty
        };
        while let Some((b, stamp)) = q.entries.pop_front() {
            self.ahead = self.ahead.saturating_sub(1);
            let m = &self.meta[b as usize];
            if m.ref_count == 0 && m.cached == cached && m.stamp == stamp {
                q.len -= 1;
                return b;
            }
        }
        NIL
    }

    fn drop_hash(&mut self, b: u32) {
        let m = &mut self.meta[b as usize];
        if m.hashed {
            m.hashed = false;
            let h = self.keys[b as usize].0;
            if self.index.get(&h) == Some(&b) {
                self.index.remove(&h);
            }
            self.emit(KvEvent::Removed { hashes: vec![h] });
        }
    }

    // ---- allocation ----

    /// Hands out one block with ref count 1: an empty one if any, else the least recently
    /// freed cached block (whose hash is evicted now).
    pub fn allocate(&mut self) -> Result<BlockId> {
        match self.allocate_one() {
            NIL => Err(KvError::OutOfBlocks {
                needed: 1,
                available: 0,
            }),
            b => Ok(b),
        }
    }

    /// [`BlockPool::allocate`] returning `NIL` when no block is free (no `Result` to pass back:
    /// for the manager's one-block appends).
    #[inline]
    pub(crate) fn allocate_one(&mut self) -> BlockId {
        let b = if self.empty.len != 0 {
            self.pop_front(false)
        } else if self.cached_free.len != 0 {
            let b = self.pop_front(true);
            self.drop_hash(b);
            self.evictions += 1;
            b
        } else {
            return NIL;
        };
        self.meta[b as usize].ref_count = 1;
        // The next allocation takes the new front of a free queue: ask for its lines now, so
        // back-to-back allocations (a step's new blocks) overlap their cache misses.
        let q = if self.empty.len != 0 {
            &self.empty
        } else {
            &self.cached_free
        };
        if let Some(&(next, _)) = q.entries.front() {
            prefetch_line(self.meta.as_ptr().wrapping_add(next as usize));
            prefetch_line(self.keys.as_ptr().wrapping_add(next as usize));
        }
        b
    }

    /// Hint: asks the CPU for the lines of one more block further down the free queue the next
    /// allocations take from. Those blocks sit at random places in the block table once frees
    /// have shuffled the queue; a caller that calls this once per block it will allocate, spread
    /// over other work (the scheduler: once per decode row that starts a block, during its row
    /// walk), has those lines at hand when the allocations come. Changes nothing observable.
    #[inline]
    pub fn prefetch_free_ahead(&mut self) {
        let q = if self.empty.len != 0 {
            &self.empty
        } else {
            &self.cached_free
        };
        // Past the end (or the queue allocations take from changed): start again at the front.
        let at = if self.ahead < q.entries.len() {
            self.ahead
        } else {
            0
        };
        if let Some(&(next, _)) = q.entries.get(at) {
            prefetch_line(self.meta.as_ptr().wrapping_add(next as usize));
            prefetch_line(self.keys.as_ptr().wrapping_add(next as usize));
        }
        self.ahead = at + 1;
    }

    /// Hands out `n` blocks (appended to `out`), all or none.
    pub fn allocate_n(&mut self, n: usize, out: &mut Vec<BlockId>) -> Result<()> {
        let available = self.num_free();
        if n > available {
            return Err(KvError::OutOfBlocks {
                needed: n,
                available,
            });
        }
        out.reserve(n);
        for _ in 0..n {
            out.push(self.allocate()?);
        }
        Ok(())
    }

    /// Adds a reference to `block`. A free cached block is revived (taken off the free list).
    pub fn retain(&mut self, block: BlockId) -> Result<()> {
        let m = self
            .meta
            .get(block as usize)
            .ok_or(KvError::BlockNotAllocated(block))?;
        if m.ref_count == 0 {
            if !m.hashed {
                // Only cached blocks may be revived; an empty free block has no content.
                return Err(KvError::BlockNotAllocated(block));
            }
            self.unlink(block);
        }
        self.meta[block as usize].ref_count += 1;
        Ok(())
    }

    /// Drops a reference. At zero the block returns to the free lists: to the back of the cached
    /// list if it holds a hash (most recently used), else to the empty list.
    pub fn release(&mut self, block: BlockId) -> Result<()> {
        let m = self
            .meta
            .get_mut(block as usize)
            .ok_or(KvError::BlockNotAllocated(block))?;
        if m.ref_count == 0 {
            return Err(KvError::BlockNotAllocated(block));
        }
        m.ref_count -= 1;
        if m.ref_count == 0 {
            let cached = m.hashed;
            self.push_back(block, cached);
        }
        Ok(())
    }

    /// Releases a sequence's blocks tail first, so its last blocks (least likely to be shared)
    /// become the first eviction candidates.
    pub fn release_all(&mut self, blocks: &[BlockId]) -> Result<()> {
        // Ask for every block's metadata first, so the cache misses overlap.
        for &b in blocks {
            prefetch_line(self.meta.as_ptr().wrapping_add(b as usize));
        }
        for &b in blocks.iter().rev() {
            self.release(b)?;
        }
        Ok(())
    }

    /// Caches a full, in-use block under `hash`. Returns false (and caches nothing) if another
    /// block already holds this hash or `block` already holds a hash.
    pub fn register(
        &mut self,
        block: BlockId,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> bool {
        // The index first: a block that loses to a block already cached under its hash (two
        // requests computed the same prefix) then never reads its own record's line.
        if block as usize >= self.meta.len() || self.index.contains_key(&hash) {
            return false;
        }
        let m = &self.meta[block as usize];
        if m.ref_count == 0 || m.hashed {
            return false;
        }
        if self.verify_tokens {
            if tokens.len() != self.block_size {
                return false;
            }
            let start = block as usize * self.block_size;
            self.tokens[start..start + self.block_size].copy_from_slice(tokens);
        }
        let m = &mut self.meta[block as usize];
        m.hashed = true;
        self.keys[block as usize] = (hash, parent);
        self.index.insert(hash, block);
        self.emit(KvEvent::Stored {
            hash,
            parent,
            block,
        });
        true
    }

    /// Hint that `block` is about to be registered: asks the CPU for its metadata, its key slot
    /// and (with verification) its token slots, so callers registering many blocks overlap the
    /// cache misses. Changes nothing.
    #[inline]
    pub fn prefetch_block(&self, block: BlockId) {
        let b = block as usize;
        prefetch_line(self.meta.as_ptr().wrapping_add(b));
        prefetch_line(self.keys.as_ptr().wrapping_add(b));
        if self.verify_tokens {
            prefetch_line(self.tokens.as_ptr().wrapping_add(b * self.block_size));
        }
    }

    /// Removes `block`'s hash from the index (its content is about to change). The block's
    /// ref count is untouched.
    pub fn unregister(&mut self, block: BlockId) {
        if let Some(m) = self.meta.get(block as usize)
            && m.hashed
        {
            if m.ref_count == 0 {
                // A free cached block moves to the empty list.
                self.unlink(block);
                self.drop_hash(block);
                self.push_back(block, false);
            } else {
                self.drop_hash(block);
            }
        }
    }

    /// Evicts up to `n` least recently used free cached blocks now. Returns how many.
    pub fn evict_lru(&mut self, n: usize) -> usize {
        let mut done = 0;
        while done < n && self.cached_free.len != 0 {
            let b = self.pop_front(true);
            self.drop_hash(b);
            self.push_back(b, false);
            self.evictions += 1;
            done += 1;
        }
        done
    }

    /// Drops every hash (used blocks stay allocated but are no longer matchable).
    pub fn clear_cache(&mut self) {
        while self.cached_free.len != 0 {
            let b = self.pop_front(true);
            self.meta[b as usize].hashed = false;
            self.push_back(b, false);
        }
        for m in &mut self.meta {
            m.hashed = false;
        }
        self.index.clear();
        self.emit(KvEvent::Cleared);
    }

    /// Checks the pool's internal bookkeeping (see [`crate::testing::check_invariants`]): every
    /// free block has exactly one live entry, on the cached queue iff it holds a hash; each
    /// queue's live count is its entries'; the index and the blocks' hashes agree both ways.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn check_invariants(&self) -> std::result::Result<(), String> {
        let n = self.meta.len();
        if self.keys.len() != n {
            return Err(format!("{} key slots for {n} blocks", self.keys.len()));
        }
        if self.verify_tokens && self.tokens.len() != n * self.block_size {
            return Err(format!("{} token slots for {n} blocks", self.tokens.len()));
        }
        // Live entries per block, and per queue.
        let mut live = vec![0u32; n];
        for cached in [false, true] {
            let q = if cached {
                &self.cached_free
            } else {
                &self.empty
            };
            let mut count = 0;
            for &(b, stamp) in &q.entries {
                if b as usize >= n {
                    return Err(format!("free queue entry names block {b} of {n}"));
                }
                if self.live((b, stamp), cached) {
                    live[b as usize] += 1;
                    count += 1;
                }
            }
            if count != q.len {
                return Err(format!(
                    "free queue (cached: {cached}) counts {} live entries, holds {count}",
                    q.len
                ));
            }
        }
        let mut hashed = 0;
        for (b, m) in self.meta.iter().enumerate() {
            if m.ref_count == 0 {
                if live[b] != 1 {
                    return Err(format!("free block {b} has {} live queue entries", live[b]));
                }
                if m.cached != m.hashed {
                    return Err(format!(
                        "free block {b}: on the {} queue, hashed: {}",
                        if m.cached { "cached" } else { "empty" },
                        m.hashed
                    ));
                }
            } else if live[b] != 0 {
                return Err(format!("held block {b} is on a free queue"));
            }
            if m.hashed {
                hashed += 1;
                let h = self.keys[b].0;
                if self.index.get(&h) != Some(&(b as BlockId)) {
                    return Err(format!(
                        "block {b} hashed {h:?}, the index says {:?}",
                        self.index.get(&h)
                    ));
                }
            }
        }
        for (&h, &b) in &self.index {
            let m = self
                .meta
                .get(b as usize)
                .ok_or(format!("index names block {b}"))?;
            if !m.hashed || self.keys[b as usize].0 != h {
                return Err(format!(
                    "index maps {h:?} to block {b}, which does not hold it"
                ));
            }
        }
        if hashed != self.index.len() {
            return Err(format!(
                "{hashed} hashed blocks, {} index entries",
                self.index.len()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The old free lists' order, as plain vectors: what the queues must reproduce.
    #[derive(Default)]
    struct ListModel {
        refs: Vec<u32>,
        hash: Vec<Option<u128>>,
        index: HashMap<u128, u32>,
        empty: Vec<u32>,
        cached: Vec<u32>,
    }

    impl ListModel {
        fn new(n: usize) -> Self {
            ListModel {
                refs: vec![0; n],
                hash: vec![None; n],
                empty: (0..n as u32).collect(),
                ..Default::default()
            }
        }
        fn take_off(&mut self, b: u32) {
            self.empty.retain(|&x| x != b);
            self.cached.retain(|&x| x != b);
        }
        fn drop_hash(&mut self, b: u32) {
            if let Some(h) = self.hash[b as usize].take()
                && self.index.get(&h) == Some(&b)
            {
                self.index.remove(&h);
            }
        }
        fn allocate(&mut self) -> Option<u32> {
            let b = if !self.empty.is_empty() {
                self.empty.remove(0)
            } else if !self.cached.is_empty() {
                let b = self.cached.remove(0);
                self.drop_hash(b);
                b
            } else {
                return None;
            };
            self.refs[b as usize] = 1;
            Some(b)
        }
        fn release(&mut self, b: u32) {
            self.refs[b as usize] -= 1;
            if self.refs[b as usize] == 0 {
                if self.hash[b as usize].is_some() {
                    self.cached.push(b);
                } else {
                    self.empty.push(b);
                }
            }
        }
        fn unregister(&mut self, b: u32) {
            if self.hash[b as usize].is_some() {
                if self.refs[b as usize] == 0 {
                    self.take_off(b);
                    self.drop_hash(b);
                    self.empty.push(b);
                } else {
                    self.drop_hash(b);
                }
            }
        }
        fn evict(&mut self, n: usize) -> usize {
            let mut done = 0;
            while done < n && !self.cached.is_empty() {
                let b = self.cached.remove(0);
                self.drop_hash(b);
                self.empty.push(b);
                done += 1;
            }
            done
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

        /// On random operation sequences (allocations, releases, caching, hits that revive free
        /// cached blocks, unregistering, eviction) the queues hand out and evict blocks in
        /// exactly the order the old doubly linked lists did, and keep the same counts.
        #[test]
        fn queues_keep_the_linked_list_order(
            ops in proptest::collection::vec((0u8..7, 0usize..64, 0u128..10), 1..300)
        ) {
            let n = 8;
            let mut p = BlockPool::new(n, 4, false).unwrap();
            let mut m = ListModel::new(n);
            let mut held: Vec<u32> = Vec::new();
            for (op, i, h) in ops {
                match op {
                    0 | 1 => {
                        let got = p.allocate().ok();
                        proptest::prop_assert_eq!(got, m.allocate());
                        held.extend(got);
                    }
                    2 if !held.is_empty() => {
                        let b = held.swap_remove(i % held.len());
                        p.release(b).unwrap();
                        m.release(b);
                    }
                    3 if !held.is_empty() => {
                        let b = held[i % held.len()];
                        let ok = p.register(b, BlockHash(h), None, &[]);
                        let want = m.hash[b as usize].is_none() && !m.index.contains_key(&h);
                        proptest::prop_assert_eq!(ok, want);
                        if ok {
                            m.hash[b as usize] = Some(h);
                            m.index.insert(h, b);
                        }
                    }
                    4 => {
                        let got = p.lookup(BlockHash(h));
                        proptest::prop_assert_eq!(got, m.index.get(&h).copied());
                        if let Some(b) = got {
                            p.retain(b).unwrap();
                            if m.refs[b as usize] == 0 {
                                m.take_off(b);
                            }
                            m.refs[b as usize] += 1;
                            held.push(b);
                        }
                    }
                    5 => {
                        let b = (i % n) as u32;
                        p.unregister(b);
                        m.unregister(b);
                    }
                    6 => {
                        proptest::prop_assert_eq!(p.evict_lru(i % 3), m.evict(i % 3));
                    }
                    _ => {}
                }
                if i % 5 == 0 {
                    p.prefetch_free_ahead();
                }
                let u = p.usage();
                proptest::prop_assert_eq!(u.free_empty, m.empty.len());
                proptest::prop_assert_eq!(u.free_cached, m.cached.len());
                proptest::prop_assert_eq!(u.cached, m.index.len());
                p.check_invariants().map_err(proptest::test_runner::TestCaseError::fail)?;
            }
            // Draining the pool shows the whole remaining order.
            while let Some(want) = m.allocate() {
                proptest::prop_assert_eq!(p.allocate().ok(), Some(want));
            }
            proptest::prop_assert!(p.allocate().is_err());
        }
    }

    /// The free-list walk is a hint: interleaved anywhere, it changes no allocation, eviction
    /// or count (blocks freed in a scrambled order, some cached, so the lists are shuffled).
    #[test]
    fn prefetch_free_ahead_changes_nothing() {
        let run = |hint_every: usize| {
            let mut p = BlockPool::new(40, 4, false).unwrap();
            let mut got = Vec::new();
            let mut held: Vec<BlockId> = Vec::new();
            for round in 0..30u32 {
                for k in 0..7 {
                    if hint_every > 0 && (k as usize).is_multiple_of(hint_every) {
                        p.prefetch_free_ahead();
                    }
                    match p.allocate() {
                        Ok(b) => {
                            got.push(Some(b));
                            held.push(b);
                        }
                        Err(_) => got.push(None),
                    }
                }
                // Cache some, then free in a scrambled order.
                for (i, &b) in held.iter().enumerate() {
                    if (i as u32 + round).is_multiple_of(3) {
                        p.register(b, BlockHash(u128::from(round * 100 + i as u32)), None, &[]);
                    }
                }
                let mut order: Vec<usize> = (0..held.len()).collect();
                order.sort_by_key(|&i| (i * 7 + round as usize) % 11);
                for &i in order.iter().take(5) {
                    p.release(held[i]).unwrap();
                    if hint_every > 0 {
                        p.prefetch_free_ahead();
                    }
                }
                let mut kept = Vec::new();
                for (i, &b) in held.iter().enumerate() {
                    if !order[..order.len().min(5)].contains(&i) {
                        kept.push(b);
                    }
                }
                held = kept;
                got.push(Some(p.num_free() as BlockId));
            }
            (got, p.evictions)
        };
        let plain = run(0);
        assert!(plain.1 > 0, "the scenario should evict");
        assert_eq!(run(1), plain);
        assert_eq!(run(3), plain);
    }

    #[test]
    fn bad_sizes_are_errors() {
        assert_eq!(
            BlockPool::new(4, 0, false).err(),
            Some(KvError::ZeroBlockSize)
        );
        assert_eq!(
            BlockPool::new(0, 4, false).err(),
            Some(KvError::InvalidBlockCount(0))
        );
    }

    #[test]
    fn allocate_release_and_double_free() {
        let mut p = BlockPool::new(3, 4, false).unwrap();
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        let c = p.allocate().unwrap();
        assert!(matches!(p.allocate(), Err(KvError::OutOfBlocks { .. })));
        p.release(b).unwrap();
        assert_eq!(p.release(b), Err(KvError::BlockNotAllocated(b)));
        assert_eq!(p.release(99), Err(KvError::BlockNotAllocated(99)));
        assert_eq!(p.allocate().unwrap(), b);
        p.release_all(&[a, b, c]).unwrap();
        assert_eq!(p.num_free(), 3);
    }

    #[test]
    fn empty_blocks_are_used_before_cached_and_lru_is_evicted_lazily() {
        let mut p = BlockPool::new(3, 2, true).unwrap();
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        assert!(p.register(a, BlockHash(1), None, &[1, 2]));
        assert!(p.register(b, BlockHash(2), Some(BlockHash(1)), &[3, 4]));
        p.release_all(&[a, b]).unwrap(); // b freed first: b is LRU
        assert_eq!(p.usage().free_cached, 2);
        // The empty block goes first, hashes survive.
        let c = p.allocate().unwrap();
        assert!(c != a && c != b);
        assert!(p.contains(BlockHash(1)) && p.contains(BlockHash(2)));
        // Then the LRU cached block (b, freed first) is evicted.
        assert_eq!(p.allocate().unwrap(), b);
        assert!(!p.contains(BlockHash(2)));
        assert!(p.contains(BlockHash(1)));
        assert_eq!(p.evictions(), 1);
        // Revive a.
        assert_eq!(p.lookup_verified(BlockHash(1), None, &[1, 2]), Some(a));
        assert_eq!(p.lookup_verified(BlockHash(1), None, &[1, 3]), None);
        p.retain(a).unwrap();
        assert_eq!(p.num_free(), 0);
    }

    #[test]
    fn duplicate_hash_is_not_registered_twice() {
        let mut p = BlockPool::new(2, 1, false).unwrap();
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        assert!(p.register(a, BlockHash(7), None, &[0]));
        assert!(!p.register(b, BlockHash(7), None, &[0]));
        p.release(b).unwrap();
        assert_eq!(p.usage().free_empty, 1);
    }

    /// Every refusal of `register` caches nothing, whichever check refuses it.
    #[test]
    fn register_refusals_cache_nothing() {
        let mut p = BlockPool::new(3, 1, true).unwrap();
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        assert!(
            !p.register(99, BlockHash(1), None, &[0]),
            "outside the pool"
        );
        assert!(!p.register(2, BlockHash(1), None, &[0]), "a free block");
        assert!(
            !p.register(a, BlockHash(1), None, &[0, 0]),
            "wrong token count"
        );
        assert_eq!(p.usage().cached, 0);
        assert!(p.register(a, BlockHash(1), None, &[0]));
        assert!(!p.register(a, BlockHash(2), None, &[0]), "already cached");
        assert!(
            !p.register(b, BlockHash(1), None, &[0]),
            "hash held by another block"
        );
        assert_eq!(p.usage().cached, 1);
        assert_eq!(p.hash_of(b), None);
        assert_eq!(p.lookup(BlockHash(2)), None);
    }

    #[test]
    fn events_are_recorded() {
        let mut p = BlockPool::new(1, 1, false).unwrap();
        p.set_events_enabled(true);
        let a = p.allocate().unwrap();
        p.register(a, BlockHash(5), None, &[9]);
        p.release(a).unwrap();
        p.allocate().unwrap();
        p.clear_cache();
        let ev = p.drain_events();
        assert_eq!(
            ev,
            vec![
                KvEvent::Stored {
                    hash: BlockHash(5),
                    parent: None,
                    block: a
                },
                KvEvent::Removed {
                    hashes: vec![BlockHash(5)]
                },
                KvEvent::Cleared
            ]
        );
    }
}
