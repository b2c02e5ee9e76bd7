//! The public value types of the manager: slots, copy orders, configuration, allocation
//! options and results, prefix matches and per-sequence usage.

#[cfg(doc)]
use crate::events::KvEvent;
use crate::hash::{BlockHash, ExtraKeys, HashAlgo};
use crate::hit_rule::{HitPlan, HitRule};
use crate::pool::BlockId;

#[cfg(doc)]
use super::BlockManager;

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
