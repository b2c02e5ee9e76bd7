//! The scheduler's two hot loops over runs of steady decode rows (input token
//! known, no drafts): planning them in `schedule_into` and applying their
//! sampled tokens in `update`. Each row touches only its record's hot cache
//! line, its history's end and the row lists. A row that starts or fills a
//! block stays on the loop (its block is allocated or reported in one batch
//! after the walk); anything else (drafts, stops, confidences, cancelled or
//! provisional rows) ends the run and goes through the general paths.

use deepinfer_kv::BlockManager;

use super::{DecodeFlight, Req, next_block_end};
use crate::request::DecodeRow;

/// Ask for the cache line holding `p` (a hint: never faults, whatever the address).
#[inline(always)]
fn prefetch_line<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it reads nothing architecturally and never
    // faults, even for an invalid address; SSE is part of the x86_64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Ask for the hot cache line of the record in `slot` (no bounds check
/// needed: a prefetch of any address is harmless).
#[inline(always)]
pub(super) fn prefetch_record(slots: &[Req], slot: u32) {
    prefetch_line(slots.as_ptr().wrapping_add(slot as usize));
}

/// Ask for the line of the record in `slot` that holds its KV handle (with
/// the counters `sync_kv` reads), for batches that read it after a walk.
#[inline(always)]
pub(super) fn prefetch_cold_line(slots: &[Req], slot: u32) {
    let record = slots.as_ptr().wrapping_add(slot as usize).cast::<u8>();
    prefetch_line(record.wrapping_add(std::mem::offset_of!(Req, kv)));
}

/// Steady decode rows from `running[i..]`, at most `max_rows`: the input token
/// is known, no drafts. Each reads and writes only its request's hot line and
/// the two row lists (the input joins the KV sequence in its block's batch,
/// see `sync_kv`). A row that starts a block takes one of `grow_budget` blocks
/// and queues its slot in `grow` (allocated after the walk, `flush_grow`),
/// and asks the block manager to look one block further down its free list.
/// Stops at the first other row; returns where it stopped and the sum of
/// `1 + position` over the rows taken.
#[inline(never)]
pub(super) fn steady_decode_rows(
    running: &[u32],
    slots: &mut [Req],
    i: usize,
    max_rows: usize,
    rows: &mut Vec<DecodeFlight>,
    decode: &mut Vec<DecodeRow>,
    (bs, grow_budget, grow, kv): (usize, &mut usize, &mut Vec<u32>, &mut BlockManager),
) -> (usize, u64) {
    let end = running.len().min(i.saturating_add(max_rows));
    let run = &running[i..end];
    let n = run.len();
    // The rows are written into reserved room and the lengths set once after
    // the walk: no capacity check or length store per row, and the vectors'
    // pointers stay in registers.
    rows.reserve(n);
    decode.reserve(n);
    let grow_room = n.min(*grow_budget);
    grow.reserve(grow_room);
    let rows_out = &mut rows.spare_capacity_mut()[..n];
    let decode_out = &mut decode.spare_capacity_mut()[..n];
    let grow_out = &mut grow.spare_capacity_mut()[..grow_room];
    // The records 8 rows on, so their misses overlap with this row's work.
    let ahead = running
        .get(i + 8..end.saturating_add(8).min(running.len()))
        .unwrap_or(&[]);
    let mut sum = 0u64;
    let mut k = 0;
    let mut g = 0;
    // (Zipped, so the row and its two outputs need no bounds checks.)
    let outs = rows_out.iter_mut().zip(decode_out.iter_mut());
    for (&slot, (row_out, decode_out)) in run.iter().zip(outs) {
        if let Some(&s8) = ahead.get(k) {
            prefetch_record(slots, s8);
        }
        let Some(r) = slots.get_mut(slot as usize) else {
            break;
        };
        let position = r.scheduled;
        if position as usize + 1 != r.tokens.len() || r.kv_len != position || r.kv_drafts != 0 {
            break;
        }
        if r.kv_room == 0 {
            // The row starts a block: one of the budget's blocks, allocated
            // after the walk (`flush_grow`); no budget left ends the run.
            let Some(o) = grow_out.get_mut(g) else {
                break;
            };
            o.write(slot);
            g += 1;
            r.kv_room = bs as u32;
            // One step down the free list per block to come, so `flush_grow`
            // finds the blocks' lines at hand (see `prefetch_free_ahead`).
            kv.prefetch_free_ahead();
        }
        // The line `update` will append this row's token to: asked for now,
        // while the record's line is at hand, so that `update` reads no
        // record ahead of its row to find it.
        prefetch_line(r.tokens.as_ptr().wrapping_add(r.tokens.len()));
        r.kv_len = position + 1;
        r.kv_room -= 1;
        r.scheduled = position + 1;
        r.inflight += 1;
        r.sampling_rows += 1;
        sum += u64::from(position) + 1;
        row_out.write(DecodeFlight {
            id: r.id,
            position,
            slot,
            epoch: r.epoch,
            drafts: 0,
            reserved: 0,
            provisional: false,
            cancelled: false,
        });
        decode_out.write(DecodeRow {
            request: r.id,
            position: position as usize,
            drafts: 0,
            provisional: false,
        });
        k += 1;
    }
    // SAFETY: the first `k` entries of `rows`' and `decode`'s spare room and
    // the first `g` of `grow`'s were written above (`MaybeUninit::write`), and
    // were reserved (`k <= n`, `g <= grow_room`).
    unsafe {
        rows.set_len(rows.len() + k);
        decode.set_len(decode.len() + k);
        grow.set_len(grow.len() + g);
    }
    *grow_budget -= g;
    (i + k, sum)
}

