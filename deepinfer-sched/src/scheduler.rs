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

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use deepinfer_kv::{AllocateOptions, BlockManager, KvError, SeqHandle};
use deepinfer_spec::Planner;

use crate::cost_model::{PrefillCostModel, StepFeatures, StepSample};
use crate::error::SchedError;
mod retire;
mod slab;
mod steady_rows;
use retire::remove_finished;
use slab::{Loc, slab_mut};
use steady_rows::{
    dense_steady_rows, prefetch_cold_line, prefetch_record, queue_full_block, steady_decode_rows,
};

use crate::request::{
    DecodeRow, FinishReason, Finished, NewRequest, PlanFix, PrefillChunk, RequestId, RowOutput,
    StepOutput, StepPlan, UpdateResult,
};

/// Token id written into the KV manager for draft rows, whose ids the
/// scheduler does not know. `update` commits accepted drafts under the ids
/// the engine reports (`BlockManager::commit_drafts`), so they are cached
/// under the right hashes.
pub const PLACEHOLDER_TOKEN: u32 = u32::MAX;

const PLACEHOLDERS: [u32; 16] = [PLACEHOLDER_TOKEN; 16];

/// Cap of the context limit: lengths are kept as `u32` on the decode path.
const MAX_LEN: usize = (u32::MAX / 2) as usize;

/// Most drafts of one decode row (its record keeps them, and the blocks they
/// reserve, in 16 bits).
const MAX_DRAFTS: usize = u16::MAX as usize - 1;

/// Most output tokens whose host memory is reserved at admission.
const RESERVE_TOKENS: usize = 2048;

/// How many draft rows each decode request verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecMode {
    /// No speculation.
    #[default]
    Off,
    /// Every decode request verifies this many drafts (the deterministic mode).
    Fixed(usize),
    /// The `deepinfer-spec` planner picks draft rows per request from the
    /// drafter's confidences reported with the previous step, at most `max_drafts`
    /// each (set the planner with [`Scheduler::with_planner`]).
    Budgeted {
        /// Cap per request.
        max_drafts: usize,
    },
}

/// Scheduler settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Most rows (tokens, drafts included) in one step.
    pub max_num_batched_tokens: usize,
    /// Most requests in one step.
    pub max_num_seqs: usize,
    /// Context limit: prompt + generated tokens.
    pub max_model_len: usize,
    /// Most prefill tokens of one request in one step (the per-request chunk cap).
    pub max_chunk_tokens: usize,
    /// Split prompts across steps; when false a prompt is scheduled whole or waits.
    pub chunked_prefill: bool,
    /// Step time budget in the cost model's unit (ms); needs a cost model.
    pub step_time_budget: Option<f64>,
    /// When the time budget leaves no room, a step that would otherwise be empty
    /// still prefills this many tokens, so a request always makes progress.
    pub min_chunk_tokens: usize,
    /// Speculative rows.
    pub spec: SpecMode,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 8192,
            max_num_seqs: 256,
            max_model_len: 131_072,
            max_chunk_tokens: 8192,
            chunked_prefill: true,
            step_time_budget: None,
            min_chunk_tokens: 64,
            spec: SpecMode::Off,
        }
    }
}

impl SchedulerConfig {
    fn check(&self) -> Result<(), SchedError> {
        for (name, v) in [
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_num_seqs", self.max_num_seqs),
            ("max_model_len", self.max_model_len),
            ("max_chunk_tokens", self.max_chunk_tokens),
            ("min_chunk_tokens", self.min_chunk_tokens),
        ] {
            if v == 0 {
                return Err(SchedError::ZeroBudget(name));
            }
        }
        if let Some(t) = self.step_time_budget
            && !(t.is_finite() && t > 0.0)
        {
            return Err(SchedError::ZeroBudget("step_time_budget"));
        }
        Ok(())
    }
}

/// Multiplicative hashing for caller-chosen u64 ids (SipHash costs more than the
/// rest of a lookup; ids are not attacker-controlled inside an engine).
#[derive(Default)]
struct IdHasher(u64);
impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}
type IdMap<V> = HashMap<RequestId, V, BuildHasherDefault<IdHasher>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    Running,
}

