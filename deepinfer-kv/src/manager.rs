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

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::error::{KvError, Result};
use crate::events::{CacheStats, KvEvent};
use crate::hash::{BlockHash, BlockHasher, ExtraKeys, HashAlgo};
use crate::hit_rule::{HitPlan, HitRule};
use crate::pool::{BlockId, BlockPool, NIL, PoolUsage};
use crate::prefetch::prefetch_line;

/// Where one token's KV is written: block id and offset inside the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// Block id.
    pub block: BlockId,
    /// Offset in the block, `0..block_size`.
    pub offset: u32,
}

impl Slot {
    /// The flat slot index `block * block_size + offset` most attention kernels take.
    pub fn index(&self, block_size: usize) -> u64 {
        self.block as u64 * block_size as u64 + self.offset as u64
    }
}

/// A block copy the engine must perform before the next write: copy the contents (all layer
/// kinds) of block `src` into block `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOp {
    /// Source block.
    pub src: BlockId,
    /// Destination block (freshly allocated, owned by the sequence that asked).
    pub dst: BlockId,
}

/// Settings of a [`BlockManager`].
#[derive(Debug, Clone, PartialEq)]
pub struct BlockManagerConfig {
    /// Blocks in the pool (see [`crate::KvLayout::blocks_for_budget`]).
    pub num_blocks: usize,
    /// Tokens per block (default 128).
    pub block_size: usize,
    /// Match and register full blocks by hash chain.
    pub enable_prefix_caching: bool,
    /// Hash function of the chain.
    pub hash_algo: HashAlgo,
    /// Seed of the chain (keep it fixed to reuse persisted blocks across restarts).
    pub hash_seed: u64,
    /// Keep token ids of cached blocks and compare them on every hit (guards against collisions;
    /// costs 4 bytes per slot of host memory).
    pub verify_tokens: bool,
    /// Fraction of the pool that [`BlockManager::can_allocate`] keeps free for running sequences.
    pub watermark: f64,
    /// The prefix-hit rule.
    pub hit_rule: HitRule,
    /// Record [`KvEvent`]s.
    pub emit_events: bool,
}

impl BlockManagerConfig {
    /// Defaults: prefix caching on, XXH3-128 seed 0, token verification on, 1% watermark,
    /// no window rule, no events.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self {
            num_blocks,
            block_size,
            enable_prefix_caching: true,
            hash_algo: HashAlgo::Xxh3_128,
            hash_seed: 0,
            verify_tokens: true,
            watermark: 0.01,
            hit_rule: HitRule::none(),
            emit_events: false,
        }
    }
}

/// Per-request options of [`BlockManager::allocate`].
#[derive(Default)]
pub struct AllocateOptions<'a> {
    /// Adapter id, cache salt, multimodal items.
    pub extra_keys: ExtraKeys,
    /// Whether the window state at the end of a hit (keyed by the hash of the hit's last block)
    /// is available, for instance in the host window-state store. `None` means always available.
    pub window_state_present: Option<&'a dyn Fn(BlockHash) -> bool>,
    /// The prompt is being re-allocated after preemption: its hits are not counted in the hit rate.
    pub recompute_after_preemption: bool,
    /// The caller keeps the sequence's token ids (a scheduler's request history), so the manager
    /// stores none: it counts tokens, and hashes full blocks from the ids the caller passes to
    /// [`BlockManager::mark_computed_with`] or [`BlockManager::mark_computed_batch_with`] (until
    /// then, computed blocks wait to be registered). [`BlockManager::tokens`] of such a sequence
    /// is an error; the ids given to appends and `commit_drafts` are not kept.
    pub caller_keeps_tokens: bool,
}

/// What [`BlockManager::allocate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// Reused, replayed and newly computed tokens.
    pub plan: HitPlan,
    /// Blocks now held by the sequence.
    pub num_blocks: usize,
    /// Hash of the last reused block (the key of the window state to load), if any.
    pub hit_end: Option<BlockHash>,
}

/// Result of a read-only prefix lookup.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// Hashes of every full block of the query (for looking up other tiers).
    pub hashes: Vec<BlockHash>,
    /// Device blocks of the longest cached chain, one per matched block.
    pub blocks: Vec<BlockId>,
}

impl PrefixMatch {
    /// Matched tokens for the given block size.
    pub fn num_tokens(&self, block_size: usize) -> usize {
        self.blocks.len() * block_size
    }
}

/// Slot usage of one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceUsage {
    /// Tokens held (committed and draft).
    pub tokens: usize,
    /// Blocks held.
    pub blocks: usize,
    /// Slots in those blocks (`blocks * block_size`).
    pub slots: usize,
}

