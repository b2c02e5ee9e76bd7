//! The waiting queue and admission into the running list.
//!
//! Waiting requests are admitted greatest key first (higher priority, then
//! earlier arrival) after the running ones are planned, while the step's row
//! and sequence budgets last. Admission stops at the first live request that
//! does not fit (no overtaking), and does not start in a step that preempted
//! (memory is short, and the request just preempted would come straight
//! back). A preempted request whose rows are still in flight is passed over
//! until they land. The queue is never scanned: stale keys (aborted or
//! re-queued requests) are dropped as they come off its end.
//!
//! Admission allocates the whole history in the block manager, which applies
//! its prefix-cache hit rule; the cached tokens are not recomputed. The free
//! blocks must still cover the reservations of provisional rows, plus the
//! manager's watermark unless nothing runs.

use deepinfer_kv::{AllocateOptions, KvError};

use super::Scheduler;
use super::kv_slots::next_block_end;
use super::record::{FlightRow, Phase, WaitKey};
use super::slab::Loc;
use super::step::StepState;
use crate::error::SchedError;
use crate::request::{RequestId, StepPlan};

/// Most output tokens whose host memory is reserved at admission.
const RESERVE_TOKENS: usize = 2048;

/// What trying to admit one waiting request did.
enum Admission {
    /// It runs, with its first chunk planned.
    Admitted,
    /// Passed over (its rows in flight must land first); the next may fit.
    Passed,
    /// It does not fit this step; admission stops.
    Blocked,
}

impl Scheduler {
    /// Queue the parked request in `slot`.
    pub(super) fn push_waiting(&mut self, slot: u32) {
        let r = self.parked[slot as usize]
            .as_mut()
            .unwrap_or_else(|| unreachable!("parked slot {slot} is empty"));
        r.phase = Phase::Waiting;
        let key = WaitKey {
            priority: r.priority,
            arrival: r.arrival,
            slot,
            incarnation: r.incarnation,
        };
        self.waiting.insert(key);
        self.num_waiting += 1;
    }

    /// Take the greatest live key off the waiting queue (stale ones are
    /// dropped on the way) and count its request out of `num_waiting`.
    fn pop_waiting(&mut self) -> Option<WaitKey> {
        while let Some(key) = self.waiting.pop_last() {
            let live = self.parked.get(key.slot as usize).is_some_and(|r| {
                r.as_ref().is_some_and(|r| {
                    r.arrival == key.arrival
                        && r.incarnation == key.incarnation
                        && r.phase == Phase::Waiting
                })
            });
            if live {
                self.num_waiting -= 1;
                return Some(key);
            }
        }
        None
    }

    /// Admit waiting requests into the step while its budgets last (see the
    /// module docs for the order and when admission stops). Requests passed
    /// over or blocked go back to the queue.
    pub(super) fn admit_waiting(
        &mut self,
        plan: &mut StepPlan,
        st: &mut StepState,
    ) -> Result<(), SchedError> {
        while st.seqs_left > 0 && st.tokens_left > 0 && plan.preempted.is_empty() {
            let Some(key) = self.pop_waiting() else {
                break;
            };
            match self.admit(key, plan, st)? {
                Admission::Admitted | Admission::Passed => {}
                Admission::Blocked => break,
            }
        }
        for k in self.deferred.drain(..) {
            self.waiting.insert(k);
            self.num_waiting += 1;
        }
        Ok(())
    }

