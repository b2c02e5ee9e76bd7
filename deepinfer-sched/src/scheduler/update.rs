//! Applying a step's output: `update`.
//!
//! `update` takes the output of the oldest step in flight. The output is
//! checked against the step's rows before anything changes, so a bad output
//! is rejected whole. Then each live row group's sampled tokens join its
//! request's history, up to the first stop token, `max_new_tokens` or the
//! context limit; accepted drafts are committed in the block manager under
//! the ids the engine reports and rejected ones rolled back; blocks that
//! filled are reported computed (so the prefix cache can serve them);
//! finished requests are freed and reported; the cost model and the draft
//! planner learn from `step_ms`; and the plans still pending are reconciled
//! (see `overlap`). Rows of requests aborted, finished or preempted since
//! they were planned are skipped.

use super::Scheduler;
use super::kv_slots::{next_block_end, room_after, sync_kv};
use super::record::{DecodeFlight, Flight, FlightRow, Req};
use super::retire::remove_finished;
use super::slab::{Loc, slab_mut};
use super::steady_rows::{dense_steady_rows, queue_full_block};
use crate::cost_model::StepSample;
use crate::error::SchedError;
use crate::request::{FinishReason, Finished, RequestId, RowOutput, StepOutput, UpdateResult};

/// Read positions in a [`StepOutput`]'s flat buffers.
#[derive(Debug, Default)]
struct OutCursor {
    row: usize,
    tok: usize,
    conf: usize,
}

impl OutCursor {
    /// The next row group of a checked output with its tokens and confidences.
    #[inline(always)]
    fn next<'a>(&mut self, out: &'a StepOutput) -> (RowOutput, &'a [u32], &'a [f64]) {
        let o = out.rows[self.row];
        self.row += 1;
        let nt = o.num_tokens as usize;
        let toks = &out.tokens[self.tok..self.tok + nt];
        self.tok += nt;
        let nc = o.num_confidences as usize;
        let confs = &out.confidences[self.conf..self.conf + nc];
        self.conf += nc;
        (o, toks, confs)
    }
}

/// Whether `out` answers `flight`: its step, one row group per live row in
/// plan order (prefill chunks, then decode rows, unless the decode rows are
/// answered in the dense form), each of its request with a token count the
/// row allows, and flat buffers that hold exactly the counts.
fn check_output(flight: &Flight, out: &StepOutput) -> Result<(), SchedError> {
    if out.step != flight.step {
        return Err(SchedError::OutputMismatch(format!(
            "output of step {} but step {} is oldest in flight",
            out.step, flight.step
        )));
    }
    let dense = !out.decode_tokens.is_empty();
    let (mut j, mut ntok, mut nconf) = (0usize, 0usize, 0usize);
    let mut check = |id: RequestId, min: usize, max: usize| {
        let Some(o) = out.rows.get(j) else {
            return Err(SchedError::OutputMismatch(format!(
                "{} row groups for a plan of more",
                out.rows.len()
            )));
        };
        let n = o.num_tokens as usize;
        if o.request != id || n < min || n > max {
            return Err(SchedError::OutputMismatch(format!(
                "row {j} expected request {id} with {min}..={max} tokens, got {} with {n}",
                o.request
            )));
        }
        ntok += n;
        nconf += o.num_confidences as usize;
        j += 1;
        Ok(())
    };
    for fr in flight.prefill.iter().filter(|f| !f.cancelled) {
        let n = usize::from(fr.samples);
        check(fr.id, n, n)?;
    }
    if dense {
        let live = flight.rows.len() - flight.cancelled_rows;
        debug_assert_eq!(live, flight.rows.iter().filter(|f| !f.cancelled).count());
        if live != out.decode_tokens.len() {
            return Err(SchedError::OutputMismatch(format!(
                "{} dense decode tokens for a plan of {live} decode rows",
                out.decode_tokens.len()
            )));
        }
    } else {
        for fr in flight.rows.iter().filter(|f| !f.cancelled) {
            check(fr.id, 1, 1 + fr.drafts as usize)?;
        }
    }
    if out.rows.len() != j {
        return Err(SchedError::OutputMismatch(format!(
            "{} row groups for a plan of {j}",
            out.rows.len()
        )));
    }
    if ntok != out.tokens.len() || nconf != out.confidences.len() {
        return Err(SchedError::OutputMismatch(
            "row counts do not match the flat buffers".into(),
        ));
    }
    Ok(())
}

/// Appends a row group's sampled tokens to its request's history, up to the
/// first stop, the token limit or the context limit; the reason when the
/// request is done.
#[inline(always)]
fn take_sampled(r: &mut Req, toks: &[u32], confs: &[f64], stop: bool) -> Option<FinishReason> {
    if toks.is_empty() {
        return None;
    }
    if r.has_confs || !confs.is_empty() {
        r.confidences.clear();
        r.confidences.extend_from_slice(confs);
        r.has_confs = !confs.is_empty();
    }
    for &t in toks {
        r.tokens.push(t);
        if r.has_stops && r.stop_tokens.contains(&t) {
            return Some(FinishReason::Stop);
        }
        if r.tokens.len() >= r.limit as usize {
            return Some(FinishReason::Length);
        }
    }
    stop.then_some(FinishReason::Stop)
}

