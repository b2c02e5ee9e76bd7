//! The step loop (DESIGN.md, "One engine step"): `deepinfer-sched` plans the step (KV
//! blocks from `deepinfer-kv`, prefix hits, chunked prefill, preemption) → the model's
//! forward over each sequence's state on the backend → `deepinfer-sample` picks one token per
//! sampling row (per-request seed and position) → `update` (append, stop conditions, free
//! blocks) → the recipe stream parser turns ids into text, reasoning and tool calls.
//!
//! Steps run one after the other (no overlap of scheduling with the forward yet).

use super::prefix::PrefixStates;
use super::request::GrammarConstraint;
use super::request::{
    FinishReason, GenParams, Output, Request, RequestId, Timing, TokenLogprob, ToolCallOut, Usage,
};
use crate::{BatchItem, Logits, Model, ModelError, SeqState};
use deepinfer_kernels::Backend;
use deepinfer_kv::{BlockManager, BlockManagerConfig, HitRule};
use deepinfer_recipe::grammar::Matcher;
use deepinfer_recipe::parser::{BackendFinish, Event, FinishReason as ParseFinish};
use deepinfer_recipe::protocol::ParsingOptions;
use deepinfer_recipe::{PromptTokenizer, StreamParser};
use deepinfer_sample::{
    SampleError, SampleRequest, VerifyMode, VerifyRequest, sample_batch, verify,
};
use deepinfer_sched::{
    FinishReason as SchedFinish, Finished, NewRequest, SchedError, Scheduler, SchedulerConfig,
    SpecMode, StepOutput,
};
use deepinfer_spec::{Planner, PlannerConfig, Search, StepTimeModel};
use std::collections::HashMap;
use std::sync::Arc;
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
    /// Most prefix model-state snapshots kept (LRU).
    pub prefix_state_capacity: usize,
    /// DSpark drafts verified per decode row (fixed-length verification, so a request's path
    /// does not depend on its batch-mates); 0 turns speculation off. Needs a model with the
    /// drafter; at most its block size. With [`SpecBudget::Budgeted`] the most per row.
    pub spec_drafts: usize,
    /// Fixed drafts per row, or a per-step budget from the `deepinfer-spec` planner.
    pub spec_budget: SpecBudget,
}

/// How many drafts each decode row verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecBudget {
    /// Every decode row verifies `spec_drafts` drafts: fixed-length verification, so a
    /// request's sampling path does not depend on its batch-mates (deterministic mode).
    #[default]
    Fixed,
    /// The `deepinfer-spec` planner splits a step's rows between requests (0 ..= `spec_drafts`
    /// each) from the drafter's confidences and a step-time model calibrated at start-up and
    /// corrected online from the measured step times. Greedy outputs stay exact; sampled
    /// paths may depend on batch-mates.
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
            spec_drafts: 0,
            spec_budget: SpecBudget::Fixed,
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
    /// Prompt tokens the scheduler served from the prefix cache (first admissions).
    pub cached_prompt_tokens: u64,
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
    /// The request finished.
    Finished(Box<Output>),
}

impl StreamEvent {
    /// The request the event belongs to.
    pub fn request(&self) -> RequestId {
        match self {
            StreamEvent::Token { id, .. }
            | StreamEvent::Text { id, .. }
            | StreamEvent::Reasoning { id, .. } => *id,
            StreamEvent::Finished(o) => o.id,
        }
    }
}

