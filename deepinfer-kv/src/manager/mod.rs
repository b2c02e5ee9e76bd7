//! Block tables for sequences on top of the [`BlockPool`]: allocate with prefix hit, append,
//! draft tokens and rollback, copy-on-write fork, free.
//!
//! Sequence ids are chosen by the caller. The manager hands out block ids and slot mappings;
//! the engine owns the tensors and performs the copies the manager asks for ([`CopyOp`]).
//!
//! A full block becomes matchable (is registered in the prefix cache) only once its tokens are
//! committed (not speculative drafts) *and* computed: the caller reports progress with
//! [`BlockManager::mark_computed`] after each forward pass, so no other request can hit a
//! block whose KV has not been written yet.

mod allocate;
mod append;
mod cache;
#[cfg(feature = "testing")]
mod check;
mod computed;
mod drafts;
mod fork;
mod types;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::error::{KvError, Result};
use crate::events::{CacheStats, KvEvent};
use crate::hash::{BlockHash, BlockHasher, ExtraKeys};
use crate::pool::{BlockId, BlockPool, PoolUsage};

pub use types::{
    AllocateOptions, Allocation, BlockManagerConfig, CopyOp, PrefixMatch, SequenceUsage, Slot,
};

/// Sequence ids are small integers chosen by the caller: a multiplicative hash is enough and
/// much cheaper than SipHash on the per-token path.
#[derive(Default, Clone, Copy)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdIndex = HashMap<u64, u32, BuildHasherDefault<IdHasher>>;

/// A sequence's place in the manager's table, for callers that touch the same
/// sequence every step (the decode path): [`BlockManager::append_token`] with a
/// handle skips the id lookup. A handle names its sequence id too, so one that
/// outlived its sequence is rejected rather than reaching another sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SeqHandle {
    index: u32,
    id: u64,
}

impl SeqHandle {
    /// The sequence id the handle was made for.
    pub fn id(&self) -> u64 {
        self.id
    }
}

/// One sequence. `repr(C)` and the alignment keep everything a block append
/// ([`BlockManager::extend_by_handle`]) reads, and all the per-sequence fields a block
/// registration reads but the hash list, in the first cache line of the entry: id, counts,
/// block list, the two flags and whether the slab entry is live (`registered` is a `u32` to
/// make room for them).
#[derive(Debug, Clone)]
#[repr(C, align(64))]
struct Sequence {
    id: u64,
    committed: usize,
    /// Tokens held, committed then draft.
    len: usize,
    blocks: Vec<BlockId>,
    computed: usize,
    /// Leading blocks already offered to the prefix cache (at most `blocks.len()`, so below
    /// the pool's block count, which fits a `u32`).
    registered: u32,
    /// False when the caller keeps the token ids (then `tokens` is empty).
    keeps_tokens: bool,
    /// `keys.is_empty()`, kept here so hashing a block does not read `keys`' lines.
    plain_keys: bool,
    /// False for a vacant slab entry (see [`Slab`]).
    live: bool,
    /// The token ids, unless the caller keeps them.
    tokens: Vec<u32>,
    /// Chained hashes of the leading full committed blocks known so far.
    hashes: Vec<BlockHash>,
    keys: ExtraKeys,
}

impl Sequence {
    /// A vacant slab entry (allocates nothing).
    fn vacant() -> Self {
        Sequence {
            id: 0,
            committed: 0,
            len: 0,
            blocks: Vec::new(),
            computed: 0,
            registered: 0,
            keeps_tokens: false,
            plain_keys: true,
            live: false,
            tokens: Vec::new(),
            hashes: Vec::new(),
            keys: ExtraKeys::default(),
        }
    }

    fn push_token(&mut self, t: u32) {
        if self.keeps_tokens {
            self.tokens.push(t);
        }
        self.len += 1;
    }

