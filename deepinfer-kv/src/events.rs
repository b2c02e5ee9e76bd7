//! Cache events for cache-aware routers, and hit-rate metrics.

use crate::hash::BlockHash;
use crate::pool::BlockId;

/// A change to the set of cached block hashes, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// A full block became matchable under `hash`.
    Stored {
        /// The block's chained hash.
        hash: BlockHash,
        /// The previous block's hash (None for a sequence's first block).
        parent: Option<BlockHash>,
        /// Where it lives in the device pool.
        block: BlockId,
    },
    /// Hashes that are no longer matchable (evicted or overwritten).
    Removed {
        /// The hashes removed.
        hashes: Vec<BlockHash>,
    },
    /// Every hash was dropped.
    Cleared,
}

/// Prefix-cache counters.
///
/// Prompts re-allocated after preemption are counted apart: their hits are the engine's own
/// recompute, not reuse across requests, and would inflate the hit rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Prompts allocated (excluding re-allocations after preemption).
    pub requests: u64,
    /// Prompt tokens looked up (excluding re-allocations after preemption).
    pub query_tokens: u64,
    /// Of those, tokens served from cache.
    pub hit_tokens: u64,
    /// Prompt tokens re-allocated after preemption.
    pub preempted_query_tokens: u64,
    /// Of those, tokens served from cache.
    pub preempted_hit_tokens: u64,
    /// Tokens replayed to rebuild missing window state.
    pub replayed_tokens: u64,
    /// Cached blocks evicted from the device pool.
    pub evictions: u64,
}

impl CacheStats {
    /// Hit tokens over query tokens, excluding recompute after preemption; 0 when nothing was asked.
    pub fn hit_rate(&self) -> f64 {
        if self.query_tokens == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / self.query_tokens as f64
        }
    }
}