/// A request in flight.
struct Live<T> {
    user_id: RequestId,
    /// Which of the request's `n` samples.
    index: usize,
    params: GenParams,
    prompt_len: usize,
    /// Fork group parent still to fork: its last prompt token is fed as a forced "output"
    /// (the scheduler holds the prompt minus that token), then `n - 1` children are forked.
    forced: Option<u32>,
    /// Leading scheduler output tokens that are prompt, not generated (the forced token).
    strip: usize,
    /// How children of a fork group are set up.
    parsing: Option<ParsingOptions>,
    grammar: Option<GrammarConstraint>,
    /// Grammar matcher of this output (structured outputs).
    matcher: Option<Box<dyn Matcher>>,
    /// Drafts made at the end of the last step for the next one (budgeted speculation: the
    /// planner needs their confidences before it plans).
    next_draft: Option<NextDraft>,
    /// Where a prefix-hit snapshot is taken: the largest reusable prefix of this prompt.
    cut: usize,
    state: Option<SeqState<T>>,
    parser: Option<StreamParser>,
    logprobs: Vec<TokenLogprob>,
    text: String,
    reasoning: String,
    calls: Vec<ToolCallOut>,
    parse_finish: Option<ParseFinish>,
    stop_tokens: Vec<u32>,
    cached: Option<usize>,
    first_token: Option<f64>,
    last_token: f64,
}

/// A piece of one row group: rows `from .. to` of the request's token history, then
/// `extra` (draft tokens being verified, or accepted drafts being re-run after a rollback).
struct Piece {
    sid: u64,
    from: usize,
    to: usize,
    samples: bool,
    extra: Vec<u32>,
    /// A decode row verifying `extra` as drafts (logits of every row are kept).
    spec: bool,
}

/// Drafts for the next decode row of a request.
struct NextDraft {
    /// State position and anchor token they were drafted from.
    pos: usize,
    anchor: u32,
    ids: Vec<u32>,
    /// Draft distributions (stochastic verification only), `ids.len() * vocab`.
    q: Option<Vec<f32>>,
}

/// One generated token with its log-probabilities.
type Tok = (u32, f32, Vec<(u32, f32)>);

