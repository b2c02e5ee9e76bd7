//! Planning one step: `schedule_into` and its phases over the running list.
//!
//! A step is planned in this order, and each phase only spends what the
//! earlier ones left of the step's budgets (rows, sequences, free blocks,
//! time):
//!
//! 1. the draft rows per running request (`plan_drafts`);
//! 2. the running requests, in (priority, arrival) order: runs of steady
//!    decode rows in a tight loop, prefill chunks of requests still
//!    prefilling, and the other decode rows (drafts, provisional rows), which
//!    preempt the end of the running list when blocks run out;
//! 3. the blocks counted for steady rows that start one (`flush_grow`);
//! 4. waiting requests, while the budgets last and no request was preempted
//!    (see `admission`);
//! 5. the step goes in flight, with the blocks its provisional rows reserve.
//!
//! With steps in flight this is overlapped scheduling: a request whose next
//! input is still being sampled gets a provisional decode row (its blocks
//! reserved, not appended), fixed by the `update` of the step before. A
//! provisional row on a provisional row is planned only without speculation,
//! so every row in flight adds exactly one token and its position is known.
//! At most three steps are in flight.

use super::Scheduler;
use super::config::SpecMode;
use super::kv_slots::blocks_to_grow;
use super::record::{DecodeFlight, Flight, FlightRow, Req};
use super::steady_rows::{prefetch_record, steady_decode_rows};
use crate::cost_model::{CostCoefficients, StepFeatures};
use crate::error::SchedError;
use crate::request::{DecodeRow, PrefillChunk, StepPlan};

/// Most drafts of one decode row (its record keeps them, and the blocks they
/// reserve, in 16 bits).
const MAX_DRAFTS: usize = u16::MAX as usize - 1;

/// What the step being planned has left of its budgets, and its rows so far.
#[derive(Debug)]
pub(super) struct StepState {
    pub(super) tokens_left: usize,
    pub(super) seqs_left: usize,
    /// Blocks promised to provisional rows materialised at the next update.
    /// (Those of the plans still pending count too: see `pending_reserve`.)
    pub(super) reserved_blocks: usize,
    /// Blocks promised to steady rows that start a block, allocated in one
    /// batch after the walk (see `flush_grow`).
    pending_grow: usize,
    /// Time budget left after the chunks planned (infinite without a budget
    /// and a cost model); the decode rows are charged from `dec_quad`,
    /// `dec_lin` and `dec_out`.
    time_left: f64,
    pub(super) coef: Option<CostCoefficients>,
    /// Σ q·(q + c), Σ (q + c) and the output rows (each row of a decode row,
    /// drafts included) of the decode rows: integer sums, folded into the
    /// features, and charged to the time left, when needed.
    dec_quad: u64,
    dec_lin: u64,
    dec_out: u64,
    features: StepFeatures,
    prefill_rows: Vec<FlightRow>,
    decode_rows: Vec<DecodeFlight>,
}

impl StepState {
    /// A step with these budgets left, `features` and rows so far: `time` is the time left
    /// and the coefficients it is charged with, `rows` the prefill and decode rows.
    fn new(
        tokens_left: usize,
        seqs_left: usize,
        reserved_blocks: usize,
        time: (f64, Option<CostCoefficients>),
        features: StepFeatures,
        rows: (Vec<FlightRow>, Vec<DecodeFlight>),
    ) -> Self {
        StepState {
            tokens_left,
            seqs_left,
            reserved_blocks,
            pending_grow: 0,
            time_left: time.0,
            coef: time.1,
            dec_quad: 0,
            dec_lin: 0,
            dec_out: 0,
            features,
            prefill_rows: rows.0,
            decode_rows: rows.1,
        }
    }

    /// Time left for the next prefill chunk, the decode rows so far charged.
    pub(super) fn chunk_time_left(&self) -> f64 {
        let dec_cost = self.coef.map_or(0.0, |c| {
            c.a * self.dec_quad as f64 + c.b * self.dec_lin as f64 + c.e * self.dec_out as f64
        });
        self.time_left - dec_cost
    }

    /// Whether the step has no row yet.
    pub(super) fn is_empty(&self) -> bool {
        self.prefill_rows.is_empty() && self.decode_rows.is_empty()
    }