/// The dense update's steady rows from `rows[j..]` (row `j + k` takes
/// `toks[t + k]`): the request still runs on the row's KV sequence (same
/// epoch), nothing speculative, stop-related or confidence-related is pending
/// and the token does not end it, so the token only extends the history (and,
/// once per block, the filled block is queued for `flush_computed`). Stops at
/// the first other row (a cancelled one included); returns where it stopped.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(super) fn dense_steady_rows(
    rows: &[DecodeFlight],
    toks: &[u32],
    slots: &mut [Req],
    bs: usize,
    j: usize,
    t: usize,
    full: &mut Vec<(u32, usize)>,
) -> (usize, usize) {
    let run = rows.get(j..).unwrap_or(&[]);
    let toks = toks.get(t..).unwrap_or(&[]);
    let n = run.len().min(toks.len());
    let (run, toks) = (&run[..n], &toks[..n]);
    // The records 8 rows on, so their misses overlap (the history ends were
    // asked for when the rows were planned, see `steady_decode_rows`).
    let ahead8 = run.get(8..).unwrap_or(&[]);
    let mut k = 0;
    while k < n {
        if let Some(f8) = ahead8.get(k) {
            prefetch_record(slots, f8.slot);
        }
        let fr = &run[k];
        let Some(r) = slots.get_mut(fr.slot as usize) else {
            break;
        };
        if fr.cancelled
            || fr.drafts != 0
            || r.epoch != fr.epoch
            || r.kv_drafts != 0
            || r.has_confs
            || r.has_stops
            || r.tokens.len() + 1 >= r.limit as usize
        {
            break;
        }
        r.inflight -= 1;
        r.sampling_rows -= 1;
        if r.kv_len >= r.next_full {
            queue_full_block(r, fr.slot, bs, full);
        }
        r.tokens.push(toks[k]);
        k += 1;
    }
    (j + k, t + k)
}

/// Queues the block a steady row's input filled for `flush_computed` (once
/// per block per request, so kept out of the row loop), and asks for the
/// lines of the block's tokens, which `flush_computed` hashes: the first of
/// them were written a block's worth of steps ago and have left the cache.
/// Reads only the record's hot line: the KV handle is looked up in the batch.
#[cold]
#[inline(never)]
pub(super) fn queue_full_block(r: &mut Req, slot: u32, bs: usize, full: &mut Vec<(u32, usize)>) {
    // The last full block at `kv_len` (its tokens are in the history: the
    // row's input is the token before the one being appended).
    let start = (r.kv_len as usize / bs).saturating_sub(1) * bs;
    let p = r.tokens.as_ptr();
    prefetch_line(p.wrapping_add(start));
    prefetch_line(p.wrapping_add(start + bs - 1));
    full.push((slot, r.kv_len as usize));
    r.next_full = next_block_end(r.kv_len as usize, bs);
}