/// The engine: a model on a backend plus scheduler, sampler and (optionally) a tokenizer.
pub struct Engine<B: Backend> {
    model: Model<B>,
    cfg: EngineConfig,
    sched: Scheduler,
    tokenizer: Option<Arc<PromptTokenizer>>,
    prefix: PrefixStates<B::Tensor>,
    metrics: Metrics,
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
    /// An engine over `model`.
    pub fn new(model: Model<B>, cfg: EngineConfig) -> Result<Self, EngineError> {
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
        let sched = Self::make_scheduler(&model, &cfg)?;
        let prefix = PrefixStates::new(
            cfg.block_size,
            if cfg.prefix_caching {
                cfg.prefix_state_capacity
            } else {
                0
            },
        );
        Ok(Self {
            model,
            sched,
            tokenizer: None,
            prefix,
            metrics: Metrics::default(),
            next_sid: 0,
            cfg,
        })
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
            ..SchedulerConfig::default()
        };
        let sched = Scheduler::new(sc, kv)?;
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
    pub fn with_tokenizer(mut self, tokenizer: Arc<PromptTokenizer>) -> Self {
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
        Metrics {
            preemptions: self.sched.stats().preemptions,
            prefix_states: self.prefix.len(),
            ..self.metrics
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
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
        let bad = |reason: String| EngineError::InvalidRequest { id: r.id, reason };
        let v = self.model.cfg.vocab_size;
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
        if r.prompt.len() >= self.cfg.max_model_len {
            return Err(bad(format!(
                "prompt of {} tokens exceeds the context limit of {}",
                r.prompt.len(),
                self.cfg.max_model_len
            )));
        }
        if r.prompt.len() + 1 > self.cfg.num_blocks * self.cfg.block_size {
            return Err(bad(format!(
                "prompt of {} tokens exceeds the KV pool of {} tokens",
                r.prompt.len(),
                self.cfg.num_blocks * self.cfg.block_size
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

    /// Add a checked request to the scheduler: one sequence, or for `n > 1` a fork group (a
    /// parent that prefills the prompt once, then forks `n - 1` children sharing its blocks)
    /// or, when the prompt cannot be split that way, `n` independent sequences.
    fn admit(
        &mut self,
        r: Request,
        live: &mut HashMap<u64, Live<B::Tensor>>,
    ) -> Result<(), EngineError> {
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
                params,
                prompt_len: r.prompt.len(),
                forced: fork.then_some(last),
                strip: usize::from(fork),
                parsing: r.parsing.clone(),
                grammar: r.grammar.clone(),
                matcher: r.grammar.as_ref().map(GrammarConstraint::matcher),
                cut,
                state: None,
                next_draft: None,
                parser: self.parser_for(r.parsing.as_ref()),
                logprobs: Vec::new(),
                text: String::new(),
                reasoning: String::new(),
                calls: Vec::new(),
                parse_finish: None,
                stop_tokens: stop_tokens.clone(),
                cached: None,
                first_token: None,
                last_token: 0.0,
            };
            live.insert(sid, l);
        }
        Ok(())
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
        let n = p.params.n.max(1);
        let base_seed = p.params.sampling.seed;
        let mut children = Vec::with_capacity(n - 1);
        for index in 1..n {
            let sid = self.next_sid;
            self.next_sid += 1;
            self.sched.fork(parent, sid)?;
            self.metrics.forks += 1;
            let mut params = p.params.clone();
            params.sampling.seed = base_seed.wrapping_add(index as u64);
            children.push((
                sid,
                Live {
                    user_id: p.user_id,
                    index,
                    params,
                    prompt_len: p.prompt_len,
                    forced: None,
                    strip: p.strip,
                    parsing: p.parsing.clone(),
                    grammar: p.grammar.clone(),
                    matcher: p.grammar.as_ref().map(GrammarConstraint::matcher),
                    cut: p.cut,
                    state: p.state.clone(),
                    next_draft: None,
                    parser: self.parser_for(p.parsing.as_ref()),
                    logprobs: Vec::new(),
                    text: String::new(),
                    reasoning: String::new(),
                    calls: Vec::new(),
                    parse_finish: None,
                    stop_tokens: p.stop_tokens.clone(),
                    cached: p.cached,
                    first_token: None,
                    last_token: 0.0,
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
        mut on_event: impl FnMut(&StreamEvent) -> bool,
    ) -> Result<(), EngineError> {
        let t0 = Instant::now();
        let mut live: HashMap<u64, Live<B::Tensor>> = HashMap::new();
        for r in requests {
            self.check_request(&r)?;
            self.admit(r, &mut live)?;
        }
        while !live.is_empty() {
            let ts = Instant::now();
            let plan = {
                let _span = tracing::debug_span!("schedule").entered();
                self.sched.schedule()?
            };
            self.metrics.sched_ms += ms_since(ts);
            for id in &plan.preempted {
                // Recompute on re-admission: the model state goes with the KV blocks.
                if let Some(l) = live.get_mut(id) {
                    l.state = None;
                }
            }
            if plan.is_empty() {
                return Err(EngineError::Stuck(live.len()));
            }
            self.metrics.steps += 1;
            // Row groups → pieces, restoring states where the scheduler resumes a request.
            let mut pieces = Vec::with_capacity(plan.num_groups());
            let groups = plan
                .prefill
                .iter()
                .map(|c| (c.request, c.start, c.start + c.len, c.samples, 0))
                .chain(
                    plan.decode
                        .iter()
                        .map(|d| (d.request, d.position, d.position + 1, true, d.drafts)),
                );
            let mut spec_snaps: HashMap<u64, SeqState<B::Tensor>> = HashMap::new();
            let mut draft_q: HashMap<u64, Vec<f32>> = HashMap::new();
            for (sid, start, end, samples, drafts) in groups {
                let l = live.get_mut(&sid).ok_or(SchedError::UnknownRequest(sid))?;
                if l.cached.is_none() {
                    l.cached = Some(start);
                    self.metrics.cached_prompt_tokens += start as u64;
                }
                let ok = l.state.as_ref().is_some_and(|s| s.pos == start);
                if !ok {
                    let toks = self
                        .sched
                        .tokens(sid)
                        .ok_or(SchedError::UnknownRequest(sid))?;
                    let st = match self.prefix.lookup(&toks[..start]) {
                        Some(s) => {
                            self.metrics.state_snapshot_hits += 1;
                            s
                        }
                        None => self.model.new_state(),
                    };
                    self.metrics.replayed_tokens += (start - st.pos) as u64;
                    l.state = Some(st);
                }
                let from = l.state.as_ref().map(|s| s.pos).unwrap_or(0);
                if drafts > 0 && from == start {
                    // Draft from the state before the anchor, keep it for the rollback.
                    let st = l.state.as_ref().ok_or(SchedError::UnknownRequest(sid))?;
                    let anchor = self
                        .sched
                        .tokens(sid)
                        .and_then(|t| t.get(start).copied())
                        .ok_or(SchedError::UnknownRequest(sid))?;
                    let td = Instant::now();
                    let stochastic = l.params.sampling.temperature > 0.0;
                    let (extra, q) = match l.next_draft.take() {
                        // Drafted at the end of the last step (budgeted mode).
                        Some(nd)
                            if nd.pos == st.pos
                                && nd.anchor == anchor
                                && nd.ids.len() >= drafts =>
                        {
                            let v = self.model.cfg.vocab_size;
                            (
                                nd.ids[..drafts].to_vec(),
                                nd.q.map(|mut q| {
                                    q.truncate(drafts * v);
                                    q
                                }),
                            )
                        }
                        _ => {
                            let d = self.model.draft(st, anchor)?;
                            let q = stochastic.then(|| {
                                softmax_rows(&d.logits, self.model.cfg.vocab_size, drafts)
                            });
                            (d.draft_ids[..drafts].to_vec(), q)
                        }
                    };
                    spec_snaps.insert(sid, st.clone());
                    self.metrics.draft_tokens += drafts as u64;
                    self.metrics.spec_rows += 1;
                    if let Some(q) = q {
                        draft_q.insert(sid, q);
                    }
                    self.metrics.draft_ms += ms_since(td);
                    pieces.push(Piece {
                        sid,
                        from,
                        to: end,
                        samples,
                        extra,
                        spec: true,
                    });
                    continue;
                }
                // Split at the snapshot point so a later identical prefix can resume there.
                if self.cfg.prefix_caching && from < l.cut && l.cut < end {
                    pieces.push(Piece {
                        sid,
                        from,
                        to: l.cut,
                        samples: false,
                        extra: Vec::new(),
                        spec: false,
                    });
                    pieces.push(Piece {
                        sid,
                        from: l.cut,
                        to: end,
                        samples,
                        extra: Vec::new(),
                        spec: false,
                    });
                } else {
                    pieces.push(Piece {
                        sid,
                        from,
                        to: end,
                        samples,
                        extra: Vec::new(),
                        spec: false,
                    });
                }
            }
            // Forward: first pieces of every group, then the second halves of split groups.
            let mut logits: HashMap<u64, Vec<f32>> = HashMap::new();
            let mut phase: Vec<&Piece> = Vec::new();
            let mut second: Vec<&Piece> = Vec::new();
            let mut spec: Vec<&Piece> = Vec::new();
            for (i, p) in pieces.iter().enumerate() {
                if p.spec {
                    spec.push(p);
                } else if i > 0 && pieces[i - 1].sid == p.sid {
                    second.push(p);
                } else {
                    phase.push(p);
                }
            }
            for (group, which) in [
                (phase, Logits::Last),
                (second, Logits::Last),
                (spec, Logits::All),
            ] {
                if group.is_empty() {
                    continue;
                }
                self.forward_group(&group, which, &mut live, &mut logits)?;
            }
            // Verify drafts (fixed length: each row's path depends on its own data only).
            let v = self.model.cfg.vocab_size;
            let words = v.div_ceil(32);
            let eos = self.model.cfg.eos_token_id.map(|e| e as u32);
            let tv = Instant::now();
            let verify_span = tracing::debug_span!("verify").entered();
            let mut verified: HashMap<u64, Vec<Tok>> = HashMap::new();
            let mut rollbacks = Vec::new();
            // Drafts a matcher advanced over to build the masks (rolled back before the
            // verified tokens are accepted).
            let mut grammar_drafts: HashMap<u64, usize> = HashMap::new();
            for p in pieces.iter().filter(|p| p.spec) {
                let l = live
                    .get_mut(&p.sid)
                    .ok_or(SchedError::UnknownRequest(p.sid))?;
                let masks = match l.matcher.as_mut() {
                    Some(m) => {
                        let tg = Instant::now();
                        let (masks, k) = draft_masks(m.as_mut(), &p.extra, words, eos);
                        grammar_drafts.insert(p.sid, k);
                        self.metrics.grammar_ms += ms_since(tg);
                        Some(masks)
                    }
                    None => None,
                };
                let l = &live[&p.sid];
                let toks = self
                    .sched
                    .tokens(p.sid)
                    .ok_or(SchedError::UnknownRequest(p.sid))?;
                let sp = &l.params.sampling;
                let req = VerifyRequest {
                    target_logits: logits[&p.sid].as_slice(),
                    vocab: v,
                    draft_tokens: &p.extra,
                    draft_probs: draft_q.get(&p.sid).map(Vec::as_slice),
                    masks: masks.as_deref(),
                    history: &toks[l.prompt_len.min(toks.len())..],
                    position: p.to as u64,
                    params: sp,
                    mode: if sp.temperature <= 0.0 {
                        VerifyMode::Greedy
                    } else {
                        VerifyMode::Stochastic
                    },
                };
                let vo = verify(&req)?;
                self.metrics.accepted_drafts += vo.accepted as u64;
                if vo.accepted < p.extra.len() {
                    rollbacks.push(Piece {
                        sid: p.sid,
                        from: p.from,
                        to: p.to,
                        samples: false,
                        extra: p.extra[..vo.accepted].to_vec(),
                        spec: false,
                    });
                    if let (Some(l), Some(snap)) = (live.get_mut(&p.sid), spec_snaps.remove(&p.sid))
                    {
                        l.state = Some(snap);
                    }
                }
                verified.insert(
                    p.sid,
                    vo.tokens
                        .iter()
                        .zip(&vo.logprobs)
                        .map(|(&t, &lp)| (t, lp, Vec::new()))
                        .collect(),
                );
            }
            drop(verify_span);
            self.metrics.sample_ms += ms_since(tv);
            if !rollbacks.is_empty() {
                // Re-run the accepted prefix on the pre-draft state (exact state, no drafts).
                let group: Vec<&Piece> = rollbacks.iter().collect();
                let mut unused = HashMap::new();
                self.forward_group(&group, Logits::Last, &mut live, &mut unused)?;
            }
            // Grammar masks of the sampling rows (bit set = allowed), then sample every row
            // that samples; a fork-group parent's row emits its forced prompt token instead.
            let tg = Instant::now();
            let grammar_span = tracing::debug_span!("grammar").entered();
            let mut row_sids = Vec::new();
            let mut masks: Vec<Option<Vec<u32>>> = Vec::new();
            for p in pieces.iter().filter(|p| p.samples && !p.spec) {
                let l = live
                    .get_mut(&p.sid)
                    .ok_or(SchedError::UnknownRequest(p.sid))?;
                if l.forced.is_some() {
                    continue;
                }
                row_sids.push(p.sid);
                masks.push(l.matcher.as_mut().map(|m| {
                    let mut mask = vec![0u32; words];
                    fill_mask(m.as_mut(), &mut mask, eos);
                    mask
                }));
            }
            drop(grammar_span);
            self.metrics.grammar_ms += ms_since(tg);
            let tsm = Instant::now();
            let empty: Vec<u32> = Vec::new();
            let rows: Vec<SampleRequest<'_, f32>> = row_sids
                .iter()
                .zip(&masks)
                .map(|(sid, mask)| {
                    let l = &live[sid];
                    let p = pieces
                        .iter()
                        .rev()
                        .find(|p| p.sid == *sid)
                        .map(|p| p.to)
                        .unwrap_or(0);
                    let hist = self
                        .sched
                        .tokens(*sid)
                        .map(|t| &t[l.prompt_len.min(t.len())..])
                        .unwrap_or(&empty);
                    SampleRequest {
                        logits: logits[sid].as_slice(),
                        mask: mask.as_deref(),
                        history: hist,
                        position: p as u64,
                        params: &l.params.sampling,
                    }
                })
                .collect();
            let sampled = {
                let _span = tracing::debug_span!("sample", rows = rows.len()).entered();
                sample_batch(&rows)
            };
            drop(rows);
            let mut sampled: HashMap<u64, _> = row_sids.into_iter().zip(sampled).collect();
            self.metrics.sample_ms += ms_since(tsm);
            let tp = Instant::now();
            let parse_span = tracing::debug_span!("parse").entered();
            let now = ms_since(t0);
            let mut out = StepOutput::new(plan.step);
            let mut aborts = Vec::new();
            let mut to_fork = Vec::new();
            for sid in plan.requests() {
                let Some(piece) = pieces.iter().rev().find(|p| p.sid == sid) else {
                    continue;
                };
                let l = live.get_mut(&sid).ok_or(SchedError::UnknownRequest(sid))?;
                if piece.samples
                    && !piece.spec
                    && let Some(t) = l.forced.take()
                {
                    // The prompt's last token, fed as the parent's first "output".
                    out.push(sid, &[t], false);
                    to_fork.push(sid);
                    continue;
                }
                let mut toks: Vec<Tok> = if piece.spec {
                    verified.remove(&sid).unwrap_or_default()
                } else if piece.samples {
                    let s = sampled
                        .remove(&sid)
                        .ok_or(SchedError::UnknownRequest(sid))??;
                    vec![(s.token, s.logprob, s.top_logprobs)]
                } else {
                    Vec::new()
                };
                // Keep a stop token, drop what a verified block produced after it.
                if let Some(j) = toks.iter().position(|t| l.stop_tokens.contains(&t.0)) {
                    toks.truncate(j + 1);
                }
                if let Some(m) = l.matcher.as_mut() {
                    let tg = Instant::now();
                    if let Some(k) = grammar_drafts.remove(&sid) {
                        let _ = m.rollback(k);
                    }
                    for t in &toks {
                        // A rejected token (only a stop token outside the grammar can be)
                        // leaves the matcher where it was.
                        let _ = m.accept(t.0);
                    }
                    self.metrics.grammar_ms += ms_since(tg);
                }
                let mut keep = true;
                let mut stop = false;
                for (token, logprob, top) in &toks {
                    self.metrics.generated_tokens += 1;
                    l.first_token.get_or_insert(now);
                    l.last_token = now;
                    if l.params.logprobs {
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
                    });
                    if !stop
                        && !l.stop_tokens.contains(token)
                        && let Some(parser) = l.parser.as_mut()
                    {
                        let evs = parser.push_tokens(&[*token]);
                        stop = parser.is_stopped();
                        keep &= apply_events(l, evs, &mut on_event);
                    }
                }
                if !keep {
                    aborts.push(sid);
                }
                let ids: Vec<u32> = toks.iter().map(|t| t.0).collect();
                let next_len = self.sched.tokens(sid).map_or(0, <[u32]>::len) + ids.len();
                let confs = match (self.cfg.spec_budget, ids.last()) {
                    (SpecBudget::Budgeted, Some(&anchor))
                        if self.cfg.spec_drafts > 0
                            && !stop
                            && !l.stop_tokens.contains(&anchor)
                            && next_len - l.prompt_len < l.params.max_tokens =>
                    {
                        let td = Instant::now();
                        let c = self.draft_ahead(l, anchor, next_len);
                        self.metrics.draft_ms += ms_since(td);
                        c
                    }
                    _ => Vec::new(),
                };
                out.push_with_confidences(sid, &ids, stop, &confs);
            }
            self.metrics.post_ms += ms_since(tp);
            drop(parse_span);
            // The whole step's wall time feeds the cost models (the draft planner's buckets).
            out.step_ms = Some(ms_since(ts).max(1e-3));
            let tu = Instant::now();
            let res = {
                let _span = tracing::debug_span!("update").entered();
                self.sched.update(&out)?
            };
            for sid in to_fork {
                if !res.finished.iter().any(|f| f.id == sid) {
                    self.fork_children(sid, &mut live)?;
                }
            }
            self.metrics.sched_ms += ms_since(tu);
            let mut finished = res.finished;
            for sid in aborts {
                if let Ok(f) = self.sched.abort(sid) {
                    finished.push(f);
                }
            }
            let tp = Instant::now();
            for f in finished {
                let Some(l) = live.remove(&f.id) else {
                    continue;
                };
                let o = finish(l, f, ms_since(t0));
                on_event(&StreamEvent::Finished(Box::new(o)));
            }
            self.metrics.post_ms += ms_since(tp);
        }
        Ok(())
    }

    /// Budgeted speculation: draft the next block now (the state has consumed everything
    /// but `anchor`, the last token of this step) and return the drafter's confidences for
    /// the planner; the drafts wait in the request for its next decode row.
    fn draft_ahead(&self, l: &mut Live<B::Tensor>, anchor: u32, next_len: usize) -> Vec<f64> {
        let Some(st) = l.state.as_ref().filter(|s| s.pos + 1 == next_len) else {
            return Vec::new();
        };
        let Ok(d) = self.model.draft(st, anchor) else {
            return Vec::new();
        };
        let n = self.cfg.spec_drafts.min(d.draft_ids.len());
        let v = self.model.cfg.vocab_size;
        let q = (l.params.sampling.temperature > 0.0).then(|| softmax_rows(&d.logits, v, n));
        let confs = d.confidence[..n]
            .iter()
            .map(|&c| {
                if c.is_finite() {
                    f64::from(c).clamp(0.0, 1.0)
                } else {
                    0.0
                }
            })
            .collect();
        l.next_draft = Some(NextDraft {
            pos: st.pos,
            anchor,
            ids: d.draft_ids[..n].to_vec(),
            q,
        });
        confs
    }

    /// One forward call over `group` (at most one piece per request), keeping each piece's
    /// last-row logits and snapshotting states that end on a block boundary.
    fn forward_group(
        &mut self,
        group: &[&Piece],
        which: Logits,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        logits: &mut HashMap<u64, Vec<f32>>,
    ) -> Result<(), EngineError> {
        let mut states = Vec::with_capacity(group.len());
        let mut toks = Vec::with_capacity(group.len());
        for p in group {
            let l = live
                .get_mut(&p.sid)
                .ok_or(SchedError::UnknownRequest(p.sid))?;
            let st = l.state.take().unwrap_or_else(|| self.model.new_state());
            let all = self
                .sched
                .tokens(p.sid)
                .ok_or(SchedError::UnknownRequest(p.sid))?;
            let mut t = all[p.from..p.to].to_vec();
            t.extend_from_slice(&p.extra);
            toks.push(t);
            states.push(st);
        }
        let tf = Instant::now();
        let res = {
            let _span = tracing::debug_span!("forward", sequences = group.len()).entered();
            let mut items: Vec<BatchItem<'_, B::Tensor>> = states
                .iter_mut()
                .zip(&toks)
                .map(|(state, t)| BatchItem { state, tokens: t })
                .collect();
            self.model.forward(&mut items, which, None)
        };
        self.metrics.forward_ms += ms_since(tf);
        self.metrics.forward_calls += 1;
        self.metrics.forward_tokens += toks.iter().map(|t| t.len() as u64).sum::<u64>();
        let rows = res?;
        let v = self.model.cfg.vocab_size;
        for ((p, st), mut row) in group.iter().zip(states).zip(rows) {
            if which == Logits::All {
                // Keep the rows of the decode input and its drafts (replayed rows come first).
                let keep = (1 + p.extra.len()) * v;
                row.drain(..row.len().saturating_sub(keep));
            }
            if self.cfg.prefix_caching
                && p.extra.is_empty()
                && st.pos.is_multiple_of(self.cfg.block_size)
            {
                let all = self
                    .sched
                    .tokens(p.sid)
                    .ok_or(SchedError::UnknownRequest(p.sid))?;
                self.prefix.insert(&all[..st.pos], &st);
            }
            if let Some(l) = live.get_mut(&p.sid) {
                l.state = Some(st);
            }
            logits.insert(p.sid, row);
        }
        Ok(())
    }
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

/// The prefix-hit rule: the last window (plus the speculative slack) is always recomputed.
fn hit_rule<B: Backend>(model: &Model<B>, cfg: &EngineConfig) -> HitRule {
    HitRule {
        window: model.cfg.sliding_window,
        spec_slack: cfg.spec_drafts,
    }
}

/// Fill `mask` from the matcher; when the grammar allows nothing (it cannot complete), allow
/// only the end-of-sequence token so the request ends instead of failing the batch.
fn fill_mask(m: &mut dyn Matcher, mask: &mut [u32], eos: Option<u32>) {
    if m.fill_bitmask(mask).is_err() {
        mask.fill(0);
        match eos {
            Some(e) if (e as usize) < mask.len() * 32 => mask[e as usize / 32] |= 1 << (e % 32),
            _ => mask.fill(u32::MAX),
        }
    }
}

/// Masks for a verified draft block: mask `i` assumes drafts `..i` were accepted. The matcher
/// is advanced over the drafts it accepts (returned count, to roll back); after the first
/// draft it rejects, the remaining masks repeat the last one (verification stops there).
fn draft_masks(
    m: &mut dyn Matcher,
    drafts: &[u32],
    words: usize,
    eos: Option<u32>,
) -> (Vec<u32>, usize) {
    let mut masks = vec![0u32; (drafts.len() + 1) * words];
    let mut k = 0;
    let mut live = true;
    for i in 0..=drafts.len() {
        if live {
            fill_mask(m, &mut masks[i * words..(i + 1) * words], eos);
            if i < drafts.len() {
                if m.accept(drafts[i]).is_ok() {
                    k += 1;
                } else {
                    live = false;
                }
            }
        } else {
            masks.copy_within((i - 1) * words..i * words, i * words);
        }
    }
    (masks, k)
}

/// Softmax of the first `rows` rows/// Softmax of the first `rows` rows of `[_, v]` logits (the draft distributions).
fn softmax_rows(logits: &[f32], v: usize, rows: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * v);
    for r in logits.chunks_exact(v).take(rows) {
        let m = r.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let z: f64 = r.iter().map(|&x| ((x - m) as f64).exp()).sum();
        out.extend(r.iter().map(|&x| (((x - m) as f64).exp() / z) as f32));
    }
    out
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
    on_event: &mut impl FnMut(&StreamEvent) -> bool,
) -> bool {
    let mut keep = true;
    for ev in evs {
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

fn finish<T>(mut l: Live<T>, f: Finished, now_ms: f64) -> Output {
    let backend = match f.reason {
        SchedFinish::Stop => Some(BackendFinish::Stop),
        SchedFinish::Length => Some(BackendFinish::Length),
        SchedFinish::Aborted => None,
    };
    if let Some(parser) = l.parser.take() {
        let evs = parser.finish(backend);
        apply_events(&mut l, evs, &mut |_| true);
    }
    let finish_reason = match (f.reason, l.parse_finish) {
        (SchedFinish::Aborted, _) => FinishReason::Aborted,
        (_, Some(ParseFinish::StopSequence)) => FinishReason::StopSequence,
        (SchedFinish::Stop, Some(ParseFinish::ToolCalls)) => FinishReason::ToolCalls,
        (SchedFinish::Stop, _) => FinishReason::Stop,
        (SchedFinish::Length, _) => FinishReason::Length,
    };
    let mut token_ids = f.output;
    token_ids.drain(..l.strip.min(token_ids.len()));
    let completion_tokens = token_ids.len();
    Output {
        id: l.user_id,
        index: l.index,
        logprobs: l.params.logprobs.then_some(l.logprobs),
        token_ids,
        text: l.text,
        reasoning: l.reasoning,
        tool_calls: l.calls,
        finish_reason,
        usage: Usage {
            prompt_tokens: l.prompt_len,
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
