//! Appending committed tokens: slot mappings, the decode fast paths, prefetch hints and
//! host-memory reservation.

use crate::error::{KvError, Result};
use crate::pool::NIL;
use crate::prefetch::prefetch_line;

#[cfg(doc)]
use super::AllocateOptions;
use super::{BlockManager, SeqHandle, Slot, div_ceil};

impl BlockManager {
    pub(super) fn append_inner(
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

    /// [`BlockManager::append`] returning a fresh vector.
    pub fn append_slots(&mut self, seq: u64, tokens: &[u32]) -> Result<Vec<Slot>> {
        let mut out = Vec::with_capacity(tokens.len());
        self.append(seq, tokens, &mut out)?;
        Ok(out)
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
}
