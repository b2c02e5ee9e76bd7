//! Prefix lookup and allocation of a new sequence's prompt with a prefix hit.

use crate::error::{KvError, Result};
use crate::hash::{BlockHash, ExtraKeys};
use crate::pool::BlockId;

use super::{AllocateOptions, Allocation, BlockManager, PrefixMatch, Sequence, div_ceil};

impl BlockManager {
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
}
