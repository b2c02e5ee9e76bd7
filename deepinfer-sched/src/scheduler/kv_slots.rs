//! KV slots for decode rows and their drafts, and the hand-over of counted
//! tokens to the block manager.
//!
//! A running request's KV sequence has a slot for every row planned for it:
//! `append_rows` gives a decode row its input's slot and its drafts'
//! (placeholder tokens) while leaving the blocks reserved for provisional rows
//! free, or reports that the blocks are not there. Steady rows
//! only count their input in the record (`kv_len`, `kv_room`); `sync_kv`
//! hands the counted tokens to the manager, in batches per step
//! (`flush_grow` for blocks the step starts, `flush_computed` for blocks it
//! filled), so the block manager's state catches up before anything reads it.

use deepinfer_kv::{BlockManager, KvError};

use super::Scheduler;
use super::config::PLACEHOLDER_TOKEN;
use super::record::Req;
use super::steady_rows::prefetch_cold_line;
use crate::error::SchedError;

const PLACEHOLDERS: [u32; 16] = [PLACEHOLDER_TOKEN; 16];

pub(super) fn div_ceil(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// Blocks a sequence with `room` free slots in its last block allocates to
/// grow by `n` tokens (divides only when a block boundary is crossed).
pub(super) fn blocks_to_grow(room: usize, n: usize, bs: usize) -> usize {
    if n <= room {
        0
    } else {
        (n - room).div_ceil(bs)
    }
}

/// Free slots in the last block of a sequence of `len` tokens.
pub(super) fn room_after(len: usize, bs: usize) -> u32 {
    (div_ceil(len, bs) * bs - len) as u32
}

/// Committed length at which the block holding position `len` is full.
pub(super) fn next_block_end(len: usize, bs: usize) -> u32 {
    ((len / bs + 1) * bs) as u32
}

/// Hands the tokens a request's KV sequence holds but the block manager has
/// not been told of yet (steady decode rows only count them) to the manager,
/// which counts them (the history is the token list: see
/// `AllocateOptions::caller_keeps_tokens`). Allocates no block unless a steady
/// row started one (`flush_grow`). Only tokens the history holds are handed
/// over (accepted drafts cut short by a stop token are not).
pub(super) fn sync_kv(kv: &mut BlockManager, r: &mut Req) -> Result<(), KvError> {
    let len = (r.kv_len as usize).min(r.tokens.len());
    if r.kv_synced < len
        && let Some(h) = r.kv
    {
        kv.extend_by_handle(h, &r.tokens[r.kv_synced..len])?;
        r.kv_synced = len;
    }
    Ok(())
}

impl Scheduler {
    /// Append the known input token and `k` placeholder drafts of a decode
    /// row, leaving `reserved` free blocks untouched; false when the blocks
    /// it needs are not there.
    #[inline(always)]
    pub(super) fn append_rows(&mut self, slot: u32, k: usize, reserved: usize) -> bool {
        // Common case: one token into a block with room, no drafts. Only a length
        // increment and a token write in the block manager; block allocation (and
        // the reservation check it needs) happens at block boundaries only.
        if k == 0
            && let Some(r) = self.slots.get_mut(slot as usize)
            && r.kv_len as usize + 1 == r.tokens.len()
            && r.kv_room > 0
            && r.kv_drafts == 0
            && reserved <= self.kv.pool().num_free()
        {
            // (A running record always has its KV sequence.) The input joins
            // the KV sequence with its block's batch (`sync_kv`).
            r.kv_len += 1;
            r.kv_room -= 1;
            return true;
        }
        self.append_rows_slow(slot, k, reserved)
    }

    #[inline(never)]
    fn append_rows_slow(&mut self, slot: u32, k: usize, reserved: usize) -> bool {
        let bs = self.kv.block_size();
        let free = self.kv.pool().num_free();
        let Some(r) = self.slots.get_mut(slot as usize).filter(|r| r.epoch != 0) else {
            return false;
        };
        // The input needs a slot unless the KV sequence holds it already: the
        // last prompt token, when the prompt's chunks stopped one short of it
        // (the sequence was allocated with the whole prompt).
        let input = usize::from((r.kv_len as usize) < r.tokens.len());
        let need = blocks_to_grow(r.kv_room as usize, input + k, bs);
        if need + reserved > free {
            return false;
        }
        let Some(h) = r.kv else { return false };
        // The tokens counted but not yet handed over, then the input itself.
        let last = r.tokens.last().copied().unwrap_or(0);
        if sync_kv(&mut self.kv, r).is_err() || (input == 1 && self.kv.push_token(h, last).is_err())
        {
            return false;
        }
        r.kv_len += input as u32;
        r.kv_synced = r.kv_len as usize;
        r.kv_room = (r.kv_room as usize + need * bs - input - k) as u32;
        if k > 0 {
            self.slot_scratch.clear();
            let mut left = k;
            while left > 0 {
                let n = left.min(PLACEHOLDERS.len());
                // Cannot fail: the blocks were counted above.
                if self
                    .kv
                    .append_draft_by_handle(h, &PLACEHOLDERS[..n], &mut self.slot_scratch)
                    .is_err()
                {
                    break;
                }
                left -= n;
            }
            r.kv_drafts = (k - left) as u32;
            if left > 0 {
                r.kv_room = room_after((r.kv_len + r.kv_drafts) as usize, bs);
            }
        } else {
            r.kv_drafts = 0;
        }
        true
    }

    /// Allocate the blocks counted for the steady rows that start one (see
    /// `steady_decode_rows`): each request hands its KV sequence the tokens it
    /// counted, its new input included, which takes the block. In one batch
    /// whose cache misses overlap; it cannot run out of blocks (they were
    /// counted against the free ones, before any admission).
    pub(super) fn flush_grow(&mut self) -> Result<(), SchedError> {
        if self.grow_slots.is_empty() {
            return Ok(());
        }
        // (No pass for the token tails: the manager keeps none of the
        // scheduler's tokens, see `AllocateOptions::caller_keeps_tokens`.)
        for &slot in &self.grow_slots {
            if let Some(h) = self.slots.get(slot as usize).and_then(|r| r.kv) {
                self.kv.prefetch(h, false);
            }
        }
        for &slot in &self.grow_slots {
            if let Some(r) = self.slots.get_mut(slot as usize) {
                sync_kv(&mut self.kv, r)?;
            }
        }
        self.grow_slots.clear();
        Ok(())
    }

    /// Report the blocks filled during the update walk, in one batch whose
    /// cache misses overlap. Runs before anything frees a sequence, so every
    /// handle in the batch is live.
    pub(super) fn flush_computed(&mut self) -> Result<(), SchedError> {
        if self.computed_pending.is_empty() {
            return Ok(());
        }
        // The KV handles, from the records' cold lines (all asked for first,
        // so their cache misses overlap).
        for &(slot, _) in &self.computed_pending {
            prefetch_cold_line(&self.slots, slot);
        }
        self.computed_batch.clear();
        self.computed_slots.clear();
        for &(slot, n) in &self.computed_pending {
            if let Some(h) = self.slots.get(slot as usize).and_then(|r| r.kv) {
                self.computed_batch.push((h, n));
                self.computed_slots.push(slot);
            }
        }
        self.computed_pending.clear();
        // Hand each filled block's tokens to the manager first (entries asked
        // for ahead, so their cache misses overlap).
        // (No pass for the token tails: the manager keeps none of the
        // scheduler's tokens.)
        for &(h, _) in &self.computed_batch {
            self.kv.prefetch(h, false);
        }
        // Every item is synced; the first error is kept (set only on an error, so the
        // common path does not copy a `Result` per item).
        let mut synced = Ok(());
        for &slot in &self.computed_slots {
            if let Some(r) = self.slots.get_mut(slot as usize)
                && let Err(e) = sync_kv(&mut self.kv, r)
                && synced.is_ok()
            {
                synced = Err(e);
            }
        }
        let (slots, which) = (&self.slots, &self.computed_slots);
        let r = synced.and_then(|()| {
            self.kv.mark_computed_batch_with(&self.computed_batch, |i| {
                slots
                    .get(which[i] as usize)
                    .map_or(&[][..], |r| r.tokens.as_slice())
            })
        });
        self.computed_batch.clear();
        self.computed_slots.clear();
        Ok(r?)
    }
}