    fn push_tokens(&mut self, t: &[u32]) {
        if self.keeps_tokens {
            self.tokens.extend_from_slice(t);
        }
        self.len += t.len();
    }

    fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.len = self.len.min(n);
    }
}

/// The sequences by dense index (what handles name), vacant entries marked by `live` in their
/// first line. Not `Vec<Option<Sequence>>`: rustc puts that `Option`'s tag in a niche of
/// `keys`, on the entry's second line, so every handle lookup would read two lines.
#[derive(Debug, Clone, Default)]
struct Slab(Vec<Sequence>);

impl Slab {
    #[inline]
    fn get(&self, i: usize) -> Option<&Sequence> {
        self.0.get(i).filter(|s| s.live)
    }

    #[inline]
    fn get_mut(&mut self, i: usize) -> Option<&mut Sequence> {
        self.0.get_mut(i).filter(|s| s.live)
    }

    /// Where entry `i` would be (a prefetch address; not dereferenced here).
    #[inline]
    fn entry_ptr(&self, i: usize) -> *const Sequence {
        self.0.as_ptr().wrapping_add(i)
    }

    /// Stores `s` (made live) at `i`, a vacant entry, or at the end when `i` is `None`;
    /// returns its index.
    fn put(&mut self, i: Option<u32>, mut s: Sequence) -> u32 {
        s.live = true;
        match i {
            Some(i) => {
                self.0[i as usize] = s;
                i
            }
            None => {
                self.0.push(s);
                (self.0.len() - 1) as u32
            }
        }
    }

