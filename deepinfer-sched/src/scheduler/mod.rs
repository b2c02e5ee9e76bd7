//! The scheduler core: waiting and running queues, one step's budget, chunked
//! prefill under a token and a time budget, prefix-cache-aware admission,
//! preemption by recompute, speculative rows and overlapped scheduling.
//!
//! Every live request keeps its whole token history (prompt + generated). Its
//! KV lives in a [`BlockManager`] sequence of the same id. A request's next
//! rows are the tokens from `scheduled` (KV computed or being computed) to the
//! end of its history: more than one such token is a prefill chunk, exactly
//! one is a decode row (the last sampled token as input). Preemption frees the
//! sequence (full computed blocks stay in the prefix cache) and requeues the
//! request with its history, so re-admission recomputes it, mostly from cache.
//!
//! Cost per step is O(running + admitted): the waiting queue is an ordered set
//! keyed by (priority, arrival), never scanned. (A binary heap's pop walks a
//! path down to a leaf, whose lower levels miss the cache once the queue holds
//! 100,000 requests; the set's pops and new arrivals stay on its two ends.)
//!
//! Where each part lives:
//!
//! - `config`: the public settings and counters;
//! - `record`: the records of live requests and of steps in flight;
//! - `requests`: submitting, aborting and forking requests;
//! - `step`: `schedule_into`, one step's phases over the running list;
//! - `prefill`: chunk lengths under the token and time budgets;
//! - `admission`: the waiting queue and admission into the running list;
//! - `kv_slots`: KV slots for decode rows and drafts, and the batched
//!   hand-over of counted tokens to the block manager;
//! - `preempt`: preemption by recompute;
//! - `update`: applying a step's output;
//! - `overlap`: reconciling the plans still pending after an update;
//! - `slab`, `steady_rows`, `retire`: the running slab, the two hot loops
//!   over steady decode rows, and taking finished requests off the running
//!   list.

use std::collections::{BTreeSet, VecDeque};

use deepinfer_kv::{BlockManager, SeqHandle};
use deepinfer_spec::Planner;

use crate::cost_model::PrefillCostModel;
use crate::error::SchedError;
use crate::request::RequestId;

mod admission;
mod config;
mod kv_slots;
mod overlap;
mod preempt;
mod prefill;
mod record;
mod requests;
mod retire;
mod slab;
mod steady_rows;
mod step;
mod update;

pub use config::{PLACEHOLDER_TOKEN, SchedStats, SchedulerConfig, SpecMode};

use kv_slots::next_block_end;
use record::{DecodeFlight, Flight, FlightRow, IdMap, Req, WaitKey};
use slab::Loc;

/// Cap of the context limit: lengths are kept as `u32` on the decode path.
const MAX_LEN: usize = (u32::MAX / 2) as usize;

/// The scheduler.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    /// Context limit in force: `max_model_len`, capped by the whole pool so a
    /// request running alone can always grow to it.
    max_len: usize,
    kv: BlockManager,
    cost: Option<PrefillCostModel>,
    planner: Option<Planner>,
    /// Running requests (dense: slots are reused, so they stay below the peak running count).
    /// A vacant slot holds a record of epoch 0 (no `Option`: its tag could sit
    /// outside the hot line).
    slots: Vec<Req>,
    free_slots: Vec<u32>,
    /// Waiting (and preempted) requests.
    parked: Vec<Option<Req>>,
    free_parked: Vec<u32>,
    ids: IdMap<Loc>,
    /// Popped from its greatest end (see `WaitKey`'s order).
    waiting: BTreeSet<WaitKey>,
    num_waiting: usize,
    /// Running slots by (priority desc, arrival asc); victims come off the end.
    running: Vec<u32>,
    /// Running slots finished during the current `update`, each with a hint
    /// of its place in `running` (see `remove_finished`), and their places.
    finished: Vec<(u32, u32)>,
    finished_pos: Vec<usize>,
    /// Blocks filled during an update walk, as the running slot of their
    /// request and its committed length (the walk reads no KV handle: it is
    /// on the record's cold line), reported in one batch after the walk.
    computed_pending: Vec<(u32, usize)>,
    /// The batch handed to the block manager, and its items' running slots.
    computed_batch: Vec<(SeqHandle, usize)>,
    computed_slots: Vec<u32>,
    /// Running slots whose steady decode row starts a block this step (the
    /// block is counted during the walk and allocated after it).
    grow_slots: Vec<u32>,
    /// Blocks reserved by provisional rows of pending plans, not yet
    /// materialised (admissions and appends leave them free).
    pending_reserve: usize,
    /// Steps since the running slab was last checked for order (see `compact_running`).
    steps_since_compact: u32,
    /// Scratch of `compact_running`: slot permutation and the spare slab.
    perm_scratch: Vec<u32>,
    slab_scratch: Vec<Req>,
    flights: VecDeque<Flight>,
    next_arrival: u64,
    /// Last placement epoch handed out (see `Req::epoch`).
    next_epoch: u32,
    next_step: u64,
    pending_copies: Vec<deepinfer_kv::CopyOp>,
    pending_aborted: Vec<RequestId>,
    stats: SchedStats,
    // Scratch reused across steps.
    deferred: Vec<WaitKey>,
    /// Row vectors of updated steps, reused by the next plans.
    spare_rows: Vec<(Vec<FlightRow>, Vec<DecodeFlight>)>,
    draft_plan: Vec<usize>,
    slot_scratch: Vec<deepinfer_kv::Slot>,
}