    /// Add a prefill chunk to the plan and the flight, and charge it to the
    /// budgets (its tokens, one sequence, its predicted time: its sampling
    /// row, if it samples, is an output row).
    pub(super) fn add_chunk(&mut self, plan: &mut StepPlan, fr: FlightRow) {
        self.features.add(fr.len, fr.start);
        let out = usize::from(fr.samples);
        self.features.add_outputs(out);
        if let Some(c) = self.coef {
            self.time_left -= c.chunk(fr.len, fr.start) + c.e * out as f64;
        }
        self.tokens_left -= fr.len;
        self.seqs_left -= 1;
        plan.prefill.push(PrefillChunk {
            request: fr.id,
            start: fr.start,
            len: fr.len,
            samples: fr.samples,
        });
        self.prefill_rows.push(fr);
    }
}

/// What planning a running request's decode row did.
enum DecodeOutcome {
    /// The row is planned, or the request has none this step.
    Done,
    /// Out of blocks, another request was preempted: plan this one again.
    Retry,
    /// Out of blocks, this request was preempted: the running list is done.
    Stop,
}

impl Scheduler {
    /// Plan the next step. With one step in flight this is overlapped
    /// scheduling: requests whose next input is being sampled get provisional
    /// decode rows, fixed by the `update` of the step in flight.
    pub fn schedule(&mut self) -> Result<StepPlan, SchedError> {
        let mut plan = StepPlan::default();
        self.schedule_into(&mut plan)?;
        Ok(plan)
    }

    /// [`Scheduler::schedule`] into a plan whose vectors are reused (cleared
    /// first), so a steady decode loop allocates nothing per step.
    pub fn schedule_into(&mut self, plan: &mut StepPlan) -> Result<(), SchedError> {
        if self.flights.len() >= 3 {
            return Err(SchedError::TooManyInFlight);
        }
        let step = self.next_step;
        self.next_step += 1;
        self.stats.steps += 1;
        let mut st = self.begin_step(step, plan);
        self.plan_drafts();
        self.compact_if_scattered();
        self.plan_running(plan, &mut st);
        self.flush_grow()?;
        self.admit_waiting(plan, &mut st)?;
        self.push_flight(step, plan, st);
        Ok(())
    }

    /// Admit waiting requests into `plan`, the step planned last, which the engine has
    /// not launched yet: a request that arrived after that plan was made joins it while
    /// its budgets (rows, sequences, blocks, time) last, under the same admission rules
    /// as in [`Scheduler::schedule_into`], instead of waiting for the plan after it.
    /// Returns how many requests were admitted. An engine overlapping its host work with
    /// the device calls this when a request arrives while a step computes.
    pub fn admit_into_planned(&mut self, plan: &mut StepPlan) -> Result<usize, SchedError> {
        match self.flights.back() {
            None => return Err(SchedError::NoStepInFlight),
            Some(f) if f.step != plan.step => {
                return Err(SchedError::OutputMismatch(format!(
                    "step {} is not the last planned ({})",
                    plan.step, f.step
                )));
            }
            Some(_) => {}
        }
        if self.num_waiting == 0 || !plan.preempted.is_empty() {
            return Ok(0);
        }
        let Some(mut flight) = self.flights.pop_back() else {
            return Err(SchedError::NoStepInFlight);
        };
        let coef = self.cost.as_ref().map(|c| c.coefficients());
        let time_left = match (self.cfg.step_time_budget, coef) {
            (Some(t), Some(c)) => t - c.step(&flight.features),
            _ => f64::INFINITY,
        };
        let rows = flight.prefill.len() + flight.rows.len();
        let mut st = StepState::new(
            self.cfg
                .max_num_batched_tokens
                .saturating_sub(flight.num_tokens),
            self.cfg.max_num_seqs.saturating_sub(rows),
            self.pending_reserve,
            (time_left, coef),
            flight.features,
            (std::mem::take(&mut flight.prefill), Vec::new()),
        );
        let before = st.prefill_rows.len();
        let admitted = self.admit_waiting(plan, &mut st);
        let added = st.prefill_rows.len() - before;
        let new_tokens: usize = st.prefill_rows[before..].iter().map(|r| r.len).sum();
        flight.prefill = st.prefill_rows;
        flight.features = st.features;
        flight.num_tokens += new_tokens;
        plan.num_tokens += new_tokens;
        if added > 0 {
            plan.predicted_ms = coef.map(|c| c.step(&flight.features));
        }
        self.flights.push_back(flight);
        admitted.map(|()| added)
    }