impl Scheduler {
    /// Feed the output of the oldest step in flight: append tokens, check stops,
    /// commit accepted drafts and roll back rejected ones, free finished requests,
    /// refit the cost models, and reconcile the plan still pending (if any).
    pub fn update(&mut self, out: &StepOutput) -> Result<UpdateResult, SchedError> {
        let flight = self.flights.front().ok_or(SchedError::NoStepInFlight)?;
        // Check every row before changing anything, so a bad output is rejected whole.
        check_output(flight, out)?;
        let Some(flight) = self.flights.pop_front() else {
            return Err(SchedError::NoStepInFlight);
        };
        let mut res = UpdateResult::default();
        let mut cur = OutCursor::default();
        // Left over only if an earlier update failed half way.
        self.computed_pending.clear();
        let mut any_finished = false;
        for fr in flight.prefill.iter().filter(|f| !f.cancelled) {
            let (o, toks, confs) = cur.next(out);
            any_finished |= self.apply_prefill(fr, toks, confs, o.stop, &mut res)?;
        }
        if out.decode_tokens.is_empty() {
            for (j, fr) in flight.rows.iter().enumerate().filter(|(_, f)| !f.cancelled) {
                let (o, toks, confs) = cur.next(out);
                any_finished |= self.apply_decode(fr, toks, confs, o.stop, j as u32, &mut res)?;
            }
        } else {
            any_finished |= self.apply_dense_decode(&flight.rows, &out.decode_tokens, &mut res)?;
        }
        self.flush_computed()?;
        if any_finished {
            remove_finished(&mut self.running, &self.finished, &mut self.finished_pos);
            self.finished.clear();
        }
        self.learn_step_time(&flight, out.step_ms)?;
        if self.spare_rows.len() < 2 {
            let Flight {
                mut prefill,
                mut rows,
                ..
            } = flight;
            prefill.clear();
            rows.clear();
            self.spare_rows.push((prefill, rows));
        }
        self.reconcile_pending(&mut res);
        Ok(res)
    }

    /// Applies the dense form of a step's decode output: one token per live
    /// row of `rows`, in row order. Runs of steady rows go through a tight
    /// loop (`dense_steady_rows`); a steady row whose token stops its request
    /// is finished here, any other row goes through `apply_decode`. True when
    /// a running request finished.
    fn apply_dense_decode(
        &mut self,
        rows: &[DecodeFlight],
        toks: &[u32],
        res: &mut UpdateResult,
    ) -> Result<bool, SchedError> {
        let bs = self.kv.block_size();
        let mut any_finished = false;
        let (mut j, mut ti) = (0, 0);
        loop {
            (j, ti) = dense_steady_rows(
                rows,
                toks,
                &mut self.slots,
                bs,
                j,
                ti,
                &mut self.computed_pending,
            );
            let Some(fr) = rows.get(j) else { break };
            // (The row's index: where its request probably is in `running`.)
            let hint = j as u32;
            j += 1;
            if fr.cancelled {
                continue;
            }
            let Some(&t) = toks.get(ti) else { break };
            ti += 1;
            // Steady case: the request still runs on the row's KV sequence and
            // nothing speculative is pending, so the token only extends the
            // history (and, once per block, reports the block computed).
            // (A running record of the row's epoch is on the row's KV sequence.)
            if let Some(r) = self.slots.get_mut(fr.slot as usize)
                && r.epoch == fr.epoch
                && fr.drafts == 0
                && r.kv_drafts == 0
                && !r.has_confs
            {
                r.inflight -= 1;
                r.sampling_rows -= 1;
                if r.kv_len >= r.next_full {
                    // Reported in one batch after the walk (see `flush_computed`).
                    queue_full_block(r, fr.slot, bs, &mut self.computed_pending);
                }
                r.tokens.push(t);
                let reason = if r.has_stops && r.stop_tokens.contains(&t) {
                    Some(FinishReason::Stop)
                } else if r.tokens.len() >= r.limit as usize {
                    Some(FinishReason::Length)
                } else {
                    None
                };
                if let Some(reason) = reason {
                    let loc = Loc {
                        slot: fr.slot,
                        parked: false,
                    };
                    any_finished |= self.finish(loc, reason, hint, res);
                }
                continue;
            }
            any_finished |=
                self.apply_decode(fr, std::slice::from_ref(&t), &[], false, hint, res)?;
        }
        Ok(any_finished)
    }

