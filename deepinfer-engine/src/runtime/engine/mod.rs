//! The step loop (DESIGN.md, "One engine step"): `deepinfer-sched` plans the step (KV
//! blocks from `deepinfer-kv`, prefix hits, chunked prefill, preemption, draft rows) → the
//! device work ([`super::device`]: DSpark drafts, the model's forward over each sequence's
//! state, draft verification, grammar masks, `deepinfer-sample`) → `update` (append, stop
//! conditions, free blocks, step times to the cost models) → the recipe stream parser turns
//! ids into text, reasoning and tool calls → responses.
//!
//! # Overlapped scheduling (on by default, [`EngineConfig::overlap`])
//!
//! Step N+1's input is step N's sampled token, so the forward of N+1 cannot start before
//! N's sample is known. What can move off the critical path is everything else the host
//! does. The design:
//!
//! - **The device worker.** A thread owned by the engine for the length of a `generate`
//!   call runs each step's whole device side ([`super::device::run_job`]) inside rayon's
//!   pool: drafting, forward calls, verification (and the re-run of an accepted prefix after
//!   a rejection), grammar masks, sampling, matcher updates, budgeted drafting ahead. Each
//!   request's model state, matcher, pending drafts and token history are *moved* into the
//!   job and come back with the results, so no state is shared between the two threads.
//! - **The host thread**, for step N: as soon as N's results arrive it builds the scheduler
//!   output and calls `update(N)` (the only host work on the critical path, with building the
//!   next job); `update` confirms or cancels the rows of the plan for N+1, which was made
//!   while N computed (`deepinfer-sched` gives a request whose token is still being sampled
//!   a provisional decode row and fixes its position in `update`). The job for N+1 is built
//!   from the confirmed plan — now every input token is known — and sent to the worker.
//!   While N+1 computes, the host parses N's tokens (stream parser, events, log-probs,
//!   finished outputs) and plans N+2.
//! - **Consequences, all handled:** a stop sequence found while parsing N is seen after
//!   N+1 was launched, so the request is ended at once (its N+1 row is ignored by the
//!   scheduler) and its output keeps only the tokens up to the stop — the same tokens the
//!   non-overlapped loop returns. Requests that finish in `update(N)` get their provisional
//!   rows of N+1 cancelled (`PlanFix::Cancel`); preemptions decided while N computed drop
//!   the state when it comes back. A step in which a fork-group parent emits its forced
//!   token is not overlapped (a fork needs its parent out of flight).
//! - **Debug check** ([`EngineConfig::sync_check`]): the host thread is marked as being in
//!   the launch phase ([`crate::model::sync`]); any model call there that reads device
//!   results fails with [`crate::ModelError::HostSync`] instead of silently serialising
//!   the pipeline.
//!
//! With `overlap: false` every step runs in order on the calling thread (parse before
//! update), for comparison; outputs are identical (see `tests/runtime_overlap.rs`).
//! Metrics split host time into what ran while a step computed ([`Metrics::hidden_ms`]) and
//! what did not.

use super::device::{Dev, DevStats, Fixed, Job, JobCfg, JobOut, JobSeq, Tok, run_job};
use super::prefix_cache::{DiskTierConfig, PrefixCache};
use super::request::GrammarConstraint;
use super::request::{FinishReason, Output, Request, RequestId, Timing, TokenLogprob, Usage};
use crate::model::sync::LaunchPhase;
use crate::{BatchItem, Logits, Model, ModelError, SeqState};
use deepinfer_kernels::Backend;
use deepinfer_kv::{BlockManager, BlockManagerConfig, ExtraKeys, HitRule, Tier};
use deepinfer_recipe::parser::{Assembled, BackendFinish, Event, FinishReason as ParseFinish};
use deepinfer_recipe::protocol::ParsingOptions;
use deepinfer_recipe::{PromptTokenizer, StreamParser};
use deepinfer_sample::SampleError;
use deepinfer_sched::{
    CoefficientBounds, CostCoefficients, FinishReason as SchedFinish, Finished, NewRequest,
    PrefillCostModel, SchedError, Scheduler, SchedulerConfig, SpecMode, StepFeatures, StepOutput,
    StepPlan, StepSample,
};
use deepinfer_spec::{Planner, PlannerConfig, Search, StepTimeModel};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::time::Instant;

