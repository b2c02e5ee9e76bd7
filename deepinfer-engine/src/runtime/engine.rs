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

use super::device::{
    Dev, DevStats, Fixed, Job, JobCfg, JobOut, JobSeq, Tok, free_global_blocks, run_job,
};
use super::prefix_cache::{DiskTierConfig, PrefixCache};
use super::request::GrammarConstraint;
use super::request::{
    FinishReason, Output, Request, RequestId, Timing, TokenLogprob, ToolCallOut, Usage,
};
use crate::model::sync::LaunchPhase;
use crate::{BatchItem, Logits, Model, ModelError};
use deepinfer_kernels::Backend;
use deepinfer_kv::{BlockManager, BlockManagerConfig, ExtraKeys, HitRule, Tier};
use deepinfer_recipe::parser::{BackendFinish, Event, FinishReason as ParseFinish};
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

/// Engine settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// KV blocks in the pool (the memory budget: fewer blocks means preemption sooner).
    pub num_blocks: usize,
    /// Tokens per KV block (also the granularity of prefix hits).
    pub block_size: usize,
    /// Most sequences in one step.
    pub max_num_seqs: usize,
    /// Most rows (tokens) in one step.
    pub max_num_batched_tokens: usize,
    /// Context limit (prompt + generated).
    pub max_model_len: usize,
    /// Reuse the model state of cached prompt prefixes.
    pub prefix_caching: bool,
    /// Most prefix model-state snapshots kept in the host tier (LRU).
    pub prefix_state_capacity: usize,
    /// A prefill keeps a prefix state at every multiple of this many tokens (rounded up to
    /// a multiple of `block_size`; 0: only at each prompt's largest reusable prefix), so prompts sharing
    /// a prefix with different tails resume at most this far before where they diverge
    /// instead of recomputing from the start. Each point is one more forward call.
    pub prefix_state_interval: usize,
    /// Most bytes of prefix model states kept in the host tier (LRU): each state's window
    /// rows, open compressor rows, drafter windows and the global entries it references.
    pub window_cache_memory: u64,
    /// The persistent tier: a directory where every prefix state the host tier keeps is
    /// also written (checksummed files, lifetimes per traffic class), for later processes
    /// of the same model, backend and cache format. `None`: the cache ends with the process.
    pub kv_cache_dir: Option<PathBuf>,
    /// Most bytes the persistent tier keeps before least recently used states are reclaimed.
    pub kv_cache_dir_size: u64,
    /// DSpark drafts verified per decode row; 0 turns speculation off. Needs a model with the
    /// drafter; at most its block size. With [`SpecBudget::Budgeted`] the most per row.
    /// Verification samples every position as plain decoding does and keeps a draft iff it
    /// equals that token, so outputs (greedy or seeded) are those without drafts.
    pub spec_drafts: usize,
    /// Fixed drafts per row, or a per-step budget from the `deepinfer-spec` planner.
    pub spec_budget: SpecBudget,
    /// Overlapped scheduling: step N's device work runs on a worker thread while this
    /// thread parses step N−1's tokens and plans step N+1 (see the module docs). Outputs
    /// are the same either way; off runs every step in order. The device loop runs on a
    /// thread of rayon's global pool; a `generate` call made from inside a rayon pool runs in
    /// order (it could hold the pool's only thread).
    pub overlap: bool,
    /// Debug mode: with overlap, fail with [`ModelError::HostSync`] when the host thread
    /// reads device results while a step is in flight (a host–device synchronisation).
    pub sync_check: bool,
    /// Blocks of the model's global-state pool (compressed entries and indexer keys of every
    /// sequence and snapshot). `None`: sized from this configuration (KV pool, sequences,
    /// prefix snapshots). When it runs out, snapshots are skipped (recomputed instead) and a
    /// forward that cannot grow fails with [`ModelError::GlobalCacheFull`].
    pub global_cache_blocks: Option<usize>,
    /// Time-budgeted chunked prefill: each step prefills the largest chunks the scheduler's
    /// cost model `cost(q, c)` predicts to fit this many milliseconds together with the
    /// step's decode rows (at least `min_chunk_tokens` when nothing else runs). The model
    /// is fitted from a short calibration at start-up and refitted online from the measured
    /// step times. `None`: chunks are bounded by the token budget only.
    pub step_time_budget_ms: Option<f64>,
    /// Tokens beyond the last window that a prefix hit always recomputes (DeepSeek's hit
    /// rule: a hit reuses at most `L − window − spec_slack` prompt tokens, L − 134 for
    /// V4.1-Flash's window of 128 with the default 6). Independent of `spec_drafts`.
    pub spec_slack: usize,
}

/// How many drafts each decode row verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecBudget {
    /// Every decode row verifies `spec_drafts` drafts (fixed-length verification: the work
    /// per row does not depend on its batch-mates).
    #[default]
    Fixed,
    /// The `deepinfer-spec` planner splits a step's rows between requests (0 ..= `spec_drafts`
    /// each) from the drafter's confidences and a step-time model calibrated at start-up and
    /// corrected online from the measured step times. Tokens are the same as with fixed
    /// drafts or none (verification keeps only drafts equal to the sampled token); only the
    /// work per step changes.
    Budgeted,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            num_blocks: 4096,
            block_size: 16,
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            max_model_len: 8192,
            prefix_caching: true,
            prefix_state_capacity: 512,
            prefix_state_interval: 512,
            window_cache_memory: 1 << 30,
            kv_cache_dir: None,
            kv_cache_dir_size: 8 << 30,
            spec_drafts: 0,
            spec_budget: SpecBudget::Fixed,
            overlap: true,
            sync_check: false,
            global_cache_blocks: None,
            step_time_budget_ms: None,
            spec_slack: 6,
        }
    }
}

/// How many recent step times [`Engine::step_times`] summarises.
pub const STEP_HISTORY: usize = 65_536;

/// Step wall-time percentiles, ms.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    /// Steps summarised.
    pub steps: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest.
    pub max: f64,
}

