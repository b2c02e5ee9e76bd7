//! Submitting, aborting and forking requests.
//!
//! A submitted request is valid (new id, non-empty prompt, `max_new_tokens`
//! above 0, a prompt that leaves room for one sampled token within the
//! context limit and the pool) or is refused without changing anything; an
//! accepted one waits, with an arrival number that orders it within its
//! priority.

use super::Scheduler;
use super::kv_slots::{div_ceil, sync_kv};
use super::record::{Phase, Req};
use super::slab::slab_mut;
use crate::error::SchedError;
use crate::request::{FinishReason, Finished, NewRequest, RequestId};

impl Scheduler {
    fn validate(&self, r: &NewRequest) -> Result<(), SchedError> {
        if self.ids.contains_key(&r.id) {
            return Err(SchedError::DuplicateRequest(r.id));
        }
        if r.prompt.is_empty() {
            return Err(SchedError::EmptyPrompt(r.id));
        }
        if r.max_new_tokens == 0 {
            return Err(SchedError::InvalidConfig(format!(
                "request {}: max_new_tokens is 0",
                r.id
            )));
        }
        if r.prompt.len() >= self.cfg.max_model_len {
            return Err(SchedError::PromptTooLong {
                id: r.id,
                len: r.prompt.len(),
                limit: self.cfg.max_model_len,
            });
        }
        let bs = self.kv.block_size();
        let pool_tokens = self.kv.config().num_blocks * bs;
        // The prompt plus the first sampled token must fit the pool.
        if div_ceil(r.prompt.len() + 1, bs) > self.kv.config().num_blocks {
            return Err(SchedError::PromptExceedsPool {
                id: r.id,
                len: r.prompt.len(),
                pool_tokens,
            });
        }
        if r.prompt.len() >= self.max_len {
            return Err(SchedError::PromptTooLong {
                id: r.id,
                len: r.prompt.len(),
                limit: self.max_len,
            });
        }
        Ok(())
    }

    /// Submit one request.
    pub fn add_request(&mut self, r: NewRequest) -> Result<(), SchedError> {
        self.validate(&r)?;
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        let prompt_len = r.prompt.len();
        let req = Req {
            id: r.id,
            prompt_len,
            tokens: r.prompt,
            max_new_tokens: r.max_new_tokens,
            limit: (prompt_len.saturating_add(r.max_new_tokens)).min(self.max_len) as u32,
            has_stops: !r.stop_tokens.is_empty(),
            has_confs: false,
            stop_tokens: r.stop_tokens,
            priority: r.priority,
            arrival,
            phase: Phase::Waiting,
            incarnation: 0,
            scheduled: 0,
            kv_len: 0,
            kv_drafts: 0,
            kv: None,
            kv_room: 0,
            kv_synced: 0,
            next_full: 0,
            epoch: 0,
            inflight: 0,
            sampling_rows: 0,
            confidences: Vec::new(),
            preempted_before: false,
        };
        let loc = self.place(req, true);
        self.push_waiting(loc.slot);
        Ok(())
    }

    /// Submit a batch: each request is accepted or rejected on its own.
    pub fn add_requests(
        &mut self,
        batch: impl IntoIterator<Item = NewRequest>,
    ) -> Vec<Result<(), SchedError>> {
        batch.into_iter().map(|r| self.add_request(r)).collect()
    }

    /// Abort a request at any moment; returns what it generated so far. Its
    /// rows in flight are ignored when their output arrives; a pending plan's
    /// rows for it are cancelled by the next `update`.
    pub fn abort(&mut self, id: RequestId) -> Result<Finished, SchedError> {
        let loc = *self.ids.get(&id).ok_or(SchedError::UnknownRequest(id))?;
        if loc.parked {
            // Its queue entry goes stale (the slot holds no request of this
            // arrival) and is skipped.
            self.num_waiting -= 1;
        } else if let Some(i) = self.running.iter().position(|&s| s == loc.slot) {
            self.running.remove(i);
        }
        let mut r = self.release(loc);
        Self::free_kv(&mut self.kv, &mut r);
        self.stats.finished += 1;
        self.pending_aborted.push(id);
        Ok(Finished {
            id,
            reason: FinishReason::Aborted,
            tokens: std::mem::take(&mut r.tokens),
            prompt_len: r.prompt_len,
        })
    }

    /// Fork a running request into a new one (parallel sampling, beam search): the
    /// child shares every full block; the partly filled last block is copied (the
    /// copy is reported in the next plan's `block_copies`). The parent must not be
    /// in flight.
    pub fn fork(&mut self, parent: RequestId, child: RequestId) -> Result<(), SchedError> {
        let ploc = *self
            .ids
            .get(&parent)
            .ok_or(SchedError::UnknownRequest(parent))?;
        if self.ids.contains_key(&child) {
            return Err(SchedError::DuplicateRequest(child));
        }
        let ok = !ploc.parked
            && self
                .get(ploc)
                .is_some_and(|p| p.phase == Phase::Running && p.inflight == 0 && p.kv_drafts == 0);
        if !ok {
            return Err(SchedError::InvalidConfig(format!(
                "request {parent} can be forked only while running and not in flight"
            )));
        }
        // The manager's copy of the parent's tokens must be complete before it is shared.
        if let Some(p) = slab_mut(&mut self.slots, &mut self.parked, ploc) {
            sync_kv(&mut self.kv, p)?;
        }
        let copy = self.kv.fork(parent, child)?;
        let mut c = self.req(ploc.slot).clone();
        c.id = child;
        c.arrival = self.next_arrival;
        self.next_arrival += 1;
        c.incarnation = 0;
        c.kv = self.kv.handle(child).ok();
        let loc = self.place(c, false);
        self.insert_running(loc.slot);
        self.pending_copies.extend(copy);
        Ok(())
    }
}