/// A live request. `repr(C)` with the alignment puts everything a steady
/// decode row reads and writes, in `schedule_into` and in `update`, in the
/// first cache line (lengths are `u32`: the context limit is capped to fit);
/// the rest is cold. `has_stops` is the first field with a large niche, so the
/// tag of `Option<Req>` lives in the hot line too.
#[derive(Debug, Clone)]
#[repr(C, align(64))]
struct Req {
    // Hot line.
    tokens: Vec<u32>,
    id: RequestId,
    /// Tokens whose KV is computed or scheduled.
    scheduled: u32,
    /// Tokens in the KV sequence, drafts excluded (the block manager has been
    /// given `kv_synced` of them).
    kv_len: u32,
    /// Free slots in the sequence's last block (so growth needs no division).
    kv_room: u32,
    /// Committed length at which the block holding the next decode input is
    /// full (then its blocks are reported computed to the prefix cache).
    next_full: u32,
    /// History length at which the request stops: `prompt_len +
    /// max_new_tokens`, capped by the context limit.
    limit: u32,
    /// Set each time the request is placed in the running slab (admission,
    /// fork) from a counter: a row in flight belongs to this request, on this
    /// KV sequence, only while the record's epoch is the row's (a preempted
    /// request keeps its epoch while parked, and is re-admitted only once its
    /// rows have landed).
    epoch: u32,
    /// Placeholder drafts after the committed tokens.
    kv_drafts: u32,
    has_stops: bool,
    /// `confidences` is not empty.
    has_confs: bool,
    /// Row groups of this request in steps in flight.
    inflight: u8,
    /// Rows in flight that will append a token to the history (once a row
    /// samples, every later row of the request samples too).
    sampling_rows: u8,
    // Cold.
    /// The KV sequence's handle (skips the id lookup).
    kv: Option<SeqHandle>,
    arrival: u64,
    /// Bumped whenever the KV sequence is dropped (preemption): keys of the
    /// waiting heap from an older incarnation are stale.
    incarnation: u32,
    phase: Phase,
    /// Tokens of the history handed to the KV sequence so far (`<= kv_len`).
    /// A steady decode row only counts its input in `kv_len`; the tokens go
    /// to the block manager in one call per block (see `sync_kv`), so a decode
    /// step touches no per-sequence state of the manager.
    kv_synced: usize,
    prompt_len: usize,
    max_new_tokens: usize,
    stop_tokens: Vec<u32>,
    priority: i32,
    /// Drafter confidences from the last output (budgeted speculation).
    confidences: Vec<f64>,
    preempted_before: bool,
}

impl Req {
    /// A vacant entry of the running slab (epoch 0; allocates nothing).
    fn vacant() -> Self {
        Req {
            tokens: Vec::new(),
            id: 0,
            scheduled: 0,
            kv_len: 0,
            kv_room: 0,
            next_full: 0,
            limit: 0,
            epoch: 0,
            kv_drafts: 0,
            has_stops: false,
            has_confs: false,
            inflight: 0,
            sampling_rows: 0,
            kv: None,
            arrival: 0,
            incarnation: 0,
            phase: Phase::Waiting,
            kv_synced: 0,
            prompt_len: 0,
            max_new_tokens: 0,
            stop_tokens: Vec::new(),
            priority: 0,
            confidences: Vec::new(),
            preempted_before: false,
        }
    }

    fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WaitKey {
    priority: i32,
    arrival: u64,
    slot: u32,
    incarnation: u32,
}
impl Ord for WaitKey {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Greatest first: higher priority, then earlier arrival.
        self.priority
            .cmp(&o.priority)
            .then(o.arrival.cmp(&self.arrival))
            .then(o.slot.cmp(&self.slot))
            .then(self.incarnation.cmp(&o.incarnation))
    }
}
impl PartialOrd for WaitKey {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// A prefill chunk in flight.
#[derive(Debug, Clone, Copy)]
struct FlightRow {
    slot: u32,
    /// The request's placement epoch (a freed slot may be reused).
    epoch: u32,
    id: RequestId,
    start: usize,
    len: usize,
    samples: bool,
    /// Cancelled by a later update: the engine drops it, the output skips it.
    cancelled: bool,
}

/// A decode row in flight (32 bytes: the decode list is the long one).
#[derive(Debug, Clone, Copy)]
struct DecodeFlight {
    id: RequestId,
    /// Input position.
    position: u32,
    slot: u32,
    /// The request's placement epoch (a freed slot may be reused).
    epoch: u32,
    drafts: u16,
    /// Blocks reserved for a provisional row (released when it is
    /// materialised or cancelled).
    reserved: u16,
    provisional: bool,
    /// Cancelled by a later update: the engine drops it, the output skips it.
    cancelled: bool,
}

#[derive(Debug, Clone)]
struct Flight {
    step: u64,
    /// Row groups in output order: the prefill chunks, then the decode rows
    /// (two vectors, so the large decode list is never copied).
    prefill: Vec<FlightRow>,
    rows: Vec<DecodeFlight>,
    /// Decode rows marked cancelled (so `update` counts the live ones without
    /// a pass over the list).
    cancelled_rows: usize,
    features: StepFeatures,
    num_tokens: usize,
    /// Blocks reserved by its provisional rows still to be materialised.
    reserved: usize,
}

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

/// Counters over the scheduler's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedStats {
    /// Steps scheduled.
    pub steps: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Prompt tokens served from the prefix cache at admission.
    pub cached_tokens: u64,
    /// Requests finished (any reason).
    pub finished: u64,
}

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