impl StepTimes {
    /// The percentiles of `ms` (nearest rank).
    pub fn of(ms: &[f32]) -> Self {
        if ms.is_empty() {
            return Self::default();
        }
        let mut v = ms.to_vec();
        v.sort_by(f32::total_cmp);
        let at =
            |q: f64| f64::from(v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]);
        Self {
            steps: v.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

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

/// Counters over the engine's life.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Metrics {
    /// Steps run.
    pub steps: u64,
    /// Forward calls (a step may split a prefill at a snapshot point into two).
    pub forward_calls: u64,
    /// Rows (tokens) through the model, replays included.
    pub forward_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Prompt tokens of admitted requests (once per request, whatever its `n`).
    pub prompt_tokens: u64,
    /// Prompt tokens the scheduler served from the prefix cache (first admissions), all
    /// tiers together.
    pub cached_prompt_tokens: u64,
    /// Of those, tokens whose blocks came back from the host tier (evicted from the device
    /// pool, their state still held on the host).
    pub cached_host_tokens: u64,
    /// Of those, tokens whose state came from the persistent tier (`kv_cache_dir`).
    pub cached_disk_tokens: u64,
    /// Prefix states written to the persistent tier.
    pub disk_writes: u64,
    /// Files of the persistent tier found unusable (damaged, foreign, other tokens): misses.
    pub disk_rejected: u64,
    /// Resumes (prefix hits, re-admissions) whose state came from a snapshot.
    pub state_snapshot_hits: u64,
    /// Tokens replayed to rebuild a state no snapshot covered.
    pub replayed_tokens: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Prefix model-state snapshots held now.
    pub prefix_states: usize,
    /// Draft tokens proposed by the drafter.
    pub draft_tokens: u64,
    /// Draft tokens accepted by verification.
    pub accepted_drafts: u64,
    /// Decode rows that verified drafts.
    pub spec_rows: u64,
    /// Decode rows, with or without drafts (the denominator of tokens per decode row).
    pub decode_rows: u64,
    /// Time in the model's forward, ms.
    pub forward_ms: f64,
    /// Time in the sampler and draft verification, ms.
    pub sample_ms: f64,
    /// Time in the DSpark drafter, ms.
    pub draft_ms: f64,
    /// Time in `schedule` + `update`, ms.
    pub sched_ms: f64,
    /// Time in the stream parser and output bookkeeping, ms.
    pub post_ms: f64,
    /// Time filling grammar bitmasks and advancing matchers, ms.
    pub grammar_ms: f64,
    /// Sequences forked from a parent for `n > 1` (sharing its prompt blocks).
    pub forks: u64,
    /// Time building each step's device job (state restores, input rows), ms.
    pub build_ms: f64,
    /// Host work done while a step computed on the device worker (overlapped scheduling:
    /// parsing the previous step, planning the next), ms. Hidden from the step time.
    pub hidden_ms: f64,
    /// Time the host thread waited for the device worker, ms.
    pub wait_ms: f64,
}

/// One streamed event of [`Engine::generate_stream`].
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// A token was generated.
    Token {
        /// The request.
        id: RequestId,
        /// The token.
        token: u32,
        /// Its log-probability.
        logprob: f32,
        /// The best alternatives (`sampling.top_logprobs` of them, when log-probabilities
        /// were asked for).
        top: Vec<(u32, f32)>,
    },
    /// Answer text.
    Text {
        /// The request.
        id: RequestId,
        /// Text delta.
        delta: String,
    },
    /// Reasoning text.
    Reasoning {
        /// The request.
        id: RequestId,
        /// Text delta.
        delta: String,
    },
    /// A stream-parser event of one of the request's samples (answer or reasoning text,
    /// tool-call start, arguments and end, finish), in order: what a protocol's streaming
    /// renderer (`deepinfer_recipe::protocol`) consumes. Every `Text` and `Reasoning` event
    /// also comes as one of these.
    Parsed {
        /// The request.
        id: RequestId,
        /// Which of its `n` samples.
        index: usize,
        /// The event.
        event: Event,
    },
    /// The request was planned into a step for the first time (its queueing ended).
    Scheduled {
        /// The request.
        id: RequestId,
    },
    /// The request finished.
    Finished(Box<Output>),
}

impl StreamEvent {
    /// The request the event belongs to.
    pub fn request(&self) -> RequestId {
        match self {
            StreamEvent::Token { id, .. }
            | StreamEvent::Text { id, .. }
            | StreamEvent::Reasoning { id, .. }
            | StreamEvent::Parsed { id, .. }
            | StreamEvent::Scheduled { id } => *id,
            StreamEvent::Finished(o) => o.id,
        }
    }
}

/// A request in flight.
struct Live<T> {
    user_id: RequestId,
    /// Which of the request's `n` samples.
    index: usize,
    fx: Arc<Fixed>,
    /// Fork group parent still to fork: its last prompt token is fed as a forced "output"
    /// (the scheduler holds the prompt minus that token), then `n - 1` children are forked.
    forced: Option<u32>,
    /// Leading scheduler output tokens that are prompt, not generated (the forced token).
    strip: usize,
    /// How children of a fork group are set up.
    parsing: Option<ParsingOptions>,
    grammar: Option<GrammarConstraint>,
    /// Where a prefix-hit snapshot is taken: the largest reusable prefix of this prompt.
    cut: usize,
    /// Prompt tokens whose blocks were brought back into the device pool from a slower tier
    /// at admission, and that tier.
    imported: Option<(usize, Tier)>,
    /// Model state, matcher, pending drafts, history: with the device worker during a step.
    dev: Dev<T>,
    parser: Option<StreamParser>,
    logprobs: Vec<TokenLogprob>,
    text: String,
    reasoning: String,
    calls: Vec<ToolCallOut>,
    parse_finish: Option<ParseFinish>,
    cached: Option<usize>,
    first_token: Option<f64>,
    last_token: f64,
    /// Generated tokens parsed so far.
    ngen: usize,
    /// Generated tokens the output keeps, once a stop sequence or an abort ended it.
    kept: Option<usize>,
    /// A stop sequence ended the output.
    stopped: bool,
}