    /// Start step `step`: the plan is cleared (keeping its vectors) and takes
    /// the block copies and aborts reported since the last plan; the budgets
    /// are full but for the blocks the pending plans reserve.
    fn begin_step(&mut self, step: u64, plan: &mut StepPlan) -> StepState {
        plan.step = step;
        plan.prefill.clear();
        plan.decode.clear();
        plan.block_copies.clear();
        plan.block_copies.append(&mut self.pending_copies);
        plan.aborted.clear();
        plan.aborted.append(&mut self.pending_aborted);
        plan.preempted.clear();
        plan.num_tokens = 0;
        plan.predicted_ms = None;
        let (prefill_rows, mut decode_rows) = self.spare_rows.pop().unwrap_or_default();
        decode_rows.reserve(self.running.len());
        self.grow_slots.clear();
        let time_budget = self.cfg.step_time_budget.filter(|_| self.cost.is_some());
        let coef = self.cost.as_ref().map(|c| c.coefficients());
        let time_left = match (time_budget, coef) {
            (Some(t), Some(c)) => t - c.d,
            _ => f64::INFINITY,
        };
        StepState::new(
            self.cfg.max_num_batched_tokens,
            self.cfg.max_num_seqs,
            self.pending_reserve,
            (time_left, coef),
            StepFeatures::default(),
            (prefill_rows, decode_rows),
        )
    }

    /// Every 16 steps: when more than an eighth of the running list is out of
    /// slot order, renumber the slab (amortised: one pass over the running
    /// requests every few dozen steps of steady decoding). The running order
    /// is unchanged, so `draft_plan` stays valid.
    fn compact_if_scattered(&mut self) {
        self.steps_since_compact += 1;
        if self.steps_since_compact >= 16 {
            self.steps_since_compact = 0;
            let n = self.running.len();
            let disorder = self.running.windows(2).filter(|w| w[1] != w[0] + 1).count();
            if n >= 2 && disorder * 8 >= n {
                self.compact_running();
            }
        }
    }

    /// Plan the running requests in priority / arrival order while the row
    /// and sequence budgets last: each gets its next prefill chunk or decode
    /// row, or nothing this step (its rows in flight must land first, or the
    /// budgets ran out). A decode row that finds no block preempts from the
    /// end of the running list; once it preempts its own request, the walk
    /// ends.
    fn plan_running(&mut self, plan: &mut StepPlan, st: &mut StepState) {
        let no_drafts = self.draft_plan.is_empty();
        let mut i = 0;
        while i < self.running.len() {
            if st.seqs_left == 0 || st.tokens_left == 0 {
                break;
            }
            if no_drafts && let Some(next) = self.plan_steady_run(i, plan, st) {
                i = next;
                continue;
            }
            // The record 8 rows on, so its misses overlap with this row's work.
            if let Some(&s8) = self.running.get(i + 8) {
                prefetch_record(&self.slots, s8);
            }
            let slot = self.running[i];
            let r = self.req(slot);
            if r.scheduled as usize + 1 < r.tokens.len() {
                self.plan_running_chunk(slot, plan, st);
                i += 1;
                continue;
            }
            match self.plan_decode_row(i, slot, plan, st) {
                DecodeOutcome::Done => i += 1,
                DecodeOutcome::Retry => {}
                DecodeOutcome::Stop => break,
            }
        }
    }