impl SequenceUsage {
    /// Fraction of slots holding a token.
    pub fn fill(&self) -> f64 {
        if self.slots == 0 {
            0.0
        } else {
            self.tokens as f64 / self.slots as f64
        }
    }
}

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

    /// Hashes of every full block of `tokens` under `keys` (empty when prefix caching is off).
    pub fn prefix_hashes(&mut self, tokens: &[u32], keys: &ExtraKeys) -> Vec<BlockHash> {
        let mut out = Vec::new();
        if self.cfg.enable_prefix_caching {
            self.hasher
                .hash_chain(tokens, self.cfg.block_size, keys, &mut out);
        }
        out
    }

    fn longest_match(&self, tokens: &[u32], hashes: &[BlockHash], out: &mut Vec<BlockId>) {
        let bs = self.cfg.block_size;
        let mut parent = None;
        for (i, &h) in hashes.iter().enumerate() {
            match self
                .pool
                .lookup_verified(h, parent, &tokens[i * bs..(i + 1) * bs])
            {
                Some(b) => out.push(b),
                None => break,
            }
            parent = Some(h);
        }
    }

    /// The longest chain of cached device blocks for `tokens` (read only: no ref count changes).
    pub fn match_prefix(&mut self, tokens: &[u32], keys: &ExtraKeys) -> PrefixMatch {
        let hashes = self.prefix_hashes(tokens, keys);
        let mut blocks = Vec::new();
        self.longest_match(tokens, &hashes, &mut blocks);
        PrefixMatch { hashes, blocks }
    }

    /// Allocates blocks for a new sequence's prompt, reusing the longest cached prefix allowed by
    /// the hit rule. The reused tokens count as computed; the caller computes the rest
    /// (`plan.computed_tokens`, plus `plan.replayed_tokens` for window state) and then calls
    /// [`BlockManager::mark_computed`]. All or nothing: on error nothing changes.
    pub fn allocate(
        &mut self,
        seq: u64,
        prompt: &[u32],
        opts: AllocateOptions<'_>,
    ) -> Result<Allocation> {
        if self.ids.contains_key(&seq) {
            return Err(KvError::SequenceExists(seq));
        }
        let bs = self.cfg.block_size;
        let mut hashes = Vec::new();
        // Room for one more block and its tokens so the first decode steps do not reallocate.
        let mut hit_blocks = Vec::with_capacity(div_ceil(prompt.len(), bs) + 1);
        if self.cfg.enable_prefix_caching {
            self.hasher
                .hash_chain(prompt, bs, &opts.extra_keys, &mut hashes);
            self.longest_match(prompt, &hashes, &mut hit_blocks);
        }
        let plan = self
            .cfg
            .hit_rule
            .plan(prompt.len(), hit_blocks.len() * bs, bs, |n| {
                opts.window_state_present
                    .is_none_or(|present| present(hashes[n - 1]))
            });
        let reuse = plan.reused_blocks(bs);
        hit_blocks.truncate(reuse);
        let total = div_ceil(prompt.len(), bs);
        let new_blocks = total - reuse;
        // Reviving a free cached block takes it off the free list too.
        let revived = hit_blocks
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == Ok(0))
            .count();
        let available = self.pool.num_free();
        if new_blocks + revived > available {
            return Err(KvError::OutOfBlocks {
                needed: new_blocks + revived,
                available,
            });
        }
        for &b in &hit_blocks {
            self.pool.retain(b)?;
        }
        let mut blocks = hit_blocks;
        self.pool.allocate_n(new_blocks, &mut blocks)?;
        let hit_end = reuse.checked_sub(1).map(|i| hashes[i]);
        if opts.recompute_after_preemption {
            self.stats.preempted_query_tokens += prompt.len() as u64;
            self.stats.preempted_hit_tokens += plan.reused_tokens as u64;
        } else {
            self.stats.requests += 1;
            self.stats.query_tokens += prompt.len() as u64;
            self.stats.hit_tokens += plan.reused_tokens as u64;
        }
        self.stats.replayed_tokens += plan.replayed_tokens as u64;
        let num_blocks = blocks.len();
        let keeps_tokens = !opts.caller_keeps_tokens;
        self.insert_seq(Sequence {
            id: seq,
            blocks,
            tokens: if keeps_tokens {
                let mut t = Vec::with_capacity(prompt.len() + bs);
                t.extend_from_slice(prompt);
                t
            } else {
                Vec::new()
            },
            keeps_tokens,
            len: prompt.len(),
            committed: prompt.len(),
            computed: plan.reused_tokens,
            hashes,
            // `reuse` counts blocks of this sequence: below the pool's size, a `u32`.
            registered: reuse as u32,
            plain_keys: opts.extra_keys.is_empty(),
            // Set by the slab.
            live: false,
            keys: opts.extra_keys,
        });
        Ok(Allocation {
            plan,
            num_blocks,
            hit_end,
        })
    }

    fn append_inner(
        &mut self,
        index: usize,
        seq: u64,
        tokens: &[u32],
        draft: bool,
        out: &mut Vec<Slot>,
    ) -> Result<()> {
        let bs = self.cfg.block_size;
        let s = Self::seq_mut(&mut self.seqs, index, seq)?;
        if !draft && s.committed != s.len {
            return Err(KvError::DraftsPending(seq));
        }
        if let [t] = tokens {
            // The decode step, without divisions: block tables always hold exactly
            // ceil(len / block_size) blocks.
            let len = s.len;
            if len == s.blocks.len() * bs {
                s.blocks.push(self.pool.allocate()?);
            }
            let idx = s.blocks.len() - 1;
            out.push(Slot {
                block: s.blocks[idx],
                offset: (len - idx * bs) as u32,
            });
            s.push_token(*t);
            if !draft {
                s.committed = s.len;
            }
            return Ok(());
        }
        let len = s.len;
        let need = div_ceil(len + tokens.len(), bs).saturating_sub(s.blocks.len());
        if need > 0 {
            // All or nothing: allocate_n checks availability before taking any block.
            self.pool.allocate_n(need, &mut s.blocks)?;
        }
        out.reserve(tokens.len());
        for p in len..len + tokens.len() {
            out.push(Slot {
                block: s.blocks[p / bs],
                offset: (p % bs) as u32,
            });
        }
        s.push_tokens(tokens);
        if !draft {
            s.committed = s.len;
        }
        Ok(())
    }

    /// Appends committed tokens to `seq`, allocating blocks as needed, and pushes the slot of
    /// each new token to `out`. All or nothing.
    pub fn append(&mut self, seq: u64, tokens: &[u32], out: &mut Vec<Slot>) -> Result<()> {
        let i = self.seq_index(seq)?;
        self.append_inner(i, seq, tokens, false, out)
    }

    /// Appends one committed token to the sequence of `h` (the decode step) and returns its
    /// slot. Same rules as [`BlockManager::append`], without the id lookup.
    #[inline]
    pub fn append_token(&mut self, h: SeqHandle, token: u32) -> Result<Slot> {
        let bs = self.cfg.block_size;
        // Fast path: a live sequence without drafts whose last block has room.
        if let Some(s) = self.seqs.get_mut(h.index as usize)
            && s.id == h.id
            && s.committed == s.len
            && s.len < s.blocks.len() * bs
        {
            let len = s.len;
            let idx = s.blocks.len() - 1;
            s.push_token(token);
            s.committed = len + 1;
            return Ok(Slot {
                block: s.blocks[idx],
                offset: (len - idx * bs) as u32,
            });
        }
        self.append_token_slow(h, token)
    }

    /// [`BlockManager::append_token`] without computing the slot, for callers that read slots
    /// from the block table when they need them: the common case touches only the sequence's
    /// own entry and the end of its token list.
    #[inline]
    pub fn push_token(&mut self, h: SeqHandle, token: u32) -> Result<()> {
        let bs = self.cfg.block_size;
        if let Some(s) = self.seqs.get_mut(h.index as usize)
            && s.id == h.id
            && s.committed == s.len
            && s.len < s.blocks.len() * bs
        {
            s.push_token(token);
            s.committed = s.len;
            return Ok(());
        }
        self.append_token_slow(h, token).map(|_| ())
    }

    /// Appends committed tokens to the sequence of `h` without reporting their slots, allocating
    /// blocks as needed (all or nothing). For callers that keep each sequence's token ids
    /// themselves and track block room on their own: they may hand a block's tokens over in one
    /// call (for instance when it fills, before [`BlockManager::mark_computed_by_handle`]) instead
    /// of one call per token, as long as every token is handed over before anything reads the
    /// sequence's length or tokens. For a sequence whose caller keeps the token ids
    /// ([`AllocateOptions::caller_keeps_tokens`]) only their count is taken.
    pub fn extend_by_handle(&mut self, h: SeqHandle, tokens: &[u32]) -> Result<()> {
        let bs = self.cfg.block_size;
        let s = Self::seq_mut(&mut self.seqs, h.index as usize, h.id)?;
        if s.committed != s.len {
            return Err(KvError::DraftsPending(h.id));
        }
        let end = s.len + tokens.len();
        // Most calls stay inside the blocks held: a multiply decides it, no division.
        if end > s.blocks.len() * bs {
            let need = div_ceil(end, bs) - s.blocks.len();
            if need == 1 {
                // The usual case (a block's worth of tokens at most): one block, no reserve.
                let b = self.pool.allocate_one();
                if b == NIL {
                    return Err(KvError::OutOfBlocks {
                        needed: 1,
                        available: 0,
                    });
                }
                s.blocks.push(b);
            } else {
                // All or nothing: allocate_n checks availability before taking any block.
                self.pool.allocate_n(need, &mut s.blocks)?;
            }
        }
        s.push_tokens(tokens);
        s.committed = s.len;
        Ok(())
    }

    /// Hint that the sequence of `h` is about to be appended to: asks the CPU for its table
    /// entry and, when `tail` is set, for the end of its token list too (which reads the entry,
    /// so call it with `tail` a few rows after the entry-only hint). Changes nothing; callers
    /// that walk many sequences per step use it to overlap the cache misses of several.
    #[inline]
    pub fn prefetch(&self, h: SeqHandle, tail: bool) {
        if !tail {
            // No bounds check: a prefetch of any address is harmless.
            prefetch_line(self.seqs.entry_ptr(h.index as usize));
            return;
        }
        if let Some(s) = self.seqs.get(h.index as usize)
            && s.keeps_tokens
        {
            prefetch_line(s.tokens.as_ptr().wrapping_add(s.tokens.len()));
        }
    }

    #[cold]
    #[inline(never)]
    fn append_token_slow(&mut self, h: SeqHandle, token: u32) -> Result<Slot> {
        let bs = self.cfg.block_size;
        let s = Self::seq_mut(&mut self.seqs, h.index as usize, h.id)?;
        if s.committed != s.len {
            return Err(KvError::DraftsPending(h.id));
        }
        // Block tables always hold exactly ceil(len / block_size) blocks.
        let len = s.len;
        if len == s.blocks.len() * bs {
            s.blocks.push(self.pool.allocate()?);
        }
        let idx = s.blocks.len() - 1;
        s.push_token(token);
        s.committed = len + 1;
        Ok(Slot {
            block: s.blocks[idx],
            offset: (len - idx * bs) as u32,
        })
    }

    /// [`BlockManager::append_draft`] through a handle.
    pub fn append_draft_by_handle(
        &mut self,
        h: SeqHandle,
        tokens: &[u32],
        out: &mut Vec<Slot>,
    ) -> Result<()> {
        self.append_inner(h.index as usize, h.id, tokens, true, out)
    }

    /// [`BlockManager::append`] returning a fresh vector.
    pub fn append_slots(&mut self, seq: u64, tokens: &[u32]) -> Result<Vec<Slot>> {
        let mut out = Vec::with_capacity(tokens.len());
        self.append(seq, tokens, &mut out)?;
        Ok(out)
    }

    /// Appends speculative draft tokens. They get slots but are never cached until accepted
    /// with [`BlockManager::accept_drafts`]; rejected ones are removed with
    /// [`BlockManager::rollback`].
    pub fn append_draft(&mut self, seq: u64, tokens: &[u32], out: &mut Vec<Slot>) -> Result<()> {
        let i = self.seq_index(seq)?;
        self.append_inner(i, seq, tokens, true, out)
    }

    /// Marks every remaining draft token of `seq` as committed (call after rolling back the
    /// rejected ones).
    pub fn accept_drafts(&mut self, seq: u64) -> Result<()> {
        let i = self.seq_index(seq)?;
        let s = Self::seq_mut(&mut self.seqs, i, seq)?;
        s.committed = s.len;
        register_blocks(&mut self.pool, &mut self.hasher, &self.cfg, s, None);
        Ok(())
    }

    /// Reserves host memory for `additional` more tokens of `seq` (its token list, block table
    /// and hash list), so a long decode does not reallocate them as it grows. Allocates no
    /// blocks.
    pub fn reserve(&mut self, seq: u64, additional: usize) -> Result<()> {
        let i = self.seq_index(seq)?;
        let bs = self.cfg.block_size;
        let s = Self::seq_mut(&mut self.seqs, i, seq)?;
        if s.keeps_tokens {
            s.tokens.reserve(additional);
        }
        s.blocks.reserve(additional.div_ceil(bs) + 1);
        s.hashes.reserve(additional.div_ceil(bs) + 1);
        Ok(())
    }

    /// Commits the first `accepted.len()` pending draft tokens of `seq` under the ids in
    /// `accepted`, keeping their slots (the engine already wrote their KV there), and rolls back
    /// the remaining drafts exactly like [`BlockManager::rollback`] (whose [`CopyOp`] it returns).
    /// Use it when drafts were appended as placeholders whose real ids are known only after
    /// verification: full blocks that are committed and computed are then registered under the
    /// hashes of the real ids, so they produce prefix hits. All or nothing; errors when
    /// `accepted` is longer than the pending drafts.
    pub fn commit_drafts(&mut self, seq: u64, accepted: &[u32]) -> Result<Option<CopyOp>> {
        let i = self.seq_index(seq)?;
        let s = Self::seq_mut(&mut self.seqs, i, seq)?;
        let drafts = s.len - s.committed;
        if accepted.len() > drafts {
            return Err(KvError::TooManyAccepted {
                accepted: accepted.len(),
                drafts,
            });
        }
        // Roll back first: it is the only step that can fail (a copy-on-write block).
        let copy = self.rollback(seq, drafts - accepted.len())?;
        let s = Self::seq_mut(&mut self.seqs, i, seq)?;
        let c = s.committed;
        if s.keeps_tokens {
            s.tokens[c..c + accepted.len()].copy_from_slice(accepted);
        }
        s.committed = s.len;
        register_blocks(&mut self.pool, &mut self.hasher, &self.cfg, s, None);
        Ok(copy)
    }

    /// Records that the KV of the first `num_tokens` tokens of `seq` has been written. Full
    /// committed blocks up to there become matchable by other requests.
    pub fn mark_computed(&mut self, seq: u64, num_tokens: usize) -> Result<()> {
        let i = self.seq_index(seq)?;
        let s = Self::seq_mut(&mut self.seqs, i, seq)?;
        if num_tokens > s.len {
            return Err(KvError::ComputedPastEnd {
                requested: num_tokens,
                len: s.len,
            });
        }
        s.computed = s.computed.max(num_tokens);
        register_blocks(&mut self.pool, &mut self.hasher, &self.cfg, s, None);
        Ok(())
    }

    /// [`BlockManager::mark_computed`] through a handle (no id lookup).
    pub fn mark_computed_by_handle(&mut self, h: SeqHandle, num_tokens: usize) -> Result<()> {
        self.mark_computed_inner(h, num_tokens, None)
    }

    /// [`BlockManager::mark_computed_by_handle`] for a sequence whose caller keeps its token ids
    /// (see [`AllocateOptions::caller_keeps_tokens`]): `tokens` are its committed tokens (at least
    /// the full blocks to register; a shorter slice registers fewer), and full committed and
    /// computed blocks are hashed from them. For a sequence the manager keeps the tokens of,
    /// `tokens` is not used.
    pub fn mark_computed_with(
        &mut self,
        h: SeqHandle,
        num_tokens: usize,
        tokens: &[u32],
    ) -> Result<()> {
        self.mark_computed_inner(h, num_tokens, Some(tokens))
    }

    fn mark_computed_inner(
        &mut self,
        h: SeqHandle,
        num_tokens: usize,
        tokens: Option<&[u32]>,
    ) -> Result<()> {
        let s = Self::seq_mut(&mut self.seqs, h.index as usize, h.id)?;
        if num_tokens > s.len {
            return Err(KvError::ComputedPastEnd {
                requested: num_tokens,
                len: s.len,
            });
        }
        s.computed = s.computed.max(num_tokens);
        register_blocks(&mut self.pool, &mut self.hasher, &self.cfg, s, tokens);
        Ok(())
    }

    /// [`BlockManager::mark_computed_by_handle`] for many sequences at once (a decode step's
    /// sequences whose block just filled). It first asks the CPU for every sequence's entry, the
    /// ends of its hash and block lists and the pool's lines of the block it registers, so their
    /// cache misses overlap instead of stalling one after the other, then registers in order. Checks every item before changing anything: a
    /// stale handle or a count past the end is an error and nothing is marked.
    pub fn mark_computed_batch(&mut self, items: &[(SeqHandle, usize)]) -> Result<()> {
        self.mark_computed_batch_inner(items, |_| None)
    }

    /// [`BlockManager::mark_computed_batch`] for sequences whose callers keep the token ids:
    /// `tokens(i)` gives the committed tokens of `items[i]`'s sequence (see
    /// [`BlockManager::mark_computed_with`]).
    pub fn mark_computed_batch_with<'t>(
        &mut self,
        items: &[(SeqHandle, usize)],
        tokens: impl Fn(usize) -> &'t [u32],
    ) -> Result<()> {
        self.mark_computed_batch_inner(items, |i| Some(tokens(i)))
    }

    fn mark_computed_batch_inner<'t>(
        &mut self,
        items: &[(SeqHandle, usize)],
        tokens: impl Fn(usize) -> Option<&'t [u32]>,
    ) -> Result<()> {
        for &(h, _) in items {
            prefetch_line(self.seqs.entry_ptr(h.index as usize));
        }
        for &(h, n) in items {
            let s = self
                .seqs
                .get(h.index as usize)
                .filter(|s| s.id == h.id)
                .ok_or(KvError::UnknownSequence(h.id))?;
            if n > s.len {
                return Err(KvError::ComputedPastEnd {
                    requested: n,
                    len: s.len,
                });
            }
            prefetch_line(
                s.hashes
                    .as_ptr()
                    .wrapping_add(s.hashes.len().saturating_sub(1)),
            );
            prefetch_line(s.blocks.as_ptr().wrapping_add(s.registered as usize));
        }
        // Then the pool's lines of the first block each item registers.
        for &(h, _) in items {
            if let Some(s) = self.seqs.get(h.index as usize)
                && let Some(&b) = s.blocks.get(s.registered as usize)
            {
                self.pool.prefetch_block(b);
            }
        }
        // Every item was checked above and nothing has changed since: mark without checking again.
        for (i, &(h, n)) in items.iter().enumerate() {
            if let Some(s) = self.seqs.get_mut(h.index as usize) {
                s.computed = s.computed.max(n);
                register_blocks(&mut self.pool, &mut self.hasher, &self.cfg, s, tokens(i));
            }
        }
        Ok(())
    }

    /// Removes the last `n` tokens of `seq` (rejected speculative tokens, or a truncation).
    /// Blocks left empty are released; if the new last block is partly filled and shared or
    /// cached, it is detached: a cached private block leaves the cache, a shared block is copied
    /// to a fresh one (the returned [`CopyOp`]). All or nothing.
    pub fn rollback(&mut self, seq: u64, n: usize) -> Result<Option<CopyOp>> {
        let bs = self.cfg.block_size;
        let i = self.seq_index(seq)?;
        let s = Self::seq_mut(&mut self.seqs, i, seq)?;
        let len = s.len;
        if n > len {
            return Err(KvError::RollbackPastStart { requested: n, len });
        }
        if n == 0 {
            return Ok(None);
        }
        let new_len = len - n;
        let keep = div_ceil(new_len, bs);
        let partial_tail = (!new_len.is_multiple_of(bs)).then(|| s.blocks[keep - 1]);
        let mut copy = None;
        if let Some(tail) = partial_tail
            && self.pool.ref_count(tail)? > 1
        {
            let dst = self.pool.allocate()?;
            copy = Some(CopyOp { src: tail, dst });
        }
        let s = Self::seq_mut(&mut self.seqs, i, seq)?;
        self.pool.release_all(&s.blocks[keep..])?;
        s.blocks.truncate(keep);
        if let Some(op) = copy {
            self.pool.release(op.src)?;
            s.blocks[keep - 1] = op.dst;
        } else if let Some(tail) = partial_tail {
            self.pool.unregister(tail);
        }
        s.truncate(new_len);
        s.committed = s.committed.min(new_len);
        s.computed = s.computed.min(new_len);
        s.hashes.truncate(new_len / bs);
        s.registered = s.registered.min((new_len / bs) as u32);
        Ok(copy)
    }

    /// Forks `parent` into a new sequence `child` (beam search, parallel sampling). The child
    /// shares every full block; a partly filled last block is copied into a fresh block for the
    /// child, and the returned [`CopyOp`] tells the engine to copy it. All or nothing.
    pub fn fork(&mut self, parent: u64, child: u64) -> Result<Option<CopyOp>> {
        if self.ids.contains_key(&child) {
            return Err(KvError::SequenceExists(child));
        }
        let bs = self.cfg.block_size;
        let p = self.seq(parent)?;
        let mut c = p.clone();
        c.id = child;
        let partial = !p.len.is_multiple_of(bs);
        let mut copy = None;
        if partial {
            let src = *c.blocks.last().ok_or(KvError::UnknownSequence(parent))?;
            let dst = self.pool.allocate()?;
            *c.blocks
                .last_mut()
                .ok_or(KvError::UnknownSequence(parent))? = dst;
            copy = Some(CopyOp { src, dst });
        }
        let shared = c.blocks.len() - usize::from(partial);
        for &b in &c.blocks[..shared] {
            self.pool.retain(b)?;
        }
        self.insert_seq(c);
        Ok(copy)
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

    /// Brings full blocks found in a slower tier into the device cache: for blocks
    /// `first..first + count` of the hash chain of `tokens`, takes a free block, registers it
    /// under its hash and leaves it free-but-cached (most recently used), so the next
    /// [`BlockManager::allocate`] of a prompt with this prefix hits it. Blocks already cached are
    /// skipped. Returns `(block, hash)` for each imported block: the engine must load the
    /// payload of `hash` into `block` before any forward pass uses it. All or nothing.
    pub fn import_blocks(
        &mut self,
        tokens: &[u32],
        keys: &ExtraKeys,
        first: usize,
        count: usize,
    ) -> Result<Vec<(BlockId, BlockHash)>> {
        if !self.cfg.enable_prefix_caching || count == 0 {
            return Ok(Vec::new());
        }
        let bs = self.cfg.block_size;
        let end = first + count;
        if end * bs > tokens.len() {
            return Err(KvError::InvalidConfig(format!(
                "blocks {first}..{end} exceed the {} full blocks of the tokens",
                tokens.len() / bs
            )));
        }
        let mut hashes = Vec::with_capacity(end);
        self.hasher
            .hash_chain(&tokens[..end * bs], bs, keys, &mut hashes);
        let missing: Vec<usize> = (first..end)
            .filter(|&i| !self.pool.contains(hashes[i]))
            .collect();
        let available = self.pool.num_free();
        if missing.len() > available {
            return Err(KvError::OutOfBlocks {
                needed: missing.len(),
                available,
            });
        }
        let mut out = Vec::with_capacity(missing.len());
        for i in missing {
            let b = self.pool.allocate()?;
            let parent = i.checked_sub(1).map(|p| hashes[p]);
            self.pool
                .register(b, hashes[i], parent, &tokens[i * bs..(i + 1) * bs]);
            self.pool.release(b)?;
            out.push((b, hashes[i]));
        }
        Ok(out)
    }

    /// Evicts up to `n` least recently used free cached blocks now (normally eviction is lazy).
    pub fn evict_cached(&mut self, n: usize) -> usize {
        self.pool.evict_lru(n)
    }

    /// Drops the whole prefix cache (for instance after a weight update).
    pub fn reset_prefix_cache(&mut self) {
        self.pool.clear_cache();
        for s in self.seqs.iter_mut() {
            // Blocks already offered stay uncached; new full blocks will be registered again.
            // At most `len / block_size`, so at most the blocks held: fits a `u32`.
            s.registered = s
                .registered
                .max((s.committed.min(s.computed) / self.cfg.block_size) as u32);
        }
    }
}