/// The engine: a model on a backend plus scheduler, sampler and (optionally) a tokenizer.
pub struct Engine<B: Backend> {
    model: Arc<Model<B>>,
    cfg: EngineConfig,
    sched: Scheduler,
    tokenizer: Option<Arc<PromptTokenizer>>,
    prefix: PrefixCache<B::Tensor>,
    metrics: Metrics,
    /// Recent step wall times, ms (the last [`STEP_HISTORY`] at most).
    step_times: Vec<f32>,
    /// Most KV blocks in use at once.
    kv_peak: usize,
    /// Requests planned for the first time by the step being built.
    first_scheduled: Vec<RequestId>,
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
    /// An engine over `model`. Sizes the model's global-state block pool from the
    /// configuration ([`EngineConfig::global_cache_blocks`]) while no state holds a block.
    pub fn new(mut model: Model<B>, cfg: EngineConfig) -> Result<Self, EngineError> {
        if cfg.block_size == 0 || cfg.num_blocks == 0 {
            return Err(EngineError::Config(
                "num_blocks and block_size must be positive".into(),
            ));
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
        let want = cfg
            .global_cache_blocks
            .unwrap_or_else(|| default_global_blocks(&model, &cfg));
        if want == 0 {
            return Err(EngineError::Config(
                "global_cache_blocks must be positive".into(),
            ));
        }
        let free = model.global_cache().lock().map_or(0, |g| g.used_blocks()) == 0;
        if model.global_cache_blocks() != want {
            if free {
                model.set_global_cache_blocks(want)?;
            } else if cfg.global_cache_blocks.is_some() {
                return Err(EngineError::Config(
                    "global_cache_blocks: the model's global cache is in use by other states"
                        .into(),
                ));
            }
        }
        let sched = Self::make_scheduler(&model, &cfg)?;
        let prefix = Self::make_prefix_cache(&model, &cfg)?;
        Ok(Self {
            model: Arc::new(model),
            sched,
            tokenizer: None,
            prefix,
            metrics: Metrics::default(),
            step_times: Vec::new(),
            kv_peak: 0,
            first_scheduled: Vec::new(),
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
        Metrics {
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

    /// The recent step wall times, ms, oldest first.
    pub fn step_time_history(&self) -> &[f32] {
        &self.step_times
    }

    /// Percentiles of the recent step wall times.
    pub fn step_times(&self) -> StepTimes {
        StepTimes::of(&self.step_times)
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
            "generated_tokens": m.generated_tokens,
            "preemptions": m.preemptions,
            "steps": m.steps,
            "step_ms": {"p50": st.p50, "p99": st.p99, "max": st.max},
            "kv_blocks": {"total": total, "peak": peak},
        })
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

    /// Whether a request can run on this engine (prompt, vocabulary, limits, parameters).
    pub fn check_request(&self, r: &Request) -> Result<(), EngineError> {
        self.limits().check(r)
    }

    /// A check of requests against this engine's limits that outlives the borrow (for a
    /// front end on another thread).
    pub fn request_checker(
        &self,
    ) -> impl Fn(&Request) -> Result<(), EngineError> + Send + Sync + 'static {
        let limits = self.limits();
        move |r| limits.check(r)
    }

    fn limits(&self) -> Limits {
        Limits {
            vocab: self.model.cfg.vocab_size,
            max_model_len: self.cfg.max_model_len,
            kv_tokens: self.cfg.num_blocks * self.cfg.block_size,
        }
    }

    /// Add a checked request to the scheduler: one sequence, or for `n > 1` a fork group (a
    /// parent that prefills the prompt once, then forks `n - 1` children sharing its blocks)
    /// or, when the prompt cannot be split that way, `n` independent sequences.
    fn admit(
        &mut self,
        r: Request,
        live: &mut HashMap<u64, Live<B::Tensor>>,
    ) -> Result<(), EngineError> {
        self.metrics.prompt_tokens += r.prompt.len() as u64;
        let eos = self.model.cfg.eos_token_id.map(|e| e as u32);
        let mut stop_tokens = r.params.stop_token_ids.clone();
        if r.params.stop_at_eos
            && let Some(e) = eos
        {
            stop_tokens.push(e);
        }
        let n = r.params.n.max(1);
        let last = r.prompt[r.prompt.len() - 1];
        let fork = n > 1 && r.prompt.len() >= 2 && !stop_tokens.contains(&last);
        let copies = if n > 1 && !fork { n } else { 1 };
        let cut = hit_rule(&self.model, &self.cfg)
            .max_reusable_tokens(r.prompt.len(), self.cfg.block_size);
        let imported = self.import_prefix(&r.prompt, cut);
        for index in 0..copies {
            let sid = self.next_sid;
            self.next_sid += 1;
            let mut params = r.params.clone();
            params.sampling.seed = params.sampling.seed.wrapping_add(index as u64);
            let nr = if fork {
                let mut nr = NewRequest::new(
                    sid,
                    r.prompt[..r.prompt.len() - 1].to_vec(),
                    r.params.max_tokens + 1,
                );
                nr.stop_tokens = stop_tokens.clone();
                nr
            } else {
                let mut nr = NewRequest::new(sid, r.prompt.clone(), r.params.max_tokens);
                nr.stop_tokens = stop_tokens.clone();
                nr
            };
            self.sched.add_request(nr)?;
            let l = Live {
                user_id: r.id,
                index,
                fx: Arc::new(Fixed {
                    params,
                    stop_tokens: stop_tokens.clone(),
                    prompt_len: r.prompt.len(),
                }),
                forced: fork.then_some(last),
                strip: usize::from(fork),
                parsing: r.parsing.clone(),
                grammar: r.grammar.clone(),
                cut,
                imported,
                dev: Dev {
                    matcher: r.grammar.as_ref().map(GrammarConstraint::matcher),
                    ..Dev::default()
                },
                parser: self.parser_for(r.parsing.as_ref()),
                logprobs: Vec::new(),
                text: String::new(),
                reasoning: String::new(),
                calls: Vec::new(),
                parse_finish: None,
                cached: None,
                first_token: None,
                last_token: 0.0,
                ngen: 0,
                kept: None,
                stopped: false,
            };
            live.insert(sid, l);
        }
        Ok(())
    }

    /// Brings the longest prefix of `prompt[..cut]` whose state a slower tier holds (host, or
    /// disk: loaded into the host tier now) back into the scheduler's device pool, so the
    /// scheduler's allocation hits it. Returns the tokens imported and the tier.
    fn import_prefix(&mut self, prompt: &[u32], cut: usize) -> Option<(usize, Tier)> {
        if !self.cfg.prefix_caching || cut == 0 {
            return None;
        }
        let (len, tier) = self.prefix.reach(&self.model, &prompt[..cut])?;
        let bs = self.cfg.block_size;
        // No free block to import into: the device pool misses and the prefix is replayed
        // from the host state instead (still exact).
        let blocks = self
            .sched
            .kv_mut()
            .import_blocks(prompt, &ExtraKeys::none(), 0, len / bs)
            .ok()?;
        (!blocks.is_empty()).then_some((blocks.len() * bs, tier))
    }

    fn parser_for(&self, parsing: Option<&ParsingOptions>) -> Option<StreamParser> {
        match (&self.tokenizer, parsing) {
            (Some(tok), Some(p)) => Some(StreamParser::new(tok.clone(), p)),
            (Some(tok), None) => Some(StreamParser::new(tok.clone(), &plain_parsing())),
            _ => None,
        }
    }

    /// Fork the `n - 1` children of a fork-group parent whose prompt is now complete.
    fn fork_children(
        &mut self,
        parent: u64,
        live: &mut HashMap<u64, Live<B::Tensor>>,
    ) -> Result<(), EngineError> {
        let Some(p) = live.get(&parent) else {
            return Ok(());
        };
        let n = p.fx.params.n.max(1);
        let base_seed = p.fx.params.sampling.seed;
        let mut children = Vec::with_capacity(n - 1);
        for index in 1..n {
            let sid = self.next_sid;
            self.next_sid += 1;
            self.sched.fork(parent, sid)?;
            self.metrics.forks += 1;
            let mut params = p.fx.params.clone();
            params.sampling.seed = base_seed.wrapping_add(index as u64);
            // No room for the state copy: the child rebuilds it by replay.
            let state = p.dev.state.as_ref().and_then(|s| s.try_clone().ok());
            children.push((
                sid,
                Live {
                    user_id: p.user_id,
                    index,
                    fx: Arc::new(Fixed {
                        params,
                        stop_tokens: p.fx.stop_tokens.clone(),
                        prompt_len: p.fx.prompt_len,
                    }),
                    forced: None,
                    strip: p.strip,
                    parsing: p.parsing.clone(),
                    grammar: p.grammar.clone(),
                    cut: p.cut,
                    imported: p.imported,
                    dev: Dev {
                        state,
                        matcher: p.grammar.as_ref().map(GrammarConstraint::matcher),
                        hist: p.dev.hist.clone(),
                        ..Dev::default()
                    },
                    parser: self.parser_for(p.parsing.as_ref()),
                    logprobs: Vec::new(),
                    text: String::new(),
                    reasoning: String::new(),
                    calls: Vec::new(),
                    parse_finish: None,
                    cached: p.cached,
                    first_token: None,
                    last_token: 0.0,
                    ngen: 0,
                    kept: None,
                    stopped: false,
                },
            ));
        }
        live.extend(children);
        Ok(())
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
            // The device loop lives on one thread of rayon's pool for the whole call, so a
            // step costs one hand-over each way (host → loop, loop → host), as the in-order
            // loop's `on_pool` does, and the forward's parallel loops start from inside the pool.
            // A driver that waits for work between requests (online) runs the loop on a
            // thread of its own instead: parked on the pool it would hold a worker while
            // idle, and engines sharing the pool could hold every worker.
            let park = driver.park_on_pool();
            scope.spawn(move || {
                let device_loop = move || {
                    for job in job_rx {
                        if res_tx.send(run_job(&model, &jcfg, job)).is_err() {
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
            let worker = Worker { jobs, results };
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
        }
    }

    /// The step loop. Without a worker every step runs in order (schedule, device work,
    /// parse, update). With one, see the module docs: step N's device work runs on the
    /// worker while this thread parses step N−1's tokens and plans step N+1.
    fn step_loop(
        &mut self,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        worker: Option<&Worker<B::Tensor>>,
        t0: Instant,
        driver: &mut dyn Driver,
    ) -> Result<(), EngineError> {
        let overlap = worker.is_some();
        let jcfg = self.job_cfg();
        let mut plan = StepPlan::default();
        let mut ahead = StepPlan::default();
        let mut have_ahead = false;
        let mut out = StepOutput::default();
        let mut ids: Vec<u32> = Vec::new();
        // Overlap: the step just updated, parsed while the next one computes.
        let mut post: Option<Post> = None;
        loop {
            if have_ahead {
                std::mem::swap(&mut plan, &mut ahead);
                have_ahead = false;
            } else {
                driver.observe(
                    self.sched.num_running(),
                    self.sched.num_waiting(),
                    &self.metrics(),
                );
                if self.sched.is_idle() {
                    // Report the last step before waiting for more work.
                    if let Some(p) = post.take() {
                        self.post_process(p, live, t0, driver)?;
                    }
                    if !self.take_commands(driver, live, t0, true) {
                        break;
                    }
                    if self.sched.is_idle() {
                        continue;
                    }
                } else {
                    self.take_commands(driver, live, t0, false);
                }
                let ts = Instant::now();
                {
                    let _span = tracing::debug_span!("schedule").entered();
                    self.sched.schedule_into(&mut plan)?;
                }
                self.metrics.sched_ms += ms_since(ts);
                drop_states(&plan.preempted, live);
                if plan.is_empty() {
                    return Err(EngineError::Stuck(
                        self.sched.num_running() + self.sched.num_waiting(),
                    ));
                }
            }
            if plan.is_empty() {
                // Everything planned ahead was cancelled by the last update: retire it.
                out.clear(plan.step);
                let ts = Instant::now();
                let res = self.sched.update(&out)?;
                self.metrics.sched_ms += ms_since(ts);
                drop_states(&res.preempted, live);
                continue;
            }
            self.metrics.steps += 1;
            self.metrics.decode_rows += plan.decode.len() as u64;
            let tb = Instant::now();
            let (job, drain) = {
                let _span = tracing::debug_span!("build").entered();
                self.build_job(&plan, live)?
            };
            for id in std::mem::take(&mut self.first_scheduled) {
                driver.event(&StreamEvent::Scheduled { id });
            }
            self.metrics.build_ms += ms_since(tb);
            let launched = Instant::now();
            let done = match worker {
                None => {
                    let model = &*self.model;
                    on_pool(|| run_job(model, &jcfg, job))
                }
                Some(w) => {
                    w.jobs
                        .send(job)
                        .map_err(|_| EngineError::Worker("the device worker stopped".into()))?;
                    // Host work while the step computes: the previous step's tokens, then
                    // the next plan (not when this step forks: a fork needs its parent
                    // out of flight).
                    if let Some(p) = post.take() {
                        self.post_process(p, live, t0, driver)?;
                    }
                    // New requests and aborts join before the next plan is made.
                    self.take_commands(driver, live, t0, false);
                    if !drain && !self.sched.is_idle() {
                        let ts = Instant::now();
                        {
                            let _span = tracing::debug_span!("schedule").entered();
                            self.sched.schedule_into(&mut ahead)?;
                        }
                        self.metrics.sched_ms += ms_since(ts);
                        have_ahead = true;
                    }
                    let host_end = Instant::now();
                    let r = w
                        .results
                        .recv()
                        .map_err(|_| EngineError::Worker("the device worker stopped".into()))?;
                    if let Ok(o) = &r {
                        let end = host_end.min(o.done);
                        self.metrics.hidden_ms +=
                            end.saturating_duration_since(launched).as_secs_f64() * 1e3;
                    }
                    self.metrics.wait_ms += ms_since(host_end);
                    r
                }
            }?;
            let step_ms = ms_since(launched);
            if self.step_times.len() >= 2 * STEP_HISTORY {
                self.step_times.drain(..STEP_HISTORY);
            }
            self.step_times.push(step_ms as f32);
            let pool = self.sched.kv().pool();
            self.kv_peak = self.kv_peak.max(pool.num_blocks() - pool.num_free());
            self.add_stats(&done.stats);

            // The step's tokens → the scheduler (without overlap, parsed first so a stop
            // sequence ends the request in this very update).
            let tp = Instant::now();
            for (class, snap) in done.snapshots {
                self.prefix.insert(&self.model, snap, class);
            }
            let now = ms_since(t0);
            let mut aborts = Vec::new();
            let mut to_fork = Vec::new();
            let mut step_toks = Vec::with_capacity(done.seqs.len());
            out.clear(plan.step);
            for s in done.seqs {
                let sid = s.sid;
                if let Some(t) = s.forced {
                    // The prompt's last token, fed as a fork parent's first "output".
                    out.push(sid, &[t], false);
                    if let Some(l) = live.get_mut(&sid) {
                        l.dev = s.dev;
                        l.forced = None;
                        to_fork.push(sid);
                    }
                    continue;
                }
                ids.clear();
                ids.extend(s.toks.iter().map(|t| t.0));
                let Some(l) = live.get_mut(&sid) else {
                    // Ended (stop sequence, abort) while this step computed: the scheduler
                    // ignores the row, but the output must still list it.
                    out.push(sid, &ids, false);
                    continue;
                };
                l.dev = s.dev;
                if overlap {
                    out.push_with_confidences(sid, &ids, false, &s.confs);
                    step_toks.push((sid, s.toks));
                } else {
                    let r =
                        parse_tokens(l, &s.toks, now, &mut self.metrics, &mut |e| driver.event(e));
                    if r.abort {
                        aborts.push(sid);
                    }
                    out.push_with_confidences(sid, &ids[..r.used], r.stopped, &s.confs);
                }
            }
            self.metrics.post_ms += ms_since(tp);
            // The step's wall time feeds the cost models (the draft planner's buckets).
            out.step_ms = Some(step_ms.max(1e-3));
            let tu = Instant::now();
            let res = {
                let _span = tracing::debug_span!("update").entered();
                self.sched.update(&out)?
            };
            if have_ahead {
                res.apply_to(&mut ahead);
                drop_states(&ahead.preempted, live);
            }
            drop_states(&res.preempted, live);
            for sid in to_fork {
                if !res.finished.iter().any(|f| f.id == sid) {
                    self.fork_children(sid, live)?;
                }
            }
            self.metrics.sched_ms += ms_since(tu);
            if overlap {
                post = Some(Post {
                    toks: step_toks,
                    finished: res.finished,
                });
            } else {
                let tp = Instant::now();
                let mut finished = res.finished;
                for sid in aborts {
                    if let Ok(f) = self.sched.abort(sid) {
                        finished.push(f);
                    }
                }
                finish_all(finished, live, t0, &mut |e| driver.event(e));
                self.metrics.post_ms += ms_since(tp);
            }
        }
        if let Some(p) = post.take() {
            self.post_process(p, live, t0, driver)?;
        }
        Ok(())
    }

    /// Overlap: parse a step's tokens (stream parser, events, log-probabilities), end the
    /// requests a stop sequence or the caller ended, and report every finished request.
    fn post_process(
        &mut self,
        p: Post,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        t0: Instant,
        driver: &mut dyn Driver,
    ) -> Result<(), EngineError> {
        let tp = Instant::now();
        let on_event = &mut |e: &StreamEvent| driver.event(e);
        let _span = tracing::debug_span!("parse").entered();
        let now = ms_since(t0);
        let mut finished = p.finished;
        for (sid, toks) in p.toks {
            let Some(l) = live.get_mut(&sid) else {
                continue;
            };
            let r = parse_tokens(l, &toks, now, &mut self.metrics, on_event);
            // The step after this one already runs with the request: end it now (the
            // scheduler drops that step's row) and keep only what was parsed.
            if (r.abort || r.stopped)
                && !finished.iter().any(|f| f.id == sid)
                && let Ok(f) = self.sched.abort(sid)
            {
                finished.push(f);
            }
        }
        finish_all(finished, live, t0, on_event);
        self.metrics.post_ms += ms_since(tp);
        Ok(())
    }

    /// The device work of `plan`: each row group's state (restored from a prefix snapshot
    /// or rebuilt by replay when it is not where the scheduler resumes), input rows, drafts
    /// to verify and sampling settings. Returns whether a fork-group parent emits its
    /// forced token (the step must be updated before the next one is planned).
    fn build_job(
        &mut self,
        plan: &StepPlan,
        live: &mut HashMap<u64, Live<B::Tensor>>,
    ) -> Result<(Job<B::Tensor>, bool), EngineError> {
        let mut job = Vec::with_capacity(plan.num_groups());
        let mut drain = false;
        let bt = self.model.global_block_tokens().max(1);
        let mut reserve = 0;
        let max_len = self
            .cfg
            .max_model_len
            .min(self.cfg.num_blocks * self.cfg.block_size);
        let budgeted = self.cfg.spec_drafts > 0 && self.cfg.spec_budget == SpecBudget::Budgeted;
        let groups = plan
            .prefill
            .iter()
            .map(|c| (c.request, c.start, c.start + c.len, c.samples, 0))
            .chain(
                plan.decode
                    .iter()
                    .map(|d| (d.request, d.position, d.position + 1, true, d.drafts)),
            );
        for (sid, start, end, samples, drafts) in groups {
            let l = live.get_mut(&sid).ok_or(SchedError::UnknownRequest(sid))?;
            if l.cached.is_none() {
                self.first_scheduled.push(l.user_id);
                l.cached = Some(start);
                self.metrics.cached_prompt_tokens += start as u64;
                match l.imported {
                    Some((n, Tier::Host)) => self.metrics.cached_host_tokens += n.min(start) as u64,
                    Some((n, Tier::Disk)) => self.metrics.cached_disk_tokens += n.min(start) as u64,
                    _ => {}
                }
            }
            let toks = self
                .sched
                .tokens(sid)
                .ok_or(SchedError::UnknownRequest(sid))?;
            if end > toks.len() {
                return Err(EngineError::Sched(SchedError::UnknownRequest(sid)));
            }
            if l.dev.state.as_ref().is_none_or(|s| s.pos != start) {
                let st = match self.prefix.lookup(&toks[..start]) {
                    Some(s) => {
                        self.metrics.state_snapshot_hits += 1;
                        s
                    }
                    None => self.model.new_state(),
                };
                self.metrics.replayed_tokens += (start - st.pos) as u64;
                l.dev.state = Some(st);
            }
            let from = l.dev.state.as_ref().map_or(0, |s| s.pos);
            let mut dev = std::mem::take(&mut l.dev);
            dev.rows.clear();
            dev.rows.extend_from_slice(&toks[from..end]);
            // Split at the snapshot point so a later identical prefix can resume there.
            let splits = self.snapshot_points(from, end, l.cut);
            let forced = if samples { l.forced } else { None };
            drain |= forced.is_some();
            let sample = samples && forced.is_none();
            // Drafts past the token or context limit are wasted rows; a plan made while the
            // previous step computed counted one token fewer (overlap), so cap them here
            // from the known tokens, as the in-order loop's scheduler did.
            let left_new =
                (l.fx.params.max_tokens + l.fx.prompt_len).saturating_sub(toks.len() + 1);
            let left_ctx = max_len.saturating_sub(toks.len() + 1);
            let drafts = drafts.min(left_new).min(left_ctx);
            reserve += (dev.rows.len() + drafts).div_ceil(bt) + 1;
            job.push(JobSeq {
                sid,
                fx: l.fx.clone(),
                dev,
                splits,
                to: end,
                sample,
                drafts,
                draft_ahead: sample && budgeted,
                forced,
            });
        }
        // Old prefix snapshots give way to the sequences of this step.
        while free_global_blocks(&self.model) < reserve && self.prefix.evict_lru() {}
        Ok((Job { seqs: job, reserve }, drain))
    }

    /// Offsets inside a prefill of positions `from..end` where the forward pauses so a
    /// prefix state is kept: every multiple of `prefix_state_interval` and the prompt's
    /// largest reusable prefix `cut` (so prompts that share only a prefix with this one, or
    /// extend it, resume near where they diverge).
    fn snapshot_points(&self, from: usize, end: usize, cut: usize) -> Vec<usize> {
        if !self.cfg.prefix_caching {
            return Vec::new();
        }
        let every = self
            .cfg
            .prefix_state_interval
            .next_multiple_of(self.cfg.block_size);
        let mut at: Vec<usize> = match every {
            0 => Vec::new(),
            k => (from / k + 1..)
                .map(|i| i * k)
                .take_while(|&p| p < end)
                .collect(),
        };
        if from < cut && cut < end {
            at.push(cut);
        }
        at.sort_unstable();
        at.dedup();
        at.iter().map(|p| p - from).collect()
    }

    fn add_stats(&mut self, s: &DevStats) {
        let m = &mut self.metrics;
        m.forward_ms += s.forward_ms;
        m.sample_ms += s.sample_ms;
        m.draft_ms += s.draft_ms;
        m.grammar_ms += s.grammar_ms;
        m.forward_calls += s.forward_calls;
        m.forward_tokens += s.forward_tokens;
        m.draft_tokens += s.draft_tokens;
        m.accepted_drafts += s.accepted_drafts;
        m.spec_rows += s.spec_rows;
    }
}

/// What a request must fit: the vocabulary, the context limit and the KV pool.
#[derive(Debug, Clone, Copy)]
struct Limits {
    vocab: usize,
    max_model_len: usize,
    kv_tokens: usize,
}

impl Limits {
    fn check(&self, r: &Request) -> Result<(), EngineError> {
        let bad = |reason: String| EngineError::InvalidRequest { id: r.id, reason };
        let v = self.vocab;
        if r.prompt.is_empty() {
            return Err(bad("empty prompt".into()));
        }
        if let Some(t) = r.prompt.iter().find(|&&t| t as usize >= v) {
            return Err(bad(format!(
                "prompt token {t} outside the vocabulary ({v})"
            )));
        }
        if r.params.max_tokens == 0 {
            return Err(bad("max_tokens must be at least 1".into()));
        }
        if r.prompt.len() >= self.max_model_len {
            return Err(bad(format!(
                "prompt of {} tokens exceeds the context limit of {}",
                r.prompt.len(),
                self.max_model_len
            )));
        }
        if r.prompt.len() + 1 > self.kv_tokens {
            return Err(bad(format!(
                "prompt of {} tokens exceeds the KV pool of {} tokens",
                r.prompt.len(),
                self.kv_tokens
            )));
        }
        r.params
            .sampling
            .validate()
            .map_err(|e| bad(e.to_string()))?;
        if r.params.n == 0 {
            return Err(bad("n must be at least 1".into()));
        }
        if let Some(g) = &r.grammar
            && g.vocab_size > v
        {
            return Err(bad(format!(
                "the grammar's vocabulary ({}) is larger than the model's ({v})",
                g.vocab_size
            )));
        }
        Ok(())
    }
}

/// What the step loop serves: where events go and, between steps, what joins or leaves.
pub(crate) trait Driver {
    /// An event of a request; `false` aborts the request.
    fn event(&mut self, ev: &StreamEvent) -> bool;
    /// Commands that arrived since the last call; with `wait`, block until one does.
    /// `None`: no more will come (the loop ends once no request is left).
    fn poll(&mut self, wait: bool) -> Option<Vec<Command>>;
    /// A submitted request could not be admitted.
    fn rejected(&mut self, id: RequestId, err: EngineError);
    /// The scheduler's queue lengths and the engine's counters, before each plan.
    fn observe(&mut self, running: usize, waiting: usize, metrics: &Metrics);
    /// Whether the device loop may live on a thread of rayon's pool for the whole run.
    fn park_on_pool(&self) -> bool {
        true
    }
}

/// A command to the step loop from outside (see [`super::online`]).
pub(crate) enum Command {
    /// Admit a request (its id unique among live ones).
    Submit(Box<Request>),
    /// End a request now; it finishes as [`FinishReason::Aborted`].
    Abort(RequestId),
    /// End every live request now.
    AbortAll,
}

/// The offline driver: a fixed set of requests, events to a callback.
struct Offline<F>(F);

impl<F: FnMut(&StreamEvent) -> bool> Driver for Offline<F> {
    fn event(&mut self, ev: &StreamEvent) -> bool {
        (self.0)(ev)
    }
    fn poll(&mut self, _wait: bool) -> Option<Vec<Command>> {
        None
    }
    fn rejected(&mut self, _id: RequestId, _err: EngineError) {}
    fn observe(&mut self, _running: usize, _waiting: usize, _metrics: &Metrics) {}
}

impl<B: Backend> Engine<B>
where
    B::Tensor: Clone,
{
    /// Apply the driver's commands; `false` when it has closed.
    fn take_commands(
        &mut self,
        driver: &mut dyn Driver,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        t0: Instant,
        wait: bool,
    ) -> bool {
        let Some(cmds) = driver.poll(wait) else {
            return false;
        };
        for c in cmds {
            match c {
                Command::Submit(r) => {
                    let r = *r;
                    let id = r.id;
                    if let Err(e) = self.check_request(&r).and_then(|()| self.admit(r, live)) {
                        driver.rejected(id, e);
                    }
                }
                Command::Abort(id) => self.abort_user(&[id], live, t0, driver),
                Command::AbortAll => {
                    let mut ids: Vec<RequestId> = live.values().map(|l| l.user_id).collect();
                    ids.sort_unstable();
                    ids.dedup();
                    self.abort_user(&ids, live, t0, driver);
                }
            }
        }
        true
    }

    /// End the live samples of requests `ids` (their blocks go back to the pool now; a row
    /// of theirs in flight is ignored when it returns).
    fn abort_user(
        &mut self,
        ids: &[RequestId],
        live: &mut HashMap<u64, Live<B::Tensor>>,
        t0: Instant,
        driver: &mut dyn Driver,
    ) {
        let mut sids: Vec<u64> = live
            .iter()
            .filter(|(_, l)| ids.contains(&l.user_id))
            .map(|(&sid, _)| sid)
            .collect();
        sids.sort_unstable();
        let finished: Vec<Finished> = sids
            .into_iter()
            .filter_map(|sid| self.sched.abort(sid).ok())
            .collect();
        finish_all(finished, live, t0, &mut |e| driver.event(e));
    }
}

/// The device worker's two channels (overlapped scheduling).
struct Worker<T> {
    jobs: mpsc::Sender<Job<T>>,
    results: mpsc::Receiver<Result<JobOut<T>, EngineError>>,
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

/// What parsing a step's tokens found.
struct Parsed {
    /// Tokens of the step kept (up to the one that completed a stop sequence).
    used: usize,
    /// The caller asked to abort the request.
    abort: bool,
    /// A stop sequence ended the output.
    stopped: bool,
}

/// Feed a step's tokens to the request's output: log-probabilities, token events, the
/// stream parser. Tokens after a stop sequence are dropped.
fn parse_tokens<T>(
    l: &mut Live<T>,
    toks: &[Tok],
    now: f64,
    metrics: &mut Metrics,
    on_event: &mut dyn FnMut(&StreamEvent) -> bool,
) -> Parsed {
    let mut keep = true;
    let mut used = 0;
    for (token, logprob, top) in toks {
        if l.kept.is_some() {
            break;
        }
        used += 1;
        l.ngen += 1;
        metrics.generated_tokens += 1;
        l.first_token.get_or_insert(now);
        l.last_token = now;
        if l.fx.params.logprobs {
            l.logprobs.push(TokenLogprob {
                token: *token,
                logprob: *logprob,
                top: top.clone(),
            });
        }
        keep &= on_event(&StreamEvent::Token {
            id: l.user_id,
            token: *token,
            logprob: *logprob,
            top: if l.fx.params.logprobs {
                top.clone()
            } else {
                Vec::new()
            },
        });
        if !l.fx.stop_tokens.contains(token)
            && let Some(parser) = l.parser.as_mut()
        {
            let evs = parser.push_tokens(&[*token]);
            let stopped = parser.is_stopped();
            keep &= apply_events(l, evs, on_event);
            if stopped {
                l.stopped = true;
                l.kept = Some(l.ngen);
            }
        }
    }
    if !keep && l.kept.is_none() {
        l.kept = Some(l.ngen);
    }
    Parsed {
        used,
        abort: !keep,
        stopped: l.stopped,
    }
}

/// Report finished requests (in order) and forget them.
fn finish_all<T>(
    finished: Vec<Finished>,
    live: &mut HashMap<u64, Live<T>>,
    t0: Instant,
    on_event: &mut dyn FnMut(&StreamEvent) -> bool,
) {
    for f in finished {
        let Some(l) = live.remove(&f.id) else {
            continue;
        };
        let o = finish(l, f, ms_since(t0), on_event);
        on_event(&StreamEvent::Finished(Box::new(o)));
    }
}

/// The global-state pool for `cfg`: the KV pool's tokens in global blocks, plus per running
/// sequence its partly filled block and two transient snapshots (rollback, fork), plus the
/// prefix snapshots at their longest. Running out later only skips snapshots (or fails a
/// step with a typed error), never panics.
fn default_global_blocks<B: Backend>(model: &Model<B>, cfg: &EngineConfig) -> usize
where
    B::Tensor: Clone,
{
    let bt = model.global_block_tokens().max(1);
    let live = (cfg.num_blocks * cfg.block_size).div_ceil(bt) + 3 * cfg.max_num_seqs;
    let snaps = if cfg.prefix_caching {
        cfg.prefix_state_capacity * (cfg.max_model_len.div_ceil(bt) + 1)
    } else {
        0
    };
    (live + snaps).clamp(64, 1 << 22)
}

/// A step-time model for the draft planner: forward passes of 1 and 16 rows on a scratch
/// state (best of three), extended linearly to `max_rows`; the scheduler corrects each
/// bucket online from the measured step times.
fn calibrate<B: Backend>(model: &Model<B>, max_rows: usize) -> Result<StepTimeModel, EngineError>
where
    B::Tensor: Clone,
{
    let time = |rows: usize| -> Result<f64, EngineError> {
        let mut best = f64::INFINITY;
        let toks: Vec<u32> = (0..rows as u32).map(|i| 3 + i % 64).collect();
        for _ in 0..3 {
            let mut st = model.new_state();
            let t = Instant::now();
            model.forward(
                &mut [BatchItem {
                    state: &mut st,
                    tokens: &toks,
                }],
                Logits::Last,
                None,
            )?;
            best = best.min(ms_since(t));
        }
        Ok(best.max(1e-3))
    };
    let hi = max_rows.clamp(2, 16);
    let (t1, th) = (time(1)?, time(hi)?);
    let slope = ((th - t1) / (hi - 1) as f64).max(t1 * 1e-3);
    let base = (t1 - slope).max(t1 * 0.1);
    let mut points = Vec::new();
    let mut r = 1;
    while r < max_rows {
        points.push((r, base + slope * r as f64));
        r *= 2;
    }
    points.push((max_rows, base + slope * max_rows as f64));
    StepTimeModel::linear(&points).map_err(|e| EngineError::Config(format!("step-time model: {e}")))
}

/// The prefill cost model `cost(q, c)`, fitted from timed forward calls over a fresh state:
/// chunks of several lengths from position 0 and a chunk after a cached prefix, plus decode
/// rows. It is only a starting point: the scheduler refits it from every measured step.
fn calibrate_prefill<B: Backend>(
    model: &Model<B>,
    cfg: &EngineConfig,
) -> Result<PrefillCostModel, EngineError>
where
    B::Tensor: Clone,
{
    let cap = cfg
        .max_num_batched_tokens
        .min(cfg.max_model_len.saturating_sub(1))
        .max(2);
    let toks: Vec<u32> = (0..2 * cap as u32).map(|i| 3 + i % 64).collect();
    // Best of two: the time of `q` tokens after `c` already in the state.
    let time = |q: usize, c: usize| -> Result<f64, EngineError> {
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            let mut st = model.new_state();
            if c > 0 {
                model.forward(
                    &mut [BatchItem {
                        state: &mut st,
                        tokens: &toks[..c],
                    }],
                    Logits::Last,
                    None,
                )?;
            }
            let t = Instant::now();
            model.forward(
                &mut [BatchItem {
                    state: &mut st,
                    tokens: &toks[c..c + q],
                }],
                Logits::Last,
                None,
            )?;
            best = best.min(ms_since(t));
        }
        Ok(best.max(1e-3))
    };
    let mut points = vec![(1, 0), (cap / 8, 0), (cap / 2, 0), (cap, 0)];
    points.push(((cap / 4).max(1), cap / 2));
    points.push((1, cap));
    let mut samples = Vec::new();
    for (q, c) in points {
        let q = q.max(1);
        samples.push(StepSample {
            features: StepFeatures::of_chunk(q, c),
            time: time(q, c)?,
        });
    }
    let bounds = CoefficientBounds::default();
    let coef = PrefillCostModel::fit(&samples, bounds).unwrap_or_else(|_| {
        // Too little variation to separate the terms: a linear guess from the longest chunk.
        let t = samples.iter().map(|s| s.time).fold(0.0, f64::max);
        CostCoefficients {
            a: 0.0,
            b: t / cap as f64,
            d: samples[0].time,
        }
    });
    PrefillCostModel::new(coef, bounds, 0.98)
        .map_err(|e| EngineError::Config(format!("prefill cost model: {e}")))
}

/// The prefix-hit rule: the last window (plus the speculative slack) is always recomputed.
fn hit_rule<B: Backend>(model: &Model<B>, cfg: &EngineConfig) -> HitRule {
    HitRule {
        window: model.cfg.sliding_window,
        spec_slack: cfg.spec_slack,
    }
}

/// Content-only parsing (no thinking, no tools, no stop sequences).
fn plain_parsing() -> deepinfer_recipe::protocol::ParsingOptions {
    deepinfer_recipe::protocol::ParsingOptions {
        parse_tool_calls: false,
        starts_in_tool_calls: false,
        parse_json_output: false,
        thinking: None,
        stop_sequences: Vec::new(),
    }
}

/// Fold parser events into the request's output; returns whether the caller wants more.
fn apply_events<T>(
    l: &mut Live<T>,
    evs: Vec<Event>,
    on_event: &mut dyn FnMut(&StreamEvent) -> bool,
) -> bool {
    let mut keep = true;
    for ev in evs {
        keep &= on_event(&StreamEvent::Parsed {
            id: l.user_id,
            index: l.index,
            event: ev.clone(),
        });
        match ev {
            Event::Content(t) => {
                keep &= on_event(&StreamEvent::Text {
                    id: l.user_id,
                    delta: t.clone(),
                });
                l.text.push_str(&t);
            }
            Event::Reasoning(t) => {
                keep &= on_event(&StreamEvent::Reasoning {
                    id: l.user_id,
                    delta: t.clone(),
                });
                l.reasoning.push_str(&t);
            }
            Event::ToolCallStart { name, .. } => l.calls.push(ToolCallOut {
                name,
                arguments: String::new(),
            }),
            Event::ToolCallArgs { index, delta } => {
                if let Some(c) = l.calls.get_mut(index) {
                    c.arguments.push_str(&delta);
                }
            }
            Event::ToolCallEnd { .. } => {}
            Event::Finish { reason, .. } => l.parse_finish = Some(reason),
        }
    }
    keep
}

/// The output of a finished request; the parser's last events (text it held back, the
/// finish) go to `on_event` first.
fn finish<T>(
    mut l: Live<T>,
    f: Finished,
    now_ms: f64,
    on_event: &mut dyn FnMut(&StreamEvent) -> bool,
) -> Output {
    // A stop sequence seen after the next step was launched ends the request by abort.
    let reason = if l.stopped && f.reason == SchedFinish::Aborted {
        SchedFinish::Stop
    } else {
        f.reason
    };
    let backend = match reason {
        SchedFinish::Stop => Some(BackendFinish::Stop),
        SchedFinish::Length => Some(BackendFinish::Length),
        SchedFinish::Aborted => None,
    };
    if let Some(parser) = l.parser.take() {
        let evs = parser.finish(backend);
        apply_events(&mut l, evs, on_event);
    }
    let finish_reason = match (reason, l.parse_finish) {
        (SchedFinish::Aborted, _) => FinishReason::Aborted,
        (_, Some(ParseFinish::StopSequence)) => FinishReason::StopSequence,
        (SchedFinish::Stop, Some(ParseFinish::ToolCalls)) => FinishReason::ToolCalls,
        (SchedFinish::Stop, _) => FinishReason::Stop,
        (SchedFinish::Length, _) => FinishReason::Length,
    };
    // One move of the kept part to the front of the history's buffer.
    let mut token_ids = f.tokens;
    token_ids.drain(..(f.prompt_len + l.strip).min(token_ids.len()));
    if let Some(k) = l.kept {
        token_ids.truncate(k);
    }
    let completion_tokens = token_ids.len();
    Output {
        id: l.user_id,
        index: l.index,
        logprobs: l.fx.params.logprobs.then_some(l.logprobs),
        token_ids,
        text: l.text,
        reasoning: l.reasoning,
        tool_calls: l.calls,
        finish_reason,
        usage: Usage {
            prompt_tokens: l.fx.prompt_len,
            cached_tokens: l.cached.unwrap_or(0),
            completion_tokens,
        },
        timing: Timing {
            ttft_ms: l.first_token.unwrap_or(now_ms),
            total_ms: if l.first_token.is_some() {
                l.last_token
            } else {
                now_ms
            },
        },
    }
}
