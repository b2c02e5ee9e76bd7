//! Prefix-cache maintenance: importing blocks from a slower tier, eviction and reset.

use crate::error::{KvError, Result};
use crate::hash::{BlockHash, ExtraKeys};
use crate::pool::BlockId;

use super::BlockManager;

impl BlockManager {
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