fn div_ceil(a: usize, b: usize) -> usize {
    a.div_ceil(b)
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

/// Hands the tokens a request's KV sequence holds but the block manager has
/// not been told of yet (steady decode rows only count them) to the manager,
/// which counts them (the history is the token list: see
/// `AllocateOptions::caller_keeps_tokens`). Allocates no block unless a steady
/// row started one (`flush_grow`). Only tokens the history holds are handed
/// over (accepted drafts cut short by a stop token are not).
fn sync_kv(kv: &mut BlockManager, r: &mut Req) -> Result<(), KvError> {
    let len = (r.kv_len as usize).min(r.tokens.len());
    if r.kv_synced < len
        && let Some(h) = r.kv
    {
        kv.extend_by_handle(h, &r.tokens[r.kv_synced..len])?;
        r.kv_synced = len;
    }
    Ok(())
}

/// Blocks a sequence with `room` free slots in its last block allocates to
/// grow by `n` tokens (divides only when a block boundary is crossed).
fn blocks_to_grow(room: usize, n: usize, bs: usize) -> usize {
    if n <= room {
        0
    } else {
        (n - room).div_ceil(bs)
    }
}

/// Free slots in the last block of a sequence of `len` tokens.
fn room_after(len: usize, bs: usize) -> u32 {
    (div_ceil(len, bs) * bs - len) as u32
}

/// Committed length at which the block holding position `len` is full.
fn next_block_end(len: usize, bs: usize) -> u32 {
    ((len / bs + 1) * bs) as u32
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

    /// Queue the parked request in `slot`.
    fn push_waiting(&mut self, slot: u32) {
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

    /// Drop a request's KV sequence (full computed blocks stay in the prefix cache).
    fn free_kv(kv: &mut BlockManager, r: &mut Req) {
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

    /// Abort a request at any moment; returns what it generated so far. Its rows in flight are ignored when their
    /// output arrives; a pending plan's rows for it are cancelled by the next `update`.
    pub fn abort(&mut self, id: RequestId) -> Result<Finished, SchedError> {
        let loc = *self.ids.get(&id).ok_or(SchedError::UnknownRequest(id))?;
        if loc.parked {
            // The heap entry goes stale (its slot no longer holds this arrival) and is skipped.
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

    fn insert_running(&mut self, slot: u32) {
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

    /// Preempt the running request in `slot` by recompute: free the KV (full
    /// blocks stay cached), park and requeue it. The caller removes it from the
    /// running list.
    fn preempt(&mut self, slot: u32, out: &mut Vec<RequestId>) {
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

    /// Drafts for a decode row, `ahead` tokens after the known history (the
    /// tokens still being sampled before a provisional row's input).
    fn drafts_for(&self, r: &Req, k_plan: usize, ahead: usize) -> usize {
        // Drafts past the token limit or the context are wasted rows.
        let left_new = r.max_new_tokens.saturating_sub(r.output_len() + ahead + 1);
        let left_ctx = self.max_len.saturating_sub(r.tokens.len() + ahead + 1);
        k_plan.min(left_new).min(left_ctx)
    }

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
        let (mut prefill_rows, mut decode_rows) = self.spare_rows.pop().unwrap_or_default();
        decode_rows.reserve(self.running.len());
        let mut features = StepFeatures::default();
        // Σ q·(q + c) and Σ (q + c) of the decode rows.
        let (mut dec_quad, mut dec_lin) = (0u64, 0u64);
        let mut tokens_left = self.cfg.max_num_batched_tokens;
        let mut seqs_left = self.cfg.max_num_seqs;
        // Blocks promised to provisional rows materialised at the next update.
        // (Those of the plans still pending count too: see `pending_reserve`.)
        let mut reserved_blocks = self.pending_reserve;
        // Blocks promised to steady rows that start a block, allocated in one
        // batch after the walk (see `flush_grow`).
        let mut pending_grow = 0;
        self.grow_slots.clear();
        let time_budget = self.cfg.step_time_budget.filter(|_| self.cost.is_some());
        let coef = self.cost.as_ref().map(|c| c.coefficients());
        let mut time_left = match (time_budget, coef) {
            (Some(t), Some(c)) => t - c.d,
            _ => f64::INFINITY,
        };

        let dec_cost =
            |quad: u64, lin: u64| coef.map_or(0.0, |c| c.a * quad as f64 + c.b * lin as f64);
        self.plan_drafts();

        let no_drafts = self.draft_plan.is_empty();
        // Every 16 steps: when more than an eighth of the running list is out of
        // slot order, renumber the slab (amortised: one pass over the running
        // requests every few dozen steps of steady decoding).
        self.steps_since_compact += 1;
        if self.steps_since_compact >= 16 {
            self.steps_since_compact = 0;
            let n = self.running.len();
            let disorder = self.running.windows(2).filter(|w| w[1] != w[0] + 1).count();
            if n >= 2 && disorder * 8 >= n {
                self.compact_running();
            }
        }

        // Running requests first, in priority / arrival order.
        let mut i = 0;
        while i < self.running.len() {
            if seqs_left == 0 || tokens_left == 0 {
                break;
            }
            // Runs of steady decode rows in a tight loop (blocks are allocated,
            // and checked against reservations, on the general path below).
            if no_drafts && reserved_blocks + pending_grow <= self.kv.pool().num_free() {
                let mut grow_budget = self.kv.pool().num_free() - reserved_blocks - pending_grow;
                let before = self.grow_slots.len();
                let (next, sum) = steady_decode_rows(
                    &self.running,
                    &mut self.slots,
                    i,
                    seqs_left.min(tokens_left),
                    &mut decode_rows,
                    &mut plan.decode,
                    (
                        self.kv.block_size(),
                        &mut grow_budget,
                        &mut self.grow_slots,
                        &mut self.kv,
                    ),
                );
                pending_grow += self.grow_slots.len() - before;
                if next > i {
                    // One row each, no drafts: `q·(q + c)` and `q + c` agree.
                    dec_quad += sum;
                    dec_lin += sum;
                    tokens_left -= next - i;
                    seqs_left -= next - i;
                    i = next;
                    continue;
                }
            }
            // The record 8 rows on, so its misses overlap with this row's work.
            if let Some(&s8) = self.running.get(i + 8) {
                prefetch_record(&self.slots, s8);
            }
            let slot = self.running[i];
            let r = self.req(slot);
            let known = r.tokens.len();
            let scheduled = r.scheduled as usize;
            if scheduled + 1 < known {
                // Prefill (or recompute) chunk.
                let start = scheduled;
                let remaining = known - start;
                let q = self.chunk_len(
                    start,
                    remaining,
                    tokens_left,
                    time_left - dec_cost(dec_quad, dec_lin),
                    prefill_rows.is_empty() && decode_rows.is_empty(),
                );
                if q == 0 {
                    i += 1;
                    continue;
                }
                let epoch = r.epoch;
                let id = r.id;
                let samples = start + q == known;
                let r = self.req_mut(slot);
                r.scheduled += q as u32;
                r.inflight += 1;
                r.sampling_rows += u8::from(samples);
                features.add(q, start);
                if let Some(c) = coef {
                    time_left -= c.chunk(q, start);
                }
                tokens_left -= q;
                seqs_left -= 1;
                plan.prefill.push(PrefillChunk {
                    request: id,
                    start,
                    len: q,
                    samples,
                });
                prefill_rows.push(FlightRow {
                    slot,
                    epoch,
                    id,
                    start,
                    len: q,
                    samples,
                    cancelled: false,
                });
                i += 1;
                continue;
            }
            let provisional = scheduled == known;
            if provisional && r.sampling_rows == 0 {
                // Nothing to do until its rows in flight land (a non-sampling chunk).
                i += 1;
                continue;
            }
            // A provisional row on a provisional row (two steps unconfirmed) only
            // without speculation, so every row in flight adds exactly one token
            // and the position is known whatever the engine answers.
            let depth2_ok = self.cfg.spec == SpecMode::Off && r.kv_drafts == 0;
            if provisional && (r.inflight > 2 || (r.inflight == 2 && !depth2_ok)) {
                i += 1;
                continue;
            }
            // Decode row: input at `known - 1`, or a placeholder after the tokens
            // still being sampled by the steps in flight.
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
                    .min(tokens_left - 1)
                    .min(MAX_DRAFTS)
            };
            let id = r.id;
            let epoch = r.epoch;
            // KV slots: append now when the input is known, else reserve.
            let mut reserved_here = 0;
            let ok = if provisional {
                // After the updates the sequence holds at most its current tokens
                // (drafts in flight included), the inputs of provisional rows not
                // yet materialised (one each, see `depth2_ok`), plus these rows.
                let bs = self.kv.block_size();
                let room = match pending_tokens - 1 {
                    0 => r.kv_room as usize,
                    _ if r.kv_room >= 1 => r.kv_room as usize - 1,
                    _ => bs - 1,
                };
                let need = blocks_to_grow(room, 1 + k, bs);
                if need + reserved_blocks + pending_grow <= self.kv.pool().num_free() {
                    reserved_blocks += need;
                    reserved_here = need;
                    true
                } else {
                    false
                }
            } else {
                self.append_rows(slot, k, reserved_blocks + pending_grow)
            };
            if !ok {
                // Out of blocks: preempt the lowest-priority newest request
                // (possibly this one) and retry.
                let victim = *self.running.last().unwrap_or(&slot);
                self.running.pop();
                self.preempt(victim, &mut plan.preempted);
                if victim == slot {
                    break;
                }
                continue;
            }
            let r = self.req_mut(slot);
            if !provisional {
                r.scheduled = known as u32;
            }
            r.inflight += 1;
            r.sampling_rows += 1;
            // Integer sums: folded into the features (and the time left) once.
            dec_quad += ((1 + k) * (1 + k + position)) as u64;
            dec_lin += (1 + k + position) as u64;
            tokens_left -= 1 + k;
            seqs_left -= 1;
            decode_rows.push(DecodeFlight {
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
            i += 1;
        }

        self.flush_grow()?;

        // Then waiting requests, in priority / arrival order, while budget and blocks
        // last; none after a preemption (memory is short, and a request just
        // preempted would otherwise come straight back).
        while seqs_left > 0 && tokens_left > 0 && plan.preempted.is_empty() {
            let Some(key) = self.waiting.pop_last() else {
                break;
            };
            let live = self.parked.get(key.slot as usize).is_some_and(|r| {
                r.as_ref().is_some_and(|r| {
                    r.arrival == key.arrival
                        && r.incarnation == key.incarnation
                        && r.phase == Phase::Waiting
                })
            });
            if !live {
                continue;
            }
            self.num_waiting -= 1;
            let ploc = Loc {
                slot: key.slot,
                parked: true,
            };
            let Some(r) = self.get(ploc) else { continue };
            if r.inflight > 0 {
                // Preempted while a step in flight still produces its tokens.
                self.deferred.push(key);
                continue;
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
                    break;
                }
                Err(e) => return Err(e.into()),
            };
            if self.kv.pool().num_free() < reserved_blocks + watermark {
                let _ = self.kv.free(id);
                self.deferred.push(key);
                break;
            }
            let remaining = known - reused;
            let mut q = self.chunk_len(
                reused,
                remaining,
                tokens_left,
                time_left - dec_cost(dec_quad, dec_lin),
                prefill_rows.is_empty() && decode_rows.is_empty(),
            );
            // Without chunking a prompt waits until it fits whole; one that can
            // never fit a step (or a long recompute after preemption) is chunked anyway.
            let whole_fits = remaining
                <= self
                    .cfg
                    .max_num_batched_tokens
                    .min(self.cfg.max_chunk_tokens);
            if !self.cfg.chunked_prefill && q < remaining && whole_fits {
                q = 0;
            }
            if q == 0 {
                let _ = self.kv.free(id);
                self.deferred.push(key);
                break;
            }
            self.stats.cached_tokens += reused as u64;
            let samples = reused + q == known;
            let bs = self.kv.block_size();
            let handle = self.kv.handle(id).ok();
            // Room for the rest of the output (capped), so decoding does not reallocate.
            let _ = self.kv.reserve(id, extra);
            // Admitted: the record moves to the dense running slab.
            let mut r = self.take(ploc);
            r.tokens.reserve(extra);
            r.kv_len = known as u32;
            r.kv_synced = known;
            r.kv_drafts = 0;
            r.kv = handle;
            r.kv_room = (nblocks * bs - known) as u32;
            // The block of the last prompt token: a decode row may compute it
            // (when the prompt's chunks stop one short of it), and then fills it.
            r.next_full = next_block_end(known - 1, bs);
            r.scheduled = (reused + q) as u32;
            r.inflight += 1;
            r.sampling_rows += u8::from(samples);
            let slot = self.place(r, false).slot;
            let epoch = self.req(slot).epoch;
            self.insert_running(slot);
            features.add(q, reused);
            if let Some(c) = coef {
                time_left -= c.chunk(q, reused);
            }
            tokens_left -= q;
            seqs_left -= 1;
            plan.prefill.push(PrefillChunk {
                request: id,
                start: reused,
                len: q,
                samples,
            });
            prefill_rows.push(FlightRow {
                slot,
                epoch,
                id,
                start: reused,
                len: q,
                samples,
                cancelled: false,
            });
        }
        for k in self.deferred.drain(..) {
            self.waiting.insert(k);
            self.num_waiting += 1;
        }

        features.quad += dec_quad as f64;
        features.lin += dec_lin as f64;
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
        Ok(())
    }

    /// Chunk length for a prefill from `start` with `remaining` tokens left.
    fn chunk_len(
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
        let q = c.coefficients().max_chunk(start, time_left, cap);
        if q == 0 && step_empty {
            // Progress floor: a budget too small for anything still moves the prompt.
            return self.cfg.min_chunk_tokens.min(cap);
        }
        q
    }

    /// Append the known input token and `k` placeholder drafts of a decode row.
    #[inline(always)]
    fn append_rows(&mut self, slot: u32, k: usize, reserved: usize) -> bool {
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

    /// Draft rows per running request (indexed like `running`) for this step.
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

    /// Feed the output of the oldest step in flight: append tokens, check stops,
    /// commit accepted drafts and roll back rejected ones, free finished requests,
    /// refit the cost models, and reconcile the plan still pending (if any).
    pub fn update(&mut self, out: &StepOutput) -> Result<UpdateResult, SchedError> {
        let flight = self.flights.front().ok_or(SchedError::NoStepInFlight)?;
        if out.step != flight.step {
            return Err(SchedError::OutputMismatch(format!(
                "output of step {} but step {} is oldest in flight",
                out.step, flight.step
            )));
        }
        // Check every row before changing anything, so a bad output is rejected whole.
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
        if dense {
            // One token per live decode row, in row order: nothing else to read.
            // Runs of steady rows go through a tight loop; the others one by one.
            let toks = &out.decode_tokens[..];
            let bs = self.kv.block_size();
            let (mut j, mut ti) = (0, 0);
            loop {
                (j, ti) = dense_steady_rows(
                    &flight.rows,
                    toks,
                    &mut self.slots,
                    bs,
                    j,
                    ti,
                    &mut self.computed_pending,
                );
                let Some(fr) = flight.rows.get(j) else { break };
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
                        any_finished |= self.finish(loc, reason, hint, &mut res);
                    }
                    continue;
                }
                any_finished |=
                    self.apply_decode(fr, std::slice::from_ref(&t), &[], false, hint, &mut res)?;
            }
        } else {
            for (j, fr) in flight.rows.iter().enumerate().filter(|(_, f)| !f.cancelled) {
                let (o, toks, confs) = cur.next(out);
                any_finished |= self.apply_decode(fr, toks, confs, o.stop, j as u32, &mut res)?;
            }
        }
        self.flush_computed()?;
        if any_finished {
            remove_finished(&mut self.running, &self.finished, &mut self.finished_pos);
            self.finished.clear();
        }

        // Cost models learn from the measured step.
        if let Some(ms) = out.step_ms {
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
        }
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

    /// Allocate the blocks counted for the steady rows that start one (see
    /// `steady_decode_rows`): each request hands its KV sequence the tokens it
    /// counted, its new input included, which takes the block. In one batch
    /// whose cache misses overlap; it cannot run out of blocks (they were
    /// counted against the free ones, before any admission).
    fn flush_grow(&mut self) -> Result<(), SchedError> {
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
    fn flush_computed(&mut self) -> Result<(), SchedError> {
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
            // Preempted while in flight: its heap entry goes stale.
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

    /// The running slot of a row of the pending plan, when its request is still
    /// running on the KV sequence the row was planned on; otherwise the row is
    /// cancelled (its request finished, was aborted or preempted) and its
    /// request, if still live, no longer counts it in flight.
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

    /// Materialise the provisional rows of the plan still pending, now that the
    /// tokens of the step before it are known; with a second plan pending
    /// (two-step overlap), cancel its rows whose requests are gone (its own
    /// provisional rows wait for the next update).
    fn reconcile_pending(&mut self, res: &mut UpdateResult) {
        let Some(mut pending) = self.flights.pop_front() else {
            return;
        };
        // Its reservations are used now; the later plan's stay.
        self.pending_reserve -= pending.reserved;
        pending.reserved = 0;
        let mut removed_tokens = 0;
        for fr in pending.prefill.iter_mut().filter(|f| !f.cancelled) {
            if self
                .pending_live(fr.slot, fr.id, fr.epoch, fr.samples)
                .is_none()
            {
                fr.cancelled = true;
                removed_tokens += fr.len;
                res.fixes.push(PlanFix::Cancel(fr.id));
            }
        }
        for fr in pending.rows.iter_mut().filter(|f| !f.cancelled) {
            let drafts = fr.drafts as usize;
            let Some(slot) = self.pending_live(fr.slot, fr.id, fr.epoch, true) else {
                fr.cancelled = true;
                pending.cancelled_rows += 1;
                removed_tokens += 1 + drafts;
                res.fixes.push(PlanFix::Cancel(fr.id));
                continue;
            };
            if !fr.provisional {
                continue;
            }
            let known = self.req(slot).tokens.len();
            // The input is the last token so far; a provisional row of the later
            // plan for the same request still counts one token to come.
            let actual = known - 1;
            if self.append_rows(slot, drafts, self.pending_reserve) {
                self.req_mut(slot).scheduled = known as u32;
                fr.provisional = false;
                if actual != fr.position as usize {
                    fr.position = actual as u32;
                    res.fixes.push(PlanFix::Position {
                        request: fr.id,
                        position: actual,
                    });
                }
            } else {
                // The reservation should make this unreachable; stay safe anyway.
                fr.cancelled = true;
                pending.cancelled_rows += 1;
                removed_tokens += 1 + drafts;
                res.fixes.push(PlanFix::Cancel(fr.id));
                let r = self.req_mut(slot);
                r.inflight = r.inflight.saturating_sub(1);
                r.sampling_rows = r.sampling_rows.saturating_sub(1);
                if let Some(i) = self.running.iter().position(|&s| s == slot) {
                    self.running.remove(i);
                }
                self.preempt(slot, &mut res.preempted);
            }
        }
        pending.num_tokens -= removed_tokens;
        // The plan after it: cancellations, and the provisional rows whose input
        // is now known (a provisional row on a provisional row waits: without
        // speculation, see `depth2_ok` in `schedule_into`, its position cannot
        // move).
        if let Some(mut later) = self.flights.pop_front() {
            let mut removed = 0;
            for fr in later.prefill.iter_mut().filter(|f| !f.cancelled) {
                if self
                    .pending_live(fr.slot, fr.id, fr.epoch, fr.samples)
                    .is_none()
                {
                    fr.cancelled = true;
                    removed += fr.len;
                    res.later_fixes.push(PlanFix::Cancel(fr.id));
                }
            }
            for fr in later.rows.iter_mut().filter(|f| !f.cancelled) {
                let drafts = fr.drafts as usize;
                let Some(slot) = self.pending_live(fr.slot, fr.id, fr.epoch, true) else {
                    fr.cancelled = true;
                    later.cancelled_rows += 1;
                    removed += 1 + drafts;
                    let r = usize::from(fr.reserved);
                    later.reserved -= r;
                    self.pending_reserve -= r;
                    res.later_fixes.push(PlanFix::Cancel(fr.id));
                    continue;
                };
                // A provisional row whose request has no other sampling row in
                // flight (nothing for it in the plan between): its input is
                // known now, so it is materialised now, or the next plan would
                // schedule that input a second time.
                if !fr.provisional || self.req(slot).sampling_rows != 1 {
                    continue;
                }
                let r = usize::from(fr.reserved);
                later.reserved -= r;
                self.pending_reserve -= r;
                let known = self.req(slot).tokens.len();
                if self.append_rows(slot, drafts, self.pending_reserve) {
                    self.req_mut(slot).scheduled = known as u32;
                    fr.provisional = false;
                    fr.position = (known - 1) as u32;
                    res.later_fixes.push(PlanFix::Position {
                        request: fr.id,
                        position: known - 1,
                    });
                } else {
                    fr.cancelled = true;
                    later.cancelled_rows += 1;
                    removed += 1 + drafts;
                    res.later_fixes.push(PlanFix::Cancel(fr.id));
                    let r = self.req_mut(slot);
                    r.inflight = r.inflight.saturating_sub(1);
                    r.sampling_rows = r.sampling_rows.saturating_sub(1);
                    if let Some(i) = self.running.iter().position(|&s| s == slot) {
                        self.running.remove(i);
                    }
                    self.preempt(slot, &mut res.preempted);
                }
            }
            later.num_tokens -= removed;
            self.flights.push_front(later);
        }
        self.flights.push_front(pending);
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// What a steady decode row touches stays in one cache line per record and
    /// 32 bytes per row in flight.
    #[test]
    fn hot_fields_fit_the_first_cache_line() {
        let end = offset_of!(Req, sampling_rows) + 1;
        assert!(end <= 64, "hot line ends at {end}");
        for off in [
            offset_of!(Req, tokens),
            offset_of!(Req, id),
            offset_of!(Req, scheduled),
            offset_of!(Req, kv_len),
            offset_of!(Req, kv_room),
            offset_of!(Req, next_full),
            offset_of!(Req, limit),
            offset_of!(Req, epoch),
            offset_of!(Req, kv_drafts),
            offset_of!(Req, has_stops),
            offset_of!(Req, has_confs),
            offset_of!(Req, inflight),
        ] {
            assert!(off < 64);
        }
        // What `flush_computed` and `sync_kv` read of a queued block's record
        // is on the second line (`prefetch_cold_line`).
        for off in [offset_of!(Req, kv), offset_of!(Req, kv_synced)] {
            assert!((64..128).contains(&off), "cold field at {off}");
        }
        // The slab's `Option` costs no space (its tag sits in a niche).
        assert_eq!(size_of::<Option<Req>>(), size_of::<Req>());
        assert_eq!(size_of::<DecodeFlight>(), 32);
    }
}