    /// Takes the live sequence at `i` out, leaving the entry vacant.
    fn take(&mut self, i: usize) -> Option<Sequence> {
        let e = self.0.get_mut(i).filter(|s| s.live)?;
        Some(std::mem::replace(e, Sequence::vacant()))
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut Sequence> {
        self.0.iter_mut().filter(|s| s.live)
    }
}

/// Block tables of many sequences over one pool.
///
/// ```
/// use deepinfer_kv::{BlockManager, BlockManagerConfig};
/// let mut m = BlockManager::new(BlockManagerConfig::new(16, 4)).unwrap();
/// let prompt: Vec<u32> = (0..10).collect();
/// m.allocate(1, &prompt, Default::default()).unwrap();
/// m.mark_computed(1, 10).unwrap();
/// // A second request with the same first 8 tokens reuses two blocks.
/// let a = m.allocate(2, &prompt, Default::default()).unwrap();
/// assert_eq!(a.plan.reused_tokens, 8);
/// ```
#[derive(Debug, Clone)]
pub struct BlockManager {
    pool: BlockPool,
    cfg: BlockManagerConfig,
    hasher: BlockHasher,
    /// Sequences in a slab (dense indices for handles) plus the id index.
    seqs: Slab,
    free_idx: Vec<u32>,
    ids: IdIndex,
    stats: CacheStats,
}

fn div_ceil(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

impl BlockManager {
    /// A manager with an empty pool. Errors on zero block size, a bad block count or a watermark
    /// outside `[0, 1)`.
    pub fn new(cfg: BlockManagerConfig) -> Result<Self> {
        if !(0.0..1.0).contains(&cfg.watermark) {
            return Err(KvError::InvalidConfig(format!(
                "watermark {} not in [0, 1)",
                cfg.watermark
            )));
        }
        let mut pool = BlockPool::new(
            cfg.num_blocks,
            cfg.block_size,
            cfg.verify_tokens && cfg.enable_prefix_caching,
        )?;
        pool.set_events_enabled(cfg.emit_events);
        Ok(Self {
            hasher: BlockHasher::new(cfg.hash_algo, cfg.hash_seed),
            pool,
            cfg,
            seqs: Slab::default(),
            free_idx: Vec::new(),
            ids: IdIndex::default(),
            stats: CacheStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BlockManagerConfig {
        &self.cfg
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.cfg.block_size
    }

    /// The underlying pool (read only).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// See [`BlockPool::prefetch_free_ahead`] (a hint; changes nothing observable).
    #[inline]
    pub fn prefetch_free_ahead(&mut self) {
        self.pool.prefetch_free_ahead();
    }

    /// Pool block counts.
    pub fn usage(&self) -> PoolUsage {
        self.pool.usage()
    }

    /// Prefix-cache counters.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            evictions: self.pool.evictions(),
            ..self.stats
        }
    }

    /// Events since the last call (empty unless `emit_events`).
    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        self.pool.drain_events()
    }

    /// Ids of the sequences that hold blocks.
    pub fn sequence_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.ids.keys().copied()
    }

    /// True when `seq` holds blocks.
    pub fn contains(&self, seq: u64) -> bool {
        self.ids.contains_key(&seq)
    }

    fn seq(&self, seq: u64) -> Result<&Sequence> {
        self.ids
            .get(&seq)
            .and_then(|&i| self.seqs.get(i as usize))
            .ok_or(KvError::UnknownSequence(seq))
    }

    fn seq_index(&self, seq: u64) -> Result<usize> {
        self.ids
            .get(&seq)
            .map(|&i| i as usize)
            .ok_or(KvError::UnknownSequence(seq))
    }

    fn seq_mut(seqs: &mut Slab, index: usize, id: u64) -> Result<&mut Sequence> {
        seqs.get_mut(index)
            .filter(|s| s.id == id)
            .ok_or(KvError::UnknownSequence(id))
    }

    fn insert_seq(&mut self, s: Sequence) {
        let id = s.id;
        let i = self.seqs.put(self.free_idx.pop(), s);
        self.ids.insert(id, i);
    }

    /// A handle on `seq` for [`BlockManager::append_token`] and
    /// [`BlockManager::append_draft_by_handle`]. Valid until `seq` is freed.
    pub fn handle(&self, seq: u64) -> Result<SeqHandle> {
        Ok(SeqHandle {
            index: self.seq_index(seq)? as u32,
            id: seq,
        })
    }

    /// The block table of `seq`.
    pub fn block_table(&self, seq: u64) -> Result<&[BlockId]> {
        Ok(&self.seq(seq)?.blocks)
    }

    /// Tokens held by `seq` (committed then draft).
    pub fn tokens(&self, seq: u64) -> Result<&[u32]> {
        let s = self.seq(seq)?;
        if !s.keeps_tokens {
            return Err(KvError::TokensNotKept(seq));
        }
        Ok(&s.tokens)
    }

    /// Number of committed tokens of `seq` (the rest are drafts).
    pub fn num_committed(&self, seq: u64) -> Result<usize> {
        Ok(self.seq(seq)?.committed)
    }

    /// Number of tokens of `seq` whose KV has been computed.
    pub fn num_computed(&self, seq: u64) -> Result<usize> {
        Ok(self.seq(seq)?.computed)
    }

    /// Slot usage of `seq`.
    pub fn sequence_usage(&self, seq: u64) -> Result<SequenceUsage> {
        let s = self.seq(seq)?;
        Ok(SequenceUsage {
            tokens: s.len,
            blocks: s.blocks.len(),
            slots: s.blocks.len() * self.cfg.block_size,
        })
    }

    /// Blocks kept free by the watermark.
    pub fn watermark_blocks(&self) -> usize {
        (self.cfg.watermark * self.cfg.num_blocks as f64) as usize
    }

    /// Whether a new prompt of `num_tokens` tokens fits while leaving the watermark free
    /// (conservative: ignores prefix hits).
    pub fn can_allocate(&self, num_tokens: usize) -> bool {
        let need = div_ceil(num_tokens, self.cfg.block_size);
        self.pool.num_free() >= need + self.watermark_blocks()
    }

    /// Blocks that appending `n` tokens to `seq` would allocate.
    pub fn blocks_needed_to_append(&self, seq: u64, n: usize) -> Result<usize> {
        let s = self.seq(seq)?;
        Ok(div_ceil(s.len + n, self.cfg.block_size).saturating_sub(s.blocks.len()))
    }

    /// Whether `n` more tokens fit for `seq` (no watermark: running sequences may use it).
    pub fn can_append(&self, seq: u64, n: usize) -> Result<bool> {
        Ok(self.blocks_needed_to_append(seq, n)? <= self.pool.num_free())
    }

    /// Releases every block of `seq`, last block first, and forgets the sequence.
    pub fn free(&mut self, seq: u64) -> Result<()> {
        let i = self.ids.remove(&seq).ok_or(KvError::UnknownSequence(seq))?;
        let s = self
            .seqs
            .take(i as usize)
            .ok_or(KvError::UnknownSequence(seq))?;
        self.free_idx.push(i);
        self.pool.release_all(&s.blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// What a block append and a block registration read of a sequence (all but the hash list)
    /// sits in the entry's first cache line.
    #[test]
    fn hot_sequence_fields_share_the_first_line() {
        let end = |off: usize, size: usize| off + size;
        assert!(end(offset_of!(Sequence, id), size_of::<u64>()) <= 64);
        assert!(end(offset_of!(Sequence, committed), size_of::<usize>()) <= 64);
        assert!(end(offset_of!(Sequence, len), size_of::<usize>()) <= 64);
        assert!(end(offset_of!(Sequence, blocks), size_of::<Vec<BlockId>>()) <= 64);
        assert!(end(offset_of!(Sequence, computed), size_of::<usize>()) <= 64);
        assert!(end(offset_of!(Sequence, registered), size_of::<u32>()) <= 64);
        assert!(offset_of!(Sequence, keeps_tokens) < 64);
        assert!(offset_of!(Sequence, plain_keys) < 64);
        assert!(offset_of!(Sequence, live) < 64);
        assert_eq!(std::mem::align_of::<Sequence>(), 64);
    }

    /// Vacant slab entries are invisible: a freed sequence's entry is reused, a handle on it
    /// (also on an index past the end) is rejected, and a vacant entry is no sequence to any
    /// walk over the slab.
    #[test]
    fn vacant_slab_entries_are_not_sequences() {
        let mut m = BlockManager::new(BlockManagerConfig::new(32, 4)).unwrap();
        let prompt: Vec<u32> = (0..6).collect();
        m.allocate(1, &prompt, Default::default()).unwrap();
        m.allocate(2, &prompt, Default::default()).unwrap();
        let h1 = m.handle(1).unwrap();
        m.free(1).unwrap();
        assert_eq!(m.seqs.0.len(), 2);
        assert!(!m.seqs.0[h1.index as usize].live);
        assert!(m.seqs.get(h1.index as usize).is_none());
        assert_eq!(
            m.extend_by_handle(h1, &[1]),
            Err(KvError::UnknownSequence(1))
        );
        assert_eq!(m.seqs.iter_mut().count(), 1);
        m.reset_prefix_cache();
        // The next sequence takes the vacant entry; the old handle still names sequence 1.
        m.allocate(3, &prompt, Default::default()).unwrap();
        assert_eq!(m.handle(3).unwrap().index, h1.index);
        assert_eq!(m.seqs.0.len(), 2);
        assert_eq!(
            m.extend_by_handle(h1, &[1]),
            Err(KvError::UnknownSequence(1))
        );
        let past = SeqHandle { index: 9, id: 3 };
        assert_eq!(
            m.extend_by_handle(past, &[1]),
            Err(KvError::UnknownSequence(3))
        );
        m.extend_by_handle(m.handle(3).unwrap(), &[1, 2]).unwrap();
        assert_eq!(m.tokens(3).unwrap(), &[0, 1, 2, 3, 4, 5, 1, 2]);
        assert_eq!(m.seqs.iter_mut().count(), 2);
    }
}