mod admission;
mod calibrate;
mod config;
mod events;
mod job;
#[cfg(test)]
mod late_join_tests;
mod live;
mod metrics;
mod pool;
mod step;

use admission::PendingImport;
use calibrate::{calibrate, calibrate_prefill, hit_rule};
pub use config::{EngineConfig, SpecBudget};
use events::Offline;
pub use events::StreamEvent;
pub(crate) use events::{Command, Driver};
use live::{Live, finish_all, parse_tokens, plain_parsing};
pub use metrics::{DRAFT_POSITIONS, Metrics, STEP_HISTORY, StepRecord, StepTimes};
pub use pool::{KvCacheMemory, KvPool, available_host_memory, default_block_size};

/// Anything that stops a `generate` call.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// From the scheduler.
    #[error("scheduler: {0}")]
    Sched(#[from] SchedError),
    /// From the model.
    #[error("model: {0}")]
    Model(#[from] ModelError),
    /// From the sampler.
    #[error("sampler: {0}")]
    Sample(#[from] SampleError),
    /// Bad engine configuration.
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// A request that cannot run (reported per request by [`Engine::generate_each`]).
    #[error("request {id}: {reason}")]
    InvalidRequest {
        /// The request.
        id: RequestId,
        /// Why.
        reason: String,
    },
    /// The device worker thread stopped (it panicked).
    #[error("{0}")]
    Worker(String),
    /// The scheduler has work but planned nothing (should not happen).
    #[error("the scheduler made no progress with {0} request(s) left")]
    Stuck(usize),
}

/// The engine: a model on a backend plus scheduler, sampler and (optionally) a tokenizer.
pub struct Engine<B: Backend> {
    model: Arc<Model<B>>,
    cfg: EngineConfig,
    sched: Scheduler,
    tokenizer: Option<Arc<PromptTokenizer>>,
    prefix: PrefixCache<B::Tensor>,
    /// Prefix states brought back from a slower tier whose entries must be written into the
    /// blocks the scheduler imported for them before the next step runs.
    pending_imports: Vec<PendingImport<B::Tensor>>,
    metrics: Metrics,
    /// Recent steps (the last [`STEP_HISTORY`] at most).
    step_log: Vec<StepRecord>,
    /// Most KV blocks in use at once.
    kv_peak: usize,
    /// The KV pool's size.
    pool: pool::KvPool,
    /// Where the routed experts are, with expert parallelism.
    placement: Option<Arc<crate::model::ExpertPlacement>>,
    /// `cfg.draft_calibration`, shared with every step's job.
    draft_calibration: Option<Arc<deepinfer_spec::TemperatureScaling>>,
    /// EPLB's state, when it re-places the experts.
    balancer: Option<super::eplb::Balancer>,
    next_sid: u64,
}

impl<B: Backend> std::fmt::Debug for Engine<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("cfg", &self.cfg)
            .field("metrics", &self.metrics)
            .finish()
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

impl<B: Backend> Engine<B>
where
    B::Tensor: Clone,
{
    /// An engine over `model`. Sizes the KV pool ([`EngineConfig::kv_cache_memory`],
    /// [`EngineConfig::block_size`]), the one pool of the scheduler's block tables and the
    /// model's paged global state.
    pub fn new(mut model: Model<B>, mut cfg: EngineConfig) -> Result<Self, EngineError> {
        // The pool as configured: its block size and count, from here on in `cfg`.
        let pool = pool::size_pool(&model, &cfg)?;
        (cfg.block_size, cfg.num_blocks) = (pool.block_size, pool.num_blocks);
        let experts = model.cfg.n_routed_experts;
        if cfg.expert_parallel == 0 || cfg.expert_parallel > experts.max(1) {
            return Err(EngineError::Config(format!(
                "expert_parallel {} must be between 1 and the model's {experts} routed experts",
                cfg.expert_parallel
            )));
        }
        if cfg.spec_drafts > 0 {
            let block = model.cfg.dspark.as_ref().map(|d| d.block_size).unwrap_or(0);
            if !model.has_drafter() || cfg.spec_drafts > block {
                return Err(EngineError::Config(format!(
                    "spec_drafts {} needs a DSpark drafter with at least that block size (this model: {})",
                    cfg.spec_drafts,
                    if model.has_drafter() {
                        format!("block {block}")
                    } else {
                        "no drafter".into()
                    }
                )));
            }
        }
        // One pool: the model's compressed entries and indexer keys live at the block ids
        // of the scheduler's block tables.
        model
            .set_global_pool(pool.num_blocks, pool.block_size)
            .map_err(|e| EngineError::Config(format!("block size {}: {e}", pool.block_size)))?;
        if cfg.bounded_replay {
            // Which layers own global entries: found once here, by a probe forward on this
            // thread, not later on the step loop's.
            model.windowless_state(&vec![0; model.global_block_tokens()])?;
        }
        let sched = Self::make_scheduler(&model, &cfg)?;
        let prefix = Self::make_prefix_cache(&model, &cfg)?;
        let balancer = match cfg.eplb_interval {
            Some(k) => {
                model.count_expert_load(true);
                Some(
                    super::eplb::Balancer::new(
                        model.cfg.num_layers,
                        model.cfg.n_routed_experts,
                        cfg.expert_parallel,
                        k,
                        2,
                    )
                    .map_err(EngineError::Config)?,
                )
            }
            None => None,
        };
        let placement = (cfg.expert_parallel > 1).then(|| {
            Arc::new(crate::model::ExpertPlacement::contiguous(
                model.cfg.num_layers,
                model.cfg.n_routed_experts,
                cfg.expert_parallel,
            ))
        });
        Ok(Self {
            model: Arc::new(model),
            pool,
            sched,
            tokenizer: None,
            prefix,
            pending_imports: Vec::new(),
            metrics: Metrics::default(),
            step_log: Vec::new(),
            kv_peak: 0,
            placement,
            draft_calibration: cfg.draft_calibration.clone().map(Arc::new),
            balancer,
            next_sid: 0,
            cfg,
        })
    }

    fn make_prefix_cache(
        model: &Model<B>,
        cfg: &EngineConfig,
    ) -> Result<PrefixCache<B::Tensor>, EngineError> {
        let disk = match (&cfg.kv_cache_dir, cfg.prefix_caching) {
            (Some(dir), true) => Some(DiskTierConfig {
                dir: dir.clone(),
                capacity_bytes: cfg.kv_cache_dir_size,
            }),
            _ => None,
        };
        let identity = if disk.is_some() {
            model.state_identity()?
        } else {
            0
        };
        let entries = if cfg.prefix_caching {
            cfg.prefix_state_capacity
        } else {
            0
        };
        PrefixCache::new(
            cfg.block_size,
            cfg.window_cache_memory,
            entries,
            identity,
            disk.as_ref(),
        )
        .map_err(|e| EngineError::Config(format!("kv cache dir: {e}")))
    }

    fn make_scheduler(model: &Model<B>, cfg: &EngineConfig) -> Result<Scheduler, EngineError> {
        let mut kv = BlockManagerConfig::new(cfg.num_blocks, cfg.block_size);
        kv.enable_prefix_caching = cfg.prefix_caching;
        // The last window of a prompt is always recomputed (DESIGN.md prefix-hit rule).
        kv.hit_rule = hit_rule(model, cfg);
        let kv = BlockManager::new(kv).map_err(SchedError::from)?;
        let sc = SchedulerConfig {
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            max_num_seqs: cfg.max_num_seqs,
            max_model_len: cfg.max_model_len,
            max_chunk_tokens: cfg.max_num_batched_tokens,
            spec: match (cfg.spec_drafts, cfg.spec_budget) {
                (0, _) => SpecMode::Off,
                (n, SpecBudget::Fixed) => SpecMode::Fixed(n),
                (n, SpecBudget::Budgeted) => SpecMode::Budgeted { max_drafts: n },
            },
            step_time_budget: cfg.step_time_budget_ms,
            min_chunk_tokens: SchedulerConfig::default()
                .min_chunk_tokens
                .min(cfg.max_num_batched_tokens),
            ..SchedulerConfig::default()
        };
        if let Some(ms) = cfg.step_time_budget_ms
            && !(ms.is_finite() && ms > 0.0)
        {
            return Err(EngineError::Config(format!(
                "step_time_budget_ms must be a positive number of milliseconds, not {ms}"
            )));
        }
        let mut sched = Scheduler::new(sc, kv)?;
        if cfg.step_time_budget_ms.is_some() {
            sched = sched.with_cost_model(calibrate_prefill(model, cfg)?);
        }
        Ok(
            if cfg.spec_drafts > 0 && cfg.spec_budget == SpecBudget::Budgeted {
                let planner = Planner::new(
                    calibrate(model, cfg.max_num_batched_tokens)?,
                    PlannerConfig {
                        search: Search::Full,
                        max_total_rows: Some(cfg.max_num_batched_tokens),
                        max_drafts_per_request: Some(cfg.spec_drafts),
                    },
                )
                .map_err(|e| EngineError::Config(format!("draft planner: {e}")))?;
                sched.with_planner(planner)
            } else {
                sched
            },
        )
    }

    /// Attach a tokenizer: outputs then carry text, reasoning and tool calls.
    ///
    /// Builds the tokenizer's per-token text table here (about 0.1 s for a 129k vocabulary,
    /// once per tokenizer), so the stream parsers do not pay for it inside the first step.
    pub fn with_tokenizer(mut self, tokenizer: Arc<PromptTokenizer>) -> Self {
        tokenizer.token_texts();
        self.tokenizer = Some(tokenizer);
        self
    }

    /// The model.
    pub fn model(&self) -> &Model<B> {
        &self.model
    }

    /// The tokenizer, if attached.
    pub fn tokenizer(&self) -> Option<&Arc<PromptTokenizer>> {
        self.tokenizer.as_ref()
    }

    /// Counters so far.
    pub fn metrics(&self) -> Metrics {
        let disk = self.prefix.disk_counters();
        let (lb_c, lb_p) = self
            .balancer
            .as_ref()
            .and_then(|b| b.last_lb)
            .unwrap_or((0.0, 0.0));
        Metrics {
            eplb_rebalances: self.balancer.as_ref().map_or(0, |b| b.rebalances),
            eplb_moved_slots: self.balancer.as_ref().map_or(0, |b| b.moved_slots),
            moe_lb_contiguous: lb_c,
            moe_lb_placed: lb_p,
            preemptions: self.sched.stats().preemptions,
            prefix_states: self.prefix.len(),
            disk_writes: disk.writes,
            disk_rejected: disk.rejected,
            ..self.metrics
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The recent steps, oldest first.
    pub fn step_history(&self) -> &[StepRecord] {
        &self.step_log
    }

    /// Percentiles of the recent step wall times.
    pub fn step_times(&self) -> StepTimes {
        StepTimes::of_steps(&self.step_log, |_| true)
    }

    /// Waits until every prefix state queued for the persistent tier is written (dropping
    /// the engine does the same). States kept after this call stay on the host.
    pub fn flush_kv_cache_dir(&mut self) {
        self.prefix.flush();
    }

    /// The run's figures as `--metrics-json` writes them: cached prompt tokens by the tier
    /// their state came from (device pool, host tier, persistent tier).
    pub fn metrics_json(&self) -> serde_json::Value {
        let m = self.metrics();
        let st = self.step_times();
        let (total, peak) = self.kv_blocks();
        serde_json::json!({
            "prompt_tokens": m.prompt_tokens,
            "computed_prompt_tokens": m.prompt_tokens.saturating_sub(m.cached_prompt_tokens),
            "cached_tokens": {
                "device": m.cached_prompt_tokens - m.cached_host_tokens - m.cached_disk_tokens,
                "host": m.cached_host_tokens,
                "disk": m.cached_disk_tokens,
            },
            "host_states": {"entries": m.prefix_states, "bytes": self.prefix.host_bytes()},
            "disk_states": {"written": m.disk_writes, "rejected": m.disk_rejected},
            "replayed_tokens": m.replayed_tokens,
            "bounded_replays": m.bounded_replays,
            "generated_tokens": m.generated_tokens,
            "preemptions": m.preemptions,
            "steps": m.steps,
            "step_ms": {"p50": st.p50, "p99": st.p99, "max": st.max},
            "kv_blocks": {"total": total, "peak": peak},
            "eplb": self.balancer.as_ref().map(|b| serde_json::json!({
                "rebalances": b.rebalances,
                "moved_slots": b.moved_slots,
                "moe_lb_contiguous": m.moe_lb_contiguous,
                "moe_lb_placed": m.moe_lb_placed,
            })),
        })
    }

    /// KV blocks held by sequences now (0 between calls: a finished or aborted request
    /// leaves none behind).
    pub fn kv_blocks_in_use(&self) -> usize {
        self.sched.kv().pool().usage().used
    }

    /// Forget every cached prefix: the host tier's states and the device pool's cached
    /// blocks. The persistent tier keeps its files.
    pub fn reset_prefix_cache(&mut self) {
        while self.prefix.evict_lru() {}
        self.sched.kv_mut().evict_cached(usize::MAX);
    }

    /// The KV pool as sized at start-up: blocks, tokens per block, bytes per block and per
    /// running sequence.
    pub fn kv_pool(&self) -> KvPool {
        self.pool
    }

    /// KV blocks of the pool, and the most in use at once so far.
    pub fn kv_blocks(&self) -> (usize, usize) {
        (self.sched.kv().pool().num_blocks(), self.kv_peak)
    }

    /// Run every request to completion; outputs in request order. Any invalid request fails
    /// the whole call (use [`Engine::generate_each`] to get per-request errors).
    pub fn generate(&mut self, requests: Vec<Request>) -> Result<Vec<Output>, EngineError> {
        self.generate_each(requests)?.into_iter().collect()
    }

    /// Run every valid request to completion; invalid ones come back as errors in their slot.
    /// A request with `n > 1` fills `n` consecutive slots (its samples in index order); an
    /// invalid one fills one.
    pub fn generate_each(
        &mut self,
        requests: Vec<Request>,
    ) -> Result<Vec<Result<Output, EngineError>>, EngineError> {
        let order: Vec<RequestId> = requests.iter().map(|r| r.id).collect();
        let mut done: HashMap<RequestId, Vec<Result<Output, EngineError>>> = HashMap::new();
        let mut valid = Vec::new();
        for r in requests {
            match self.check_request(&r) {
                Ok(())
                    if !done.contains_key(&r.id)
                        && !valid.iter().any(|v: &Request| v.id == r.id) =>
                {
                    valid.push(r)
                }
                Ok(()) => {
                    done.insert(
                        r.id,
                        vec![Err(EngineError::InvalidRequest {
                            id: r.id,
                            reason: "duplicate request id".into(),
                        })],
                    );
                }
                Err(e) => {
                    done.insert(r.id, vec![Err(e)]);
                }
            }
        }
        self.generate_stream(valid, |ev| {
            if let StreamEvent::Finished(o) = ev {
                done.entry(o.id).or_default().push(Ok((**o).clone()));
            }
            true
        })?;
        let mut out = Vec::new();
        for id in order {
            match done.remove(&id) {
                Some(mut v) => {
                    v.sort_by_key(|o| o.as_ref().map(|o| o.index).unwrap_or(0));
                    out.extend(v);
                }
                None => out.push(Err(EngineError::InvalidRequest {
                    id,
                    reason: "duplicate request id".into(),
                })),
            }
        }
        Ok(out)
    }

    /// Run requests to completion, calling `on_event` for every token, text delta and
    /// finished output. Returning `false` from `on_event` aborts that event's request (it
    /// finishes with [`FinishReason::Aborted`] and what it generated so far).
    pub fn generate_stream(
        &mut self,
        requests: Vec<Request>,
        on_event: impl FnMut(&StreamEvent) -> bool,
    ) -> Result<(), EngineError> {
        self.drive(requests, &mut Offline(on_event))
    }

    /// Run the step loop for `requests` and whatever `driver` submits between steps, until
    /// the driver closes and no request is left.
    pub(crate) fn drive(
        &mut self,
        requests: Vec<Request>,
        driver: &mut dyn Driver,
    ) -> Result<(), EngineError> {
        let t0 = Instant::now();
        let mut live: HashMap<u64, Live<B::Tensor>> = HashMap::new();
        for r in requests {
            self.check_request(&r)?;
            self.admit(r, &mut live)?;
        }
        // Overlap needs a free pool thread for the device loop: a caller that is itself a
        // rayon worker (it could hold the only one) runs in order.
        if !self.cfg.overlap || rayon::current_thread_index().is_some() {
            return self.step_loop(&mut live, None, t0, driver);
        }
        let model = self.model.clone();
        let jcfg = self.job_cfg();
        std::thread::scope(|scope| {
            let (jobs, job_rx) = mpsc::channel::<Job<B::Tensor>>();
            let (res_tx, results) = mpsc::channel();
            let (done_tx, done) = crossbeam_channel::bounded(1);
            // The device loop lives on one thread of rayon's pool for the whole call, so a
            // step costs one hand-over each way (host → loop, loop → host), as the in-order
            // loop's `on_pool` does, and the forward's parallel loops start from inside the pool.
            // A driver that waits for work between requests (online) runs the loop on a
            // thread of its own instead: parked on the pool it would hold a worker while
            // idle, and engines sharing the pool could hold every worker.
            // Expert-parallel ranks wait on each other: the loop stays off the pool their
            // kernels need.
            let park = driver.park_on_pool() && jcfg.expert_parallel <= 1;
            scope.spawn(move || {
                let device_loop = move || {
                    for job in job_rx {
                        // The result first: whoever sees `done` finds it there.
                        if res_tx.send(run_job(&model, &jcfg, job)).is_err()
                            || done_tx.send(()).is_err()
                        {
                            break;
                        }
                    }
                };
                if park {
                    on_pool(device_loop)
                } else {
                    device_loop()
                }
            });
            let worker = Worker {
                jobs,
                results,
                done,
            };
            // Debug mode: any device read on this thread fails loudly from here on.
            let _phase = self.cfg.sync_check.then(LaunchPhase::enter);
            // `worker` drops at the end of this closure: its channel closes, the loop ends.
            self.step_loop(&mut live, Some(&worker), t0, driver)
        })
    }

    fn job_cfg(&self) -> JobCfg {
        JobCfg {
            vocab: self.model.cfg.vocab_size,
            eos: self.model.cfg.eos_token_id.map(|e| e as u32),
            snapshot_block: self.cfg.prefix_caching.then_some(self.cfg.block_size),
            spec_drafts: self.cfg.spec_drafts,
            draft_calibration: self.draft_calibration.clone(),
            expert_parallel: self.cfg.expert_parallel,
            placement: None,
        }
    }
}

/// The device worker's two channels (overlapped scheduling).
struct Worker<T> {
    jobs: mpsc::Sender<Job<T>>,
    results: mpsc::Receiver<Result<JobOut<T>, EngineError>>,
    /// One message per job, after its result: what the loop waits on beside new requests.
    done: crossbeam_channel::Receiver<()>,
}

/// A step's tokens and finished requests, parsed while the next step computes.
struct Post {
    toks: Vec<(u64, Vec<Tok>)>,
    finished: Vec<Finished>,
}

/// Run `f` on a thread of rayon's global pool (the forward's parallel loops then stay on
/// that pool instead of handing every operation over from an outside thread).
fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// Forget the model state of preempted requests (recomputed on re-admission: the state goes
/// with the KV blocks).
fn drop_states<T>(ids: &[RequestId], live: &mut HashMap<u64, Live<T>>) {
    for id in ids {
        if let Some(l) = live.get_mut(id) {
            l.dev.state = None;
            l.dev.next_draft = None;
        }
    }
}
