//! Chunked prefill under the token and time budgets.
//!
//! A prefill chunk is at most `max_chunk_tokens` and the step's rows left;
//! with a time budget and a cost model, it is the largest chunk whose
//! predicted time (`a·q·(q + c) + b·(q + c)`, `c` the tokens before it, plus
//! `e` for its sampling row when it ends the prompt) fits what the rows
//! planned before it (decode rows charged their output rows too) left of the
//! budget. A
//! step that would otherwise be empty still prefills `min_chunk_tokens`
//! (within the same caps), so a prompt always makes progress. Without
//! `chunked_prefill`, a waiting prompt that fits one step is admitted whole or
//! waits.

use super::Scheduler;
use super::record::FlightRow;
use super::step::StepState;
use crate::request::StepPlan;

impl Scheduler {
    /// Chunk length for a prefill from `start` with `remaining` tokens left.
    pub(super) fn chunk_len(
        &self,
        start: usize,
        remaining: usize,
        tokens_left: usize,
        time_left: f64,
        step_empty: bool,
    ) -> usize {
        let cap = remaining.min(self.cfg.max_chunk_tokens).min(tokens_left);
        if cap == 0 || self.cfg.step_time_budget.is_none() {
            return cap;
        }
        let Some(c) = &self.cost else { return cap };
        let q = c
            .coefficients()
            .max_chunk_of(start, remaining, time_left, cap);
        if q == 0 && step_empty {
            // Progress floor: a budget too small for anything still moves the prompt.
            return self.cfg.min_chunk_tokens.min(cap);
        }
        q
    }

    /// The first chunk of a request being admitted, whose KV sequence holds
    /// `reused` cached tokens of its `known`; 0 when it must wait.
    pub(super) fn admission_chunk(&self, reused: usize, known: usize, st: &StepState) -> usize {
        let remaining = known - reused;
        let q = self.chunk_len(
            reused,
            remaining,
            st.tokens_left,
            st.chunk_time_left(),
            st.is_empty(),
        );
        // Without chunking a prompt waits until it fits whole; one that can
        // never fit a step (or a long recompute after preemption) is chunked anyway.
        let whole_fits = remaining
            <= self
                .cfg
                .max_num_batched_tokens
                .min(self.cfg.max_chunk_tokens);
        if !self.cfg.chunked_prefill && q < remaining && whole_fits {
            0
        } else {
            q
        }
    }

    /// The next prefill (or recompute) chunk of the running request in
    /// `slot`, whose history runs more than one token past `scheduled`; none
    /// when the budgets leave no room.
    pub(super) fn plan_running_chunk(
        &mut self,
        slot: u32,
        plan: &mut StepPlan,
        st: &mut StepState,
    ) {
        let r = self.req(slot);
        let known = r.tokens.len();
        let start = r.scheduled as usize;
        let q = self.chunk_len(
            start,
            known - start,
            st.tokens_left,
            st.chunk_time_left(),
            st.is_empty(),
        );
        if q == 0 {
            return;
        }
        let epoch = r.epoch;
        let id = r.id;
        let samples = start + q == known;
        let r = self.req_mut(slot);
        r.scheduled += q as u32;
        r.inflight += 1;
        r.sampling_rows += u8::from(samples);
        st.add_chunk(
            plan,
            FlightRow {
                slot,
                epoch,
                id,
                start,
                len: q,
                samples,
                cancelled: false,
            },
        );
    }
}