    /// The run of steady decode rows (input known, no drafts) from
    /// `running[i]`, planned in one tight loop (`steady_decode_rows`); where
    /// the run stopped, or `None` when it took no row. Blocks the rows start
    /// are counted against the free ones left after reservations and
    /// allocated after the walk (`flush_grow`).
    fn plan_steady_run(
        &mut self,
        i: usize,
        plan: &mut StepPlan,
        st: &mut StepState,
    ) -> Option<usize> {
        let free = self.kv.pool().num_free();
        if st.reserved_blocks + st.pending_grow > free {
            return None;
        }
        let mut grow_budget = free - st.reserved_blocks - st.pending_grow;
        let before = self.grow_slots.len();
        let (next, sum) = steady_decode_rows(
            &self.running,
            &mut self.slots,
            i,
            st.seqs_left.min(st.tokens_left),
            &mut st.decode_rows,
            &mut plan.decode,
            (
                self.kv.block_size(),
                &mut grow_budget,
                &mut self.grow_slots,
                &mut self.kv,
            ),
        );
        st.pending_grow += self.grow_slots.len() - before;
        if next == i {
            return None;
        }
        // One row each, no drafts: `q·(q + c)` and `q + c` agree.
        st.dec_quad += sum;
        st.dec_lin += sum;
        st.dec_out += (next - i) as u64;
        st.tokens_left -= next - i;
        st.seqs_left -= next - i;
        Some(next)
    }

    /// The decode row of the running request `running[i]` (in `slot`): its
    /// input at the end of the history, or, provisionally, after the tokens
    /// its rows in flight are still sampling; with its drafts, and its KV
    /// slots appended (input known) or reserved (provisional). Skipped while
    /// its rows in flight must land first.
    fn plan_decode_row(
        &mut self,
        i: usize,
        slot: u32,
        plan: &mut StepPlan,
        st: &mut StepState,
    ) -> DecodeOutcome {
        let r = self.req(slot);
        let known = r.tokens.len();
        let provisional = r.scheduled as usize == known;
        if provisional && r.sampling_rows == 0 {
            // Nothing to do until its rows in flight land (a non-sampling chunk).
            return DecodeOutcome::Done;
        }
        // A provisional row on a provisional row (two steps unconfirmed) only
        // without speculation, so every row in flight adds exactly one token
        // and the position is known whatever the engine answers.
        let depth2_ok = self.cfg.spec == SpecMode::Off && r.kv_drafts == 0;
        if provisional && (r.inflight > 2 || (r.inflight == 2 && !depth2_ok)) {
            return DecodeOutcome::Done;
        }
        // Decode row: input at `known - 1`, or (provisional) at the position after
        // the tokens the steps in flight are still sampling.
        let pending_tokens = usize::from(r.sampling_rows);
        let position = if provisional {
            known + pending_tokens - 1
        } else {
            known - 1
        };
        let k_plan = self.draft_plan.get(i).copied().unwrap_or(0);
        let k = if k_plan == 0 {
            0
        } else {
            let ahead = if provisional { pending_tokens } else { 0 };
            // (Capped so a row's drafts and reservation fit its record.)
            self.drafts_for(r, k_plan, ahead)
                .min(st.tokens_left - 1)
                .min(MAX_DRAFTS)
        };
        let id = r.id;
        let epoch = r.epoch;
        let Some(reserved_here) = self.decode_row_slots(slot, provisional, pending_tokens, k, st)
        else {
            // Out of blocks: preempt the lowest-priority newest request
            // (possibly this one) and retry.
            return if self.preempt_last(slot, &mut plan.preempted) {
                DecodeOutcome::Stop
            } else {
                DecodeOutcome::Retry
            };
        };
        let r = self.req_mut(slot);
        if !provisional {
            r.scheduled = known as u32;
        }
        r.inflight += 1;
        r.sampling_rows += 1;
        // Integer sums: folded into the features (and the time left) once.
        st.dec_quad += ((1 + k) * (1 + k + position)) as u64;
        st.dec_lin += (1 + k + position) as u64;
        st.dec_out += (1 + k) as u64;
        st.tokens_left -= 1 + k;
        st.seqs_left -= 1;
        st.decode_rows.push(DecodeFlight {
            id,
            position: position as u32,
            slot,
            epoch,
            drafts: k as u16,
            reserved: reserved_here as u16,
            provisional,
            cancelled: false,
        });
        plan.decode.push(DecodeRow {
            request: id,
            position,
            drafts: k,
            provisional,
        });
        DecodeOutcome::Done
    }