impl Scheduler {
    /// A scheduler over a block manager.
    pub fn new(cfg: SchedulerConfig, kv: BlockManager) -> Result<Self, SchedError> {
        cfg.check()?;
        if cfg.step_time_budget.is_some() && cfg.max_chunk_tokens < cfg.min_chunk_tokens {
            return Err(SchedError::InvalidConfig(
                "min_chunk_tokens exceeds max_chunk_tokens".into(),
            ));
        }
        let pool_tokens = kv.config().num_blocks * kv.block_size();
        Ok(Self {
            // Lengths are kept as `u32` on the decode path.
            max_len: cfg.max_model_len.min(pool_tokens).min(MAX_LEN),
            cfg,
            kv,
            cost: None,
            planner: None,
            slots: Vec::new(),
            free_slots: Vec::new(),
            parked: Vec::new(),
            free_parked: Vec::new(),
            ids: IdMap::default(),
            waiting: BTreeSet::new(),
            num_waiting: 0,
            running: Vec::new(),
            finished: Vec::new(),
            finished_pos: Vec::new(),
            computed_pending: Vec::new(),
            computed_batch: Vec::new(),
            computed_slots: Vec::new(),
            grow_slots: Vec::new(),
            pending_reserve: 0,
            steps_since_compact: 0,
            perm_scratch: Vec::new(),
            slab_scratch: Vec::new(),
            flights: VecDeque::new(),
            next_arrival: 0,
            next_epoch: 0,
            next_step: 0,
            pending_copies: Vec::new(),
            pending_aborted: Vec::new(),
            stats: SchedStats::default(),
            deferred: Vec::new(),
            spare_rows: Vec::new(),
            draft_plan: Vec::new(),
            slot_scratch: Vec::new(),
        })
    }

    /// Set the prefill cost model (needed by `step_time_budget`; refitted from `step_ms`).
    pub fn with_cost_model(mut self, model: PrefillCostModel) -> Self {
        self.cost = Some(model);
        self
    }

    /// Set the draft planner for [`SpecMode::Budgeted`] (its step-time model is
    /// corrected from `step_ms`).
    pub fn with_planner(mut self, planner: Planner) -> Self {
        self.planner = Some(planner);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The block manager (block tables for the engine, usage, events). It
    /// keeps no token ids for the scheduler's requests (their histories are the
    /// token lists, see [`Scheduler::tokens`]), so its `tokens` of a request
    /// is an error, and the length it counts for a decoding request may trail
    /// the history by up to a block (the block's tokens are counted when it
    /// fills); block tables are always complete for the rows planned.
    pub fn kv(&self) -> &BlockManager {
        &self.kv
    }

    /// Mutable block manager (for draining events).
    pub fn kv_mut(&mut self) -> &mut BlockManager {
        &mut self.kv
    }

    /// The cost model, if set.
    pub fn cost_model(&self) -> Option<&PrefillCostModel> {
        self.cost.as_ref()
    }

    /// Counters.
    pub fn stats(&self) -> SchedStats {
        self.stats
    }

    /// Requests waiting (including preempted ones).
    pub fn num_waiting(&self) -> usize {
        self.num_waiting
    }

    /// Requests running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Steps scheduled but not yet updated.
    pub fn num_in_flight(&self) -> usize {
        self.flights.len()
    }

    /// Whether no request is tracked.
    pub fn is_idle(&self) -> bool {
        self.ids.is_empty()
    }

    /// Token history (prompt + generated so far) of a live request.
    pub fn tokens(&self, id: RequestId) -> Option<&[u32]> {
        let loc = *self.ids.get(&id)?;
        self.get(loc).map(|r| r.tokens.as_slice())
    }
}
