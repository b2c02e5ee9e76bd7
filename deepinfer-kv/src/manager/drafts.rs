//! Speculative draft tokens: appending, accepting, committing under real ids and rollback.

use crate::error::{KvError, Result};

use super::computed::register_blocks;
use super::{BlockManager, CopyOp, SeqHandle, Slot, div_ceil};

impl BlockManager {
    /// [`BlockManager::append_draft`] through a handle.
    pub fn append_draft_by_handle(
        &mut self,
        h: SeqHandle,
        tokens: &[u32],
        out: &mut Vec<Slot>,
    ) -> Result<()> {
        self.append_inner(h.index as usize, h.id, tokens, true, out)
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
}