    /// Try to admit the waiting request of `key`: allocate its KV sequence
    /// (prefix-cache hits included), pick its first chunk, move it to the
    /// running slab and plan the chunk. A request that does not fit gets its
    /// KV sequence freed again and its key deferred (back to the queue after
    /// the step).
    fn admit(
        &mut self,
        key: WaitKey,
        plan: &mut StepPlan,
        st: &mut StepState,
    ) -> Result<Admission, SchedError> {
        let ploc = Loc {
            slot: key.slot,
            parked: true,
        };
        let Some(r) = self.get(ploc) else {
            return Ok(Admission::Passed);
        };
        if r.inflight > 0 {
            // Preempted while a step in flight still produces its tokens.
            self.deferred.push(key);
            return Ok(Admission::Passed);
        }
        let id = r.id;
        let known = r.tokens.len();
        let recompute = r.preempted_before;
        let extra = (r.prompt_len + r.max_new_tokens)
            .min(self.max_len)
            .saturating_sub(known)
            .min(RESERVE_TOKENS);
        let watermark = if self.running.is_empty() {
            0
        } else {
            self.kv.watermark_blocks()
        };
        let tokens = self.parked[key.slot as usize]
            .as_ref()
            .map_or(&[][..], |r| r.tokens.as_slice());
        let alloc = self.kv.allocate(
            id,
            tokens,
            AllocateOptions {
                recompute_after_preemption: recompute,
                // The history is the token list: the manager only counts.
                caller_keeps_tokens: true,
                ..Default::default()
            },
        );
        let (reused, nblocks) = match alloc {
            Ok(a) => (a.plan.reused_tokens, a.num_blocks),
            Err(KvError::OutOfBlocks { .. }) => {
                self.deferred.push(key);
                return Ok(Admission::Blocked);
            }
            Err(e) => return Err(e.into()),
        };
        // The reservations and the watermark must stay free; then the first
        // chunk (0: the request waits).
        let q = if self.kv.pool().num_free() < st.reserved_blocks + watermark {
            0
        } else {
            self.admission_chunk(reused, known, st)
        };
        if q == 0 {
            let _ = self.kv.free(id);
            self.deferred.push(key);
            return Ok(Admission::Blocked);
        }
        self.stats.cached_tokens += reused as u64;
        let samples = reused + q == known;
        let (slot, epoch) = self.enter_running(ploc, id, reused + q, samples, nblocks, extra);
        st.add_chunk(
            plan,
            FlightRow {
                slot,
                epoch,
                id,
                start: reused,
                len: q,
                samples,
                cancelled: false,
            },
        );
        Ok(Admission::Admitted)
    }

    /// Move the admitted request at `ploc` (its KV sequence allocated with
    /// its whole history, in `nblocks` blocks) to the dense running slab with
    /// `scheduled` tokens planned, and insert it in the running list; its
    /// slot and new placement epoch. Host and KV room for `extra` more tokens
    /// is reserved, so decoding does not reallocate.
    fn enter_running(
        &mut self,
        ploc: Loc,
        id: RequestId,
        scheduled: usize,
        samples: bool,
        nblocks: usize,
        extra: usize,
    ) -> (u32, u32) {
        let bs = self.kv.block_size();
        let handle = self.kv.handle(id).ok();
        let _ = self.kv.reserve(id, extra);
        let mut r = self.take(ploc);
        let known = r.tokens.len();
        r.tokens.reserve(extra);
        r.kv_len = known as u32;
        r.kv_synced = known;
        r.kv_drafts = 0;
        r.kv = handle;
        r.kv_room = (nblocks * bs - known) as u32;
        // The block of the last prompt token: a decode row may compute it
        // (when the prompt's chunks stop one short of it), and then fills it.
        r.next_full = next_block_end(known - 1, bs);
        r.scheduled = scheduled as u32;
        r.inflight += 1;
        r.sampling_rows += u8::from(samples);
        let slot = self.place(r, false).slot;
        let epoch = self.req(slot).epoch;
        self.insert_running(slot);
        (slot, epoch)
    }

    /// Insert the running slot in the running list at its (priority desc,
    /// arrival asc) place.
    pub(super) fn insert_running(&mut self, slot: u32) {
        let (p, a) = {
            let r = self.req(slot);
            (r.priority, r.arrival)
        };
        // Usually appends (admission order is queue order); a higher-priority
        // arrival is inserted in place.
        let mut i = self.running.len();
        while i > 0 {
            let o = self.req(self.running[i - 1]);
            if (o.priority, std::cmp::Reverse(o.arrival)) >= (p, std::cmp::Reverse(a)) {
                break;
            }
            i -= 1;
        }
        self.running.insert(i, slot);
        self.req_mut(slot).phase = Phase::Running;
    }
}
