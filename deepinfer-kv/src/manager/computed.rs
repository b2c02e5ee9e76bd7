//! Progress reports ([`BlockManager::mark_computed`] and its handle and batch forms) and the
//! registration of computed full blocks in the prefix cache.

use crate::error::{KvError, Result};
use crate::hash::{BlockHash, BlockHasher};
use crate::pool::BlockPool;
use crate::prefetch::prefetch_line;

#[cfg(doc)]
use super::AllocateOptions;
use super::{BlockManager, BlockManagerConfig, SeqHandle, Sequence};

impl BlockManager {
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
}

/// Offers every full block of `s` that is committed and computed to the prefix cache. The token
/// ids come from `s` when it keeps them, else from `caller` (the caller's committed tokens; only
/// the full blocks they cover are offered, and none without them: those wait for a later call).
#[inline]
pub(super) fn register_blocks(
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
    use crate::hash::ExtraKeys;

    use crate::manager::AllocateOptions;

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