    /// The cost model and the draft planner learn from the measured time of
    /// `flight`, if the engine reported one.
    fn learn_step_time(&mut self, flight: &Flight, step_ms: Option<f64>) -> Result<(), SchedError> {
        let Some(ms) = step_ms else {
            return Ok(());
        };
        if let Some(c) = self.cost.as_mut() {
            c.observe(StepSample {
                features: flight.features,
                time: ms,
            })?;
        }
        if let Some(p) = self.planner.as_mut()
            && flight.num_tokens > 0
        {
            let _ = p.observe(flight.num_tokens, ms);
        }
        Ok(())
    }

    /// Applies a prefill chunk's result (see `update`); true when a running
    /// request finished (it is queued in `finished`).
    fn apply_prefill(
        &mut self,
        fr: &FlightRow,
        toks: &[u32],
        confs: &[f64],
        stop: bool,
        res: &mut UpdateResult,
    ) -> Result<bool, SchedError> {
        // Aborted meanwhile (slot freed or reused by another request): ignore.
        let Some(loc) = self.find_row(fr.slot, fr.id, fr.epoch) else {
            return Ok(false);
        };
        let Some(r) = slab_mut(&mut self.slots, &mut self.parked, loc) else {
            return Ok(false);
        };
        r.inflight -= 1;
        r.sampling_rows -= u8::from(fr.samples);
        // Still the KV sequence the row was planned on (running, not preempted
        // since: the epochs match).
        if let Some(h) = r.kv.filter(|_| !loc.parked) {
            sync_kv(&mut self.kv, r)?;
            self.kv
                .mark_computed_with(h, fr.start + fr.len, &r.tokens)?;
        }
        Ok(match take_sampled(r, toks, confs, stop) {
            None => false,
            Some(reason) => self.finish(loc, reason, u32::MAX, res),
        })
    }

    /// Applies a decode row's result (see `update`); true when a running request
    /// finished (it is queued in `finished`, with the row's index `hint`).
    #[inline(always)]
    fn apply_decode(
        &mut self,
        fr: &DecodeFlight,
        toks: &[u32],
        confs: &[f64],
        stop: bool,
        hint: u32,
        res: &mut UpdateResult,
    ) -> Result<bool, SchedError> {
        let Some(loc) = self.find_row(fr.slot, fr.id, fr.epoch) else {
            return Ok(false);
        };
        let Some(r) = slab_mut(&mut self.slots, &mut self.parked, loc) else {
            return Ok(false);
        };
        r.inflight -= 1;
        r.sampling_rows -= 1;
        let mut mark = None;
        if let Some(h) = r.kv.filter(|_| !loc.parked) {
            let accepted = toks.len().saturating_sub(1).min(fr.drafts as usize);
            if r.kv_drafts > 0 {
                // Accepted drafts keep their slots and get their real ids;
                // the rest are rolled back.
                let bs = self.kv.block_size();
                let n = accepted.min(r.kv_drafts as usize);
                if let Some(c) = self.kv.commit_drafts(r.id, &toks[..n])? {
                    self.pending_copies.push(c);
                }
                // The manager holds the committed tokens and these `n` now.
                r.kv_synced = r.kv_len as usize + n;
                r.kv_room = room_after(r.kv_len as usize + n, bs);
                r.kv_drafts = 0;
            }
            r.kv_len += accepted as u32;
            // Accepted drafts were computed by this step.
            r.scheduled += accepted as u32;
            // Only full blocks become cacheable: tell the manager when one fills
            // (once the history holds the accepted drafts it hashes them from).
            if r.kv_len >= r.next_full {
                mark = Some(h);
                r.next_full = next_block_end(r.kv_len as usize, self.kv.block_size());
            }
        }
        let reason = take_sampled(r, toks, confs, stop);
        if let Some(h) = mark {
            sync_kv(&mut self.kv, r)?;
            self.kv.mark_computed_with(h, r.kv_synced, &r.tokens)?;
        }
        Ok(match reason {
            None => false,
            Some(reason) => self.finish(loc, reason, hint, res),
        })
    }

    /// A request finished with a step's output: free it and report it; true
    /// when it was running (it is then queued in `finished`, with `hint`, its
    /// probable place in `running`, or `u32::MAX`).
    #[cold]
    #[inline(never)]
    fn finish(
        &mut self,
        loc: Loc,
        reason: FinishReason,
        hint: u32,
        res: &mut UpdateResult,
    ) -> bool {
        // Its filled blocks are reported (and cached) before its sequence goes.
        // (Cannot fail: every handle in the batch is live.)
        let flushed = self.flush_computed();
        debug_assert!(flushed.is_ok(), "{flushed:?}");
        let mut r = self.release(loc);
        Self::free_kv(&mut self.kv, &mut r);
        if loc.parked {
            // Preempted while in flight: its queue entry goes stale.
            self.num_waiting -= 1;
        } else {
            // Taken out of `running` after the walk (`remove_finished`).
            self.finished.push((loc.slot, hint));
        }
        self.stats.finished += 1;
        res.finished.push(Finished {
            id: r.id,
            reason,
            tokens: std::mem::take(&mut r.tokens),
            prompt_len: r.prompt_len,
        });
        !loc.parked
    }
}