    /// KV slots for a decode row with `k` drafts: appended now when its input
    /// is known, else reserved against the free blocks (the row is
    /// materialised at the next update). The blocks reserved, or `None` when
    /// the free blocks (less those reserved or promised this step) fall short.
    fn decode_row_slots(
        &mut self,
        slot: u32,
        provisional: bool,
        pending_tokens: usize,
        k: usize,
        st: &mut StepState,
    ) -> Option<usize> {
        if !provisional {
            let ok = self.append_rows(slot, k, st.reserved_blocks + st.pending_grow);
            return ok.then_some(0);
        }
        // After the updates the sequence holds at most its current tokens
        // (drafts in flight included), the inputs of provisional rows not
        // yet materialised (one each, see `depth2_ok`), plus these rows.
        let r = self.req(slot);
        let bs = self.kv.block_size();
        let room = match pending_tokens - 1 {
            0 => r.kv_room as usize,
            _ if r.kv_room >= 1 => r.kv_room as usize - 1,
            _ => bs - 1,
        };
        let need = blocks_to_grow(room, 1 + k, bs);
        if need + st.reserved_blocks + st.pending_grow <= self.kv.pool().num_free() {
            st.reserved_blocks += need;
            Some(need)
        } else {
            None
        }
    }

    /// Put the planned step in flight: the decode rows' sums join its
    /// features, the plan gets its row count and predicted time, and the
    /// blocks its provisional rows reserve join `pending_reserve`.
    fn push_flight(&mut self, step: u64, plan: &mut StepPlan, st: StepState) {
        let StepState {
            tokens_left,
            reserved_blocks,
            coef,
            dec_quad,
            dec_lin,
            dec_out,
            mut features,
            prefill_rows,
            decode_rows,
            ..
        } = st;
        features.quad += dec_quad as f64;
        features.lin += dec_lin as f64;
        features.out_rows += dec_out as f64;
        plan.num_tokens = self.cfg.max_num_batched_tokens - tokens_left;
        plan.predicted_ms = coef.map(|c| c.step(&features));
        let reserved = reserved_blocks - self.pending_reserve;
        self.pending_reserve = reserved_blocks;
        self.flights.push_back(Flight {
            step,
            prefill: prefill_rows,
            rows: decode_rows,
            cancelled_rows: 0,
            features,
            num_tokens: plan.num_tokens,
            reserved,
        });
    }

    /// Drafts for a decode row, `ahead` tokens after the known history (the
    /// tokens still being sampled before a provisional row's input).
    fn drafts_for(&self, r: &Req, k_plan: usize, ahead: usize) -> usize {
        // Drafts past the token limit or the context are wasted rows.
        let left_new = r.max_new_tokens.saturating_sub(r.output_len() + ahead + 1);
        let left_ctx = self.max_len.saturating_sub(r.tokens.len() + ahead + 1);
        k_plan.min(left_new).min(left_ctx)
    }

    /// Draft rows per running request (indexed like `running`) for this step;
    /// empty under [`SpecMode::Off`].
    fn plan_drafts(&mut self) {
        self.draft_plan.clear();
        match self.cfg.spec {
            SpecMode::Off => {}
            SpecMode::Fixed(n) => self.draft_plan.resize(self.running.len(), n),
            SpecMode::Budgeted { max_drafts } => {
                self.draft_plan.resize(self.running.len(), 0);
                let Some(planner) = self.planner.as_mut() else {
                    return;
                };
                let mut which = Vec::new();
                let mut confs: Vec<&[f64]> = Vec::new();
                for (i, &s) in self.running.iter().enumerate() {
                    let Some(r) = self.slots.get(s as usize) else {
                        continue;
                    };
                    if r.scheduled as usize + 1 >= r.tokens.len() {
                        which.push(i);
                        let n = r.confidences.len().min(max_drafts);
                        confs.push(&r.confidences[..n]);
                    }
                }
                if confs.is_empty() {
                    return;
                }
                // A planner error (batch above its table, bad confidences) means no drafts.
                if let Ok(p) = planner.plan(&confs) {
                    for (j, &i) in which.iter().enumerate() {
                        self.draft_plan[i] = p.draft_rows[j];
                    }
                }
            }
        }
    }
}
