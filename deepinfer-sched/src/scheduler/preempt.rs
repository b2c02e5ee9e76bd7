//! Preemption by recompute.
//!
//! A preempted request loses its KV sequence (its full computed blocks stay in
//! the prefix cache), keeps its whole history, its arrival and its placement
//! epoch, and goes back to the waiting queue; re-admission recomputes it,
//! mostly from cache. Victims are taken from the end of the running list:
//! lowest priority, then newest.

use deepinfer_kv::BlockManager;

use super::Scheduler;
use super::record::{Phase, Req};
use super::slab::Loc;
use crate::request::RequestId;

impl Scheduler {
    /// Drop a request's KV sequence (full computed blocks stay in the prefix cache).
    pub(super) fn free_kv(kv: &mut BlockManager, r: &mut Req) {
        let had = r.phase == Phase::Running;
        r.incarnation = r.incarnation.wrapping_add(1);
        r.scheduled = 0;
        r.kv_len = 0;
        r.kv_synced = 0;
        r.kv_drafts = 0;
        r.kv = None;
        if had {
            let _ = kv.free(r.id);
        }
    }

    /// Preempt the running request in `slot` by recompute: free the KV (full
    /// blocks stay cached), park and requeue it. The caller removes it from the
    /// running list.
    pub(super) fn preempt(&mut self, slot: u32, out: &mut Vec<RequestId>) {
        let mut r = self.take(Loc {
            slot,
            parked: false,
        });
        Self::free_kv(&mut self.kv, &mut r);
        r.preempted_before = true;
        r.kv_drafts = 0;
        let id = r.id;
        let loc = self.place(r, true);
        self.push_waiting(loc.slot);
        self.stats.preemptions += 1;
        out.push(id);
    }

    /// Out of blocks for the request in `asking`: preempt the last of the
    /// running list (lowest priority, newest; possibly `asking` itself) and
    /// take it off the list. True when the victim was `asking`.
    pub(super) fn preempt_last(&mut self, asking: u32, out: &mut Vec<RequestId>) -> bool {
        let victim = *self.running.last().unwrap_or(&asking);
        self.running.pop();
        self.preempt(victim, out);
        victim == asking
    }

    /// Preempt the running request in `slot`, one of whose pending rows was
    /// just cancelled: it stops counting that row in flight, leaves the
    /// running list and is requeued.
    pub(super) fn preempt_for_cancelled_row(&mut self, slot: u32, out: &mut Vec<RequestId>) {
        let r = self.req_mut(slot);
        r.inflight = r.inflight.saturating_sub(1);
        r.sampling_rows = r.sampling_rows.saturating_sub(1);
        if let Some(i) = self.running.iter().position(|&s| s == slot) {
            self.running.remove(i);
        }
        self.preempt(slot, out);
    }
}
