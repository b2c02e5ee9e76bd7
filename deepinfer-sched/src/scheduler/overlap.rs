//! Overlapped scheduling: reconciling the plans still pending after an
//! `update`.
//!
//! Up to two plans can be pending when `update` applies the step before them.
//! Afterwards, in each pending plan, every row group whose request finished,
//! was aborted or was preempted (anything but still running on the KV
//! sequence the row was planned on) is cancelled and reported as a
//! [`PlanFix::Cancel`], and its request stops counting it in flight. The
//! provisional decode rows whose input token is now known are materialised
//! (their KV slots appended, their reservations released) and reported with
//! their position:
//!
//! - in the next plan, every provisional row is materialised; the engine's
//!   `UpdateResult::apply_to` confirms every row it keeps, so a position is
//!   reported only when it moved (after accepted drafts);
//! - in the plan after it (two-step overlap), only the rows whose request has
//!   no other sampling row in flight; a `Position` in `later_fixes` is what
//!   confirms such a row, so it is always reported. The others wait for the
//!   next update (without speculation, their position cannot move).
//!
//! A row that cannot get its slots (the reservation makes this unreachable)
//! is cancelled and its request preempted.

use super::Scheduler;
use super::record::Flight;
use crate::request::{PlanFix, RequestId, UpdateResult};

/// Which pending plan `reconcile_plan` works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    /// The plan right after the step just updated.
    Next,
    /// The plan after that one (two-step overlap).
    Later,
}

impl Scheduler {
    /// The running slot of a row of the pending plan, when its request is still
    /// running on the KV sequence the row was planned on; otherwise the row is
    /// cancelled (its request finished, was aborted or preempted) and its
    /// request, if still live, stops counting it in flight.
    fn pending_live(&mut self, slot: u32, id: RequestId, epoch: u32, samples: bool) -> Option<u32> {
        // Same epoch and running: the KV sequence the row was planned on.
        let loc = self.find_row(slot, id, epoch);
        if let Some(l) = loc
            && !l.parked
        {
            return Some(l.slot);
        }
        if let Some(r) = loc.and_then(|l| self.get_mut(l)) {
            r.inflight = r.inflight.saturating_sub(1);
            r.sampling_rows = r.sampling_rows.saturating_sub(u8::from(samples));
        }
        None
    }

    /// Reconcile the plans still pending after an update (see the module
    /// docs): the next one, whose fixes go to `res.fixes`, then the one after
    /// it, if any, whose fixes go to `res.later_fixes`.
    pub(super) fn reconcile_pending(&mut self, res: &mut UpdateResult) {
        let Some(mut next) = self.flights.pop_front() else {
            return;
        };
        self.reconcile_plan(&mut next, Pending::Next, &mut res.fixes, &mut res.preempted);
        if let Some(mut later) = self.flights.pop_front() {
            self.reconcile_plan(
                &mut later,
                Pending::Later,
                &mut res.later_fixes,
                &mut res.preempted,
            );
            self.flights.push_front(later);
        }
        self.flights.push_front(next);
    }

    /// Cancel the rows of the pending plan `flight` whose requests are gone,
    /// and materialise its provisional rows whose input is known, reporting
    /// both in `fixes` (requests preempted on the way go to `preempted`).
    /// Afterwards the plan's token count, live-row count and reservations
    /// cover only its live rows still provisional, and `pending_reserve`
    /// agrees.
    fn reconcile_plan(
        &mut self,
        flight: &mut Flight,
        which: Pending,
        fixes: &mut Vec<PlanFix>,
        preempted: &mut Vec<RequestId>,
    ) {
        if which == Pending::Next {
            // Its reservations are used now, as a whole (before any row takes
            // blocks); the later plan's stay until its rows are settled.
            self.pending_reserve -= flight.reserved;
            flight.reserved = 0;
        }
        let mut removed = 0;
        for fr in flight.prefill.iter_mut().filter(|f| !f.cancelled) {
            if self
                .pending_live(fr.slot, fr.id, fr.epoch, fr.samples)
                .is_none()
            {
                fr.cancelled = true;
                removed += fr.len;
                fixes.push(PlanFix::Cancel(fr.id));
            }
        }
        for fr in flight.rows.iter_mut().filter(|f| !f.cancelled) {
            let drafts = fr.drafts as usize;
            // The blocks the row reserved, released once it is cancelled or
            // materialised (the next plan's went as a whole).
            let reserved = match which {
                Pending::Next => 0,
                Pending::Later => usize::from(fr.reserved),
            };
            let Some(slot) = self.pending_live(fr.slot, fr.id, fr.epoch, true) else {
                fr.cancelled = true;
                flight.cancelled_rows += 1;
                removed += 1 + drafts;
                flight.reserved -= reserved;
                self.pending_reserve -= reserved;
                fixes.push(PlanFix::Cancel(fr.id));
                continue;
            };
            // A provisional row of the later plan has its input known only
            // when its request has no other sampling row in flight (nothing
            // for it in the plan between); then it is materialised now, or
            // the next plan would schedule that input a second time.
            let input_known = which == Pending::Next || self.req(slot).sampling_rows == 1;
            if !fr.provisional || !input_known {
                continue;
            }
            flight.reserved -= reserved;
            self.pending_reserve -= reserved;
            // The input is the last token so far.
            let known = self.req(slot).tokens.len();
            let position = known - 1;
            if self.append_rows(slot, drafts, self.pending_reserve) {
                self.req_mut(slot).scheduled = known as u32;
                fr.provisional = false;
                if which == Pending::Later || position != fr.position as usize {
                    fr.position = position as u32;
                    fixes.push(PlanFix::Position {
                        request: fr.id,
                        position,
                    });
                }
            } else {
                // The reservation should make this unreachable; stay safe anyway.
                fr.cancelled = true;
                flight.cancelled_rows += 1;
                removed += 1 + drafts;
                fixes.push(PlanFix::Cancel(fr.id));
                self.preempt_for_cancelled_row(slot, preempted);
            }
        }
        flight.num_tokens -= removed;
    }
}