#[cfg(feature = "testing")]
impl BlockManager {
    /// Checks the sequence table's internal bookkeeping (see
    /// [`crate::testing::check_invariants`]): ids and vacant entries, per-sequence counts, and
    /// that a held block's hash is the one its sequence computed for that position (if it has).
    pub(crate) fn check_sequences(&self) -> std::result::Result<(), String> {
        let bs = self.cfg.block_size;
        let live = self.seqs.0.iter().filter(|s| s.live).count();
        if live != self.ids.len() {
            return Err(format!("{live} live entries, {} ids", self.ids.len()));
        }
        for (&id, &i) in &self.ids {
            match self.seqs.get(i as usize) {
                Some(s) if s.id == id => {}
                _ => return Err(format!("id {id} names entry {i}, which is not it")),
            }
        }
        let mut vacant: Vec<u32> = self.free_idx.clone();
        vacant.sort_unstable();
        vacant.dedup();
        if vacant.len() != self.free_idx.len() {
            return Err("an entry is vacant twice".into());
        }
        if vacant.len() + live != self.seqs.0.len() {
            return Err(format!(
                "{} entries: {live} live, {} vacant",
                self.seqs.0.len(),
                vacant.len()
            ));
        }
        if let Some(&i) = vacant
            .iter()
            .find(|&&i| self.seqs.get(i as usize).is_some())
        {
            return Err(format!("entry {i} is live and vacant"));
        }
        for s in self.seqs.0.iter().filter(|s| s.live) {
            let id = s.id;
            if s.blocks.len() != div_ceil(s.len, bs) {
                return Err(format!(
                    "sequence {id}: {} blocks for {} tokens",
                    s.blocks.len(),
                    s.len
                ));
            }
            if s.committed > s.len || s.computed > s.len {
                return Err(format!(
                    "sequence {id}: {} committed, {} computed of {}",
                    s.committed, s.computed, s.len
                ));
            }
            if s.keeps_tokens && s.tokens.len() != s.len || !s.keeps_tokens && !s.tokens.is_empty()
            {
                return Err(format!(
                    "sequence {id}: {} token ids for {} tokens (kept: {})",
                    s.tokens.len(),
                    s.len,
                    s.keeps_tokens
                ));
            }
            if s.registered as usize > s.blocks.len() || s.hashes.len() > s.committed / bs {
                return Err(format!(
                    "sequence {id}: {} registered, {} hashes, {} blocks, {} committed",
                    s.registered,
                    s.hashes.len(),
                    s.blocks.len(),
                    s.committed
                ));
            }
            if s.plain_keys != s.keys.is_empty() {
                return Err(format!(
                    "sequence {id}: plain_keys flag disagrees with its keys"
                ));
            }
            // (A block shared with another sequence may be cached by it before this one has
            // hashed that position.)
            for (i, (&b, &mine)) in s.blocks.iter().zip(&s.hashes).enumerate() {
                if let Some(h) = self.pool.hash_of(b)
                    && h != mine
                {
                    return Err(format!(
                        "sequence {id}: block {i} ({b}) cached as {h:?}, the sequence's hash is {mine:?}"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Offers every full block of `s` that is committed and computed to the prefix cache. The token
/// ids come from `s` when it keeps them, else from `caller` (the caller's committed tokens; only
/// the full blocks they cover are offered, and none without them: those wait for a later call).
#[inline]
fn register_blocks(
    pool: &mut BlockPool,
    hasher: &mut BlockHasher,
    cfg: &BlockManagerConfig,
    s: &mut Sequence,
    caller: Option<&[u32]>,
) {
    if !cfg.enable_prefix_caching {
        return;
    }
    let bs = cfg.block_size;
    let toks: &[u32] = if s.keeps_tokens {
        &s.tokens
    } else {
        match caller {
            Some(t) => t,
            None => return,
        }
    };
    // (Floor division is monotone: one division instead of two.)
    let limit = s.committed.min(s.computed).min(toks.len()) / bs;
    let registered = s.registered as usize;
    if limit <= registered {
        return;
    }
    // Decided once per sequence, not per block.
    let text = hasher.text_fast_path_for(s.plain_keys);
    let keys = &s.keys;
    // Hash of block `i` given its parent's.
    let hash = |hasher: &mut BlockHasher, parent: Option<BlockHash>, i: usize| {
        let block = &toks[i * bs..(i + 1) * bs];
        if text {
            hasher.hash_text_block(parent, block)
        } else {
            hasher.hash_block(parent, block, i * bs, keys)
        }
    };
    // `limit` is at most the blocks held (committed tokens fit them): a `u32`.
    if limit == registered + 1 && s.hashes.len() == registered {
        // The usual case (a decode step filled one block): hash it and offer it in one go.
        let i = registered;
        let parent = s.hashes.last().copied();
        let h = hash(hasher, parent, i);
        s.hashes.push(h);
        pool.register(s.blocks[i], h, parent, &toks[i * bs..(i + 1) * bs]);
        s.registered = limit as u32;
        return;
    }
    while s.hashes.len() < limit {
        let i = s.hashes.len();
        let h = hash(hasher, s.hashes.last().copied(), i);
        s.hashes.push(h);
    }
    for i in registered..limit {
        let parent = if i == 0 { None } else { Some(s.hashes[i - 1]) };
        // Another block may already hold this hash (two requests computed the same
        // prefix); then this block simply stays uncached.
        pool.register(
            s.blocks[i],
            s.hashes[i],
            parent,
            &toks[i * bs..(i + 1) * bs],
        );
    }
    s.registered = s.registered.max(limit as u32);
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

    /// The cached `plain_keys` flag agrees with the keys it stands for: sequences with and
    /// without extra keys hash their blocks as the hasher does from the keys themselves.
    #[test]
    fn plain_keys_flag_matches_the_keys() {
        let cfg = BlockManagerConfig::new(32, 4);
        let mut m = BlockManager::new(cfg).unwrap();
        let prompt: Vec<u32> = (0..8).collect();
        let keyed = ExtraKeys {
            adapter: Some(3),
            ..Default::default()
        };
        for (id, keys) in [(1u64, ExtraKeys::none()), (2, keyed)] {
            let opts = AllocateOptions {
                extra_keys: keys.clone(),
                ..Default::default()
            };
            m.allocate(id, &prompt, opts).unwrap();
            m.mark_computed(id, 8).unwrap();
            let want = m.prefix_hashes(&prompt, &keys);
            assert_eq!(m.seq(id).unwrap().plain_keys, keys.is_empty());
            assert_eq!(m.seq(id).unwrap().hashes, want);
        }
    }
}
