//! Property-testing helpers (feature `testing`, which also turns on `deepinfer-kv`'s): the fake
//! engine, request streams, drivers and checks this crate's own tests use, for testing an engine
//! loop built on the [`Scheduler`].
//!
//! - The fake engine: the token at history position `p` of request `id` is [`token`]`(id, p)`,
//!   a pure function, and so is how many drafts a row accepts ([`accepted`]). Any correct
//!   scheduler therefore produces exactly [`expected_output`] for every request, whatever the
//!   batching, chunking, preemption or overlap. [`run`] and [`run_dense`] answer a plan;
//!   [`drive_sync`] and [`drive_async`] run a scheduler until idle.
//! - Request streams: [`workload`] draws a [`Workload`] (arrivals, prompt and output lengths,
//!   priorities, aborts, budgets, a pool from "one long request" up to "everyone", drafts);
//!   [`simulate`] runs it synchronously or overlapped, checking every plan.
//! - Checks: [`check_plan`] (budgets), [`check_invariants`] (the block manager's invariants and
//!   its agreement with the histories), [`check_all_accounted`] (every request ends once, with
//!   its true tokens or aborted, and no block leaks), [`check_outputs`].
//! - Expert load balancing: [`expert_load_case`] and [`check_placement`].
//!
//! Checks return `Err(description)`; in a proptest, `.map_err(TestCaseError::fail)?`. The fake
//! engine and the drivers panic when the scheduler breaks its contract (see each).

use std::collections::VecDeque;

use deepinfer_kv::{BlockManager, BlockManagerConfig, KvError};
use proptest::prelude::*;

use crate::{
    EplbConfig, ExpertLoad, FinishReason, Finished, NewRequest, Placement, RequestId, Scheduler,
    SchedulerConfig, SpecMode, StepOutput, StepPlan,
};

/// Returns `Err` with the formatted message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {{
        let holds: bool = $cond;
        if !holds {
            return Err(format!($($msg)+));
        }
    }};
}

/// SplitMix64's finaliser: the fake engine's hash.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The token the fake engine samples at history position `p` of request `id` (below 50,000).
pub fn token(id: RequestId, p: usize) -> u32 {
    (mix(id.wrapping_mul(1_000_003) ^ p as u64) % 50_000) as u32
}

/// Drafts the fake engine accepts for a row whose input sits at `p` with `k` drafts (`0..=k`).
pub fn accepted(id: RequestId, p: usize, k: usize) -> usize {
    (mix(id ^ (p as u64).wrapping_mul(7919) ^ 0xACCE) % (k as u64 + 1)) as usize
}

/// The prompt of request `id`: its first `len` [`token`]s.
pub fn prompt(id: RequestId, len: usize) -> Vec<u32> {
    (0..len).map(|p| token(id, p)).collect()
}

/// A prompt whose first `shared` tokens are request 0's (to exercise prefix hits).
pub fn shared_prompt(id: RequestId, shared: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|p| {
            if p < shared {
                token(0, p)
            } else {
                token(id, p)
            }
        })
        .collect()
}

/// A request with [`prompt`]`(id, len)` and `max_new` tokens to generate.
pub fn req(id: RequestId, len: usize, max_new: usize) -> NewRequest {
    NewRequest::new(id, prompt(id, len), max_new)
}

/// What request `id` outputs under the fake engine: the pure token stream, cut at `max_new`.
pub fn expected_output(id: RequestId, prompt_len: usize, max_new: usize) -> Vec<u32> {
    (prompt_len..prompt_len + max_new)
        .map(|p| token(id, p))
        .collect()
}

/// A block manager of `num_blocks` blocks of `block_size` tokens without a watermark.
pub fn kv(num_blocks: usize, block_size: usize) -> BlockManager {
    let mut c = BlockManagerConfig::new(num_blocks, block_size);
    c.watermark = 0.0;
    BlockManager::new(c).expect("a valid pool")
}

/// A scheduler over [`kv`]`(num_blocks, block_size)`.
///
/// # Panics
///
/// If `cfg` is invalid.
pub fn scheduler(cfg: SchedulerConfig, num_blocks: usize, block_size: usize) -> Scheduler {
    Scheduler::new(cfg, kv(num_blocks, block_size)).expect("a valid configuration")
}

/// Runs `plan` on the fake engine: each sampling prefill chunk yields the next [`token`], each
/// decode row its [`accepted`] drafts and the token after them.
///
/// # Panics
///
/// If a row has no KV slot in its request's block table, or a decode row is provisional (a
/// plan made ahead must be fixed with `UpdateResult::apply_to` before it runs).
pub fn run(plan: &StepPlan, s: &Scheduler) -> StepOutput {
    let mut out = StepOutput::new(plan.step);
    let bs = s.kv().block_size();
    for c in &plan.prefill {
        // An aborted request has no KV any more; the engine still runs the plan it got.
        if let Ok(t) = s.kv().block_table(c.request) {
            assert!(t.len() * bs >= c.start + c.len, "no KV for chunk {c:?}");
        }
        if c.samples {
            out.push(c.request, &[token(c.request, c.start + c.len)], false);
        } else {
            out.push(c.request, &[], false);
        }
    }
    for d in &plan.decode {
        assert!(!d.provisional, "engine got a provisional row {d:?}");
        if let Ok(t) = s.kv().block_table(d.request) {
            assert!(
                t.len() * bs > d.position + d.drafts,
                "no KV for decode row {d:?}"
            );
        }
        let m = accepted(d.request, d.position, d.drafts);
        let toks: Vec<u32> = (0..=m)
            .map(|i| token(d.request, d.position + 1 + i))
            .collect();
        out.push(d.request, &toks, false);
    }
    out
}

/// [`run`] answering the decode rows in the dense form (one token per decode row, no accepted
/// drafts), the prefill chunks as row groups.
///
/// # Panics
///
/// As [`run`].
pub fn run_dense(plan: &StepPlan, s: &Scheduler) -> StepOutput {
    let mut out = StepOutput::new(plan.step);
    let bs = s.kv().block_size();
    for c in &plan.prefill {
        if c.samples {
            out.push_token(c.request, token(c.request, c.start + c.len), false);
        } else {
            out.push(c.request, &[], false);
        }
    }
    for d in &plan.decode {
        assert!(!d.provisional, "engine got a provisional row {d:?}");
        if let Ok(t) = s.kv().block_table(d.request) {
            assert!(t.len() * bs > d.position + d.drafts, "no KV for {d:?}");
        }
        out.push_decode(token(d.request, d.position + 1));
    }
    out
}

/// Drives `s` synchronously until idle or `max_steps`; returns the finished requests and the
/// plans.
///
/// # Panics
///
/// If scheduling or an update fails, or as [`run`].
pub fn drive_sync(s: &mut Scheduler, max_steps: usize) -> (Vec<Finished>, Vec<StepPlan>) {
    let mut done = Vec::new();
    let mut plans = Vec::new();
    for _ in 0..max_steps {
        if s.is_idle() {
            break;
        }
        let plan = s.schedule().unwrap();
        let out = run(&plan, s);
        let res = s.update(&out).unwrap();
        done.extend(res.finished);
        plans.push(plan);
    }
    (done, plans)
}

/// Drives `s` with overlapped scheduling (plan N+1 before N's output is applied) until idle or
/// `max_steps`; returns the finished requests and the plans.
///
/// # Panics
///
/// As [`drive_sync`].
pub fn drive_async(s: &mut Scheduler, max_steps: usize) -> (Vec<Finished>, Vec<StepPlan>) {
    let mut done = Vec::new();
    let mut plans = Vec::new();
    let mut cur = s.schedule().unwrap();
    for _ in 0..max_steps {
        let out = run(&cur, s);
        let mut next = s.schedule().unwrap();
        let res = s.update(&out).unwrap();
        done.extend(res.finished.iter().cloned());
        res.apply_to(&mut next);
        plans.push(std::mem::replace(&mut cur, next));
        if s.is_idle() {
            // Drain the last (now empty or cancelled) plan.
            let out = run(&cur, s);
            let res = s.update(&out).unwrap();
            done.extend(res.finished);
            break;
        }
    }
    (done, plans)
}

/// Checks that each `(id, prompt len, max_new)` request finished exactly once, with
/// [`expected_output`] (or aborted).
pub fn check_outputs(done: &[Finished], reqs: &[(RequestId, usize, usize)]) -> Result<(), String> {
    for &(id, len, max_new) in reqs {
        let f: Vec<&Finished> = done.iter().filter(|f| f.id == id).collect();
        ensure!(f.len() == 1, "request {id} finished {} times", f.len());
        if f[0].reason != FinishReason::Aborted {
            ensure!(
                f[0].reason == FinishReason::Length,
                "request {id} finished with {:?}",
                f[0].reason
            );
            let want = expected_output(id, len, max_new);
            ensure!(
                f[0].output() == want,
                "request {id}: output {:?}, expected {want:?}",
                f[0].output()
            );
        }
    }
    Ok(())
}

/// A request stream and the budgets to serve it with, as [`workload`] draws it.
#[derive(Debug, Clone)]
pub struct Workload {
    /// (arrival step, prompt len, max new tokens, priority)
    pub reqs: Vec<(usize, usize, usize, i32)>,
    /// (step, request index) aborts
    pub aborts: Vec<(usize, usize)>,
    /// `max_num_batched_tokens`.
    pub batched: usize,
    /// `max_num_seqs`.
    pub seqs: usize,
    /// `max_chunk_tokens`.
    pub chunk: usize,
    /// Blocks in the pool.
    pub blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Fixed drafts per decode row (0: no speculation).
    pub drafts: usize,
}

impl Workload {
    /// The requests, all at once (ignoring arrival steps and aborts): request `i` is
    /// [`req`]`(i, len, max_new)` with its priority.
    pub fn requests(&self) -> Vec<NewRequest> {
        self.reqs
            .iter()
            .enumerate()
            .map(|(i, &(_, len, max_new, priority))| {
                let mut r = req(i as RequestId, len, max_new);
                r.priority = priority;
                r
            })
            .collect()
    }

    /// The scheduler configuration of the workload's budgets (model length 4,096).
    pub fn config(&self) -> SchedulerConfig {
        SchedulerConfig {
            max_num_batched_tokens: self.batched,
            max_num_seqs: self.seqs,
            max_model_len: 4096,
            max_chunk_tokens: self.chunk,
            spec: if self.drafts > 0 {
                SpecMode::Fixed(self.drafts)
            } else {
                SpecMode::Off
            },
            ..Default::default()
        }
    }
}

/// A random [`Workload`]: 1 to 19 requests arriving over 30 steps (prompts of 1 to 119 tokens,
/// 1 to 29 new), up to 4 aborts if `with_aborts`, priorities 0 to 2 if `priorities`, token
/// budgets of 8 to 95, 1 to 7 sequences, chunks of 1 to 63, blocks of 4, 8 or 16 tokens, a pool
/// from "one long request" up to three times that, and 0 to 3 fixed drafts.
pub fn workload(with_aborts: bool, priorities: bool) -> impl Strategy<Value = Workload> {
    (
        prop::collection::vec(
            (
                0usize..30,
                1usize..120,
                1usize..30,
                if priorities { 0i32..3 } else { 0i32..1 },
            ),
            1..20,
        ),
        prop::collection::vec((0usize..60, 0usize..20), 0..if with_aborts { 5 } else { 1 }),
        8usize..96,
        1usize..8,
        1usize..64,
        prop::sample::select(vec![4usize, 8, 16]),
        0usize..4,
    )
        .prop_flat_map(move |(reqs, aborts, batched, seqs, chunk, bs, drafts)| {
            // Memory pressure: a pool from "one long request" up to "everyone".
            let need = reqs.iter().map(|r| r.1 + r.2 + 8).max().unwrap_or(8);
            let min_blocks = need.div_ceil(bs) + 1;
            let aborts = if with_aborts { aborts } else { Vec::new() };
            (min_blocks..min_blocks * 3).prop_map(move |blocks| Workload {
                reqs: reqs.clone(),
                aborts: aborts.clone(),
                batched,
                seqs,
                chunk,
                blocks,
                block_size: bs,
                drafts,
            })
        })
}

/// Checks a plan against the budgets of `cfg`: tokens and row groups within their caps, rows
/// adding up to `num_tokens`, every prefill chunk non-empty and within the chunk cap.
pub fn check_plan(plan: &StepPlan, cfg: &SchedulerConfig) -> Result<(), String> {
    ensure!(
        plan.num_tokens <= cfg.max_num_batched_tokens,
        "{} tokens over the budget of {}: {plan:?}",
        plan.num_tokens,
        cfg.max_num_batched_tokens
    );
    ensure!(
        plan.num_groups() <= cfg.max_num_seqs,
        "{} row groups over the cap of {}: {plan:?}",
        plan.num_groups(),
        cfg.max_num_seqs
    );
    let rows: usize = plan.prefill.iter().map(|c| c.len).sum::<usize>()
        + plan.decode.iter().map(|d| 1 + d.drafts).sum::<usize>();
    ensure!(
        rows == plan.num_tokens,
        "{rows} rows, num_tokens {}: {plan:?}",
        plan.num_tokens
    );
    ensure!(
        plan.prefill
            .iter()
            .all(|c| c.len <= cfg.max_chunk_tokens && c.len > 0),
        "a chunk is empty or over {}: {plan:?}",
        cfg.max_chunk_tokens
    );
    Ok(())
}

/// Checks the scheduler's block manager: its own invariants
/// ([`deepinfer_kv::testing::check_invariants`]), and for every request it holds blocks for, no
/// more committed tokens than the request's history and no token copy of its own (the history
/// is the token list).
pub fn check_invariants(s: &Scheduler) -> Result<(), String> {
    deepinfer_kv::testing::check_invariants(s.kv())?;
    for id in s.kv().sequence_ids() {
        let Some(h) = s.tokens(id) else {
            continue;
        };
        let c = s.kv().num_committed(id).map_err(|e| e.to_string())?;
        ensure!(
            c <= h.len(),
            "request {id}: {c} committed, history {}",
            h.len()
        );
        ensure!(
            s.kv().tokens(id) == Err(KvError::TokensNotKept(id)),
            "request {id}: the block manager keeps its tokens"
        );
    }
    Ok(())
}

/// Runs workload `w` on the fake engine and returns the finished requests, the step each
/// request was first scheduled (by index) and the scheduler. `depth` is how many plans are
/// scheduled ahead of the step the engine runs (0 synchronous, 1 overlapped, 2 two-step
/// overlap); `dense` answers decode rows in the dense form ([`run_dense`]).
///
/// # Panics
///
/// If a plan breaks [`check_plan`] or [`check_invariants`] fails after an update, if
/// scheduling or an update fails, as [`run`], or if requests are left after 5,000 steps.
pub fn simulate(
    w: &Workload,
    depth: usize,
    dense: bool,
) -> (Vec<Finished>, Vec<Option<usize>>, Scheduler) {
    simulate_arrivals(w, depth, dense, Arrival::BeforePlan)
}

/// When the requests of a simulated step arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Before the step is planned.
    BeforePlan,
    /// While it computes, after the plans ahead were made: they wait for the next plan.
    Late,
    /// While it computes, and they join the last plan made ahead through
    /// [`Scheduler::admit_into_planned`].
    LateAmended,
}

/// [`simulate`] with requests arriving as `arrival` says.
pub fn simulate_arrivals(
    w: &Workload,
    depth: usize,
    dense: bool,
    arrival: Arrival,
) -> (Vec<Finished>, Vec<Option<usize>>, Scheduler) {
    let late = arrival != Arrival::BeforePlan;
    let cfg = w.config();
    let mut s = scheduler(cfg.clone(), w.blocks, w.block_size);
    let mut done = Vec::new();
    let mut first = vec![None; w.reqs.len()];
    let mut queue: VecDeque<StepPlan> = VecDeque::new();
    let last_arrival = w.reqs.iter().map(|r| r.0).max().unwrap_or(0);
    for step in 0..5000 {
        if !late {
            arrive(w, step, &mut s);
        }
        for &(at, i) in &w.aborts {
            if at == step
                && i < w.reqs.len()
                && let Ok(f) = s.abort(i as RequestId)
            {
                done.push(f);
            }
        }
        if step > last_arrival && s.is_idle() && queue.is_empty() {
            break;
        }
        let plan = match queue.pop_front() {
            Some(p) => p,
            None => s.schedule().unwrap(),
        };
        // Budget invariants of every plan the engine sees.
        if let Err(e) = check_plan(&plan, &cfg) {
            panic!("step {step}: {e}");
        }
        for id in plan.requests() {
            let f = &mut first[id as usize];
            if f.is_none() {
                *f = Some(step);
            }
        }
        let out = if dense {
            run_dense(&plan, &s)
        } else {
            run(&plan, &s)
        };
        // Plan ahead while this step runs.
        while queue.len() < depth {
            queue.push_back(s.schedule().unwrap());
        }
        if late {
            arrive(w, step, &mut s);
            if arrival == Arrival::LateAmended
                && let Some(p) = queue.back_mut()
            {
                s.admit_into_planned(p).unwrap();
            }
        }
        let res = s.update(&out).unwrap();
        if let Err(e) = check_invariants(&s) {
            panic!("step {step}: {e}");
        }
        done.extend(res.finished.iter().cloned());
        if let Some(p) = queue.get_mut(0) {
            res.apply_to(p);
        }
        if let Some(p) = queue.get_mut(1) {
            res.apply_later_to(p);
        }
    }
    assert!(s.is_idle(), "requests left after 5000 steps");
    (done, first, s)
}

/// Submit the requests of `w` that arrive at `step`.
fn arrive(w: &Workload, step: usize, s: &mut Scheduler) {
    for (i, r) in w.reqs.iter().enumerate() {
        if r.0 == step {
            let mut q = req(i as RequestId, r.1, r.2);
            q.priority = r.3;
            s.add_request(q).unwrap();
        }
    }
}

/// Checks that every request of `w` ended exactly once: with its [`expected_output`], or aborted
/// (by one of `w`'s aborts) with a prefix of it; and that `s` holds no block any more.
pub fn check_all_accounted(w: &Workload, done: &[Finished], s: &Scheduler) -> Result<(), String> {
    for i in 0..w.reqs.len() {
        let f: Vec<&Finished> = done.iter().filter(|f| f.id == i as RequestId).collect();
        ensure!(f.len() == 1, "request {i} ended {} times", f.len());
        let (_, len, max_new, _) = w.reqs[i];
        let exp = expected_output(i as RequestId, len, max_new);
        match f[0].reason {
            FinishReason::Aborted => {
                ensure!(
                    w.aborts.iter().any(|a| a.1 == i),
                    "request {i} aborted unasked"
                );
                // Whatever it produced before the abort is a prefix of the true stream.
                ensure!(
                    exp.starts_with(f[0].output()),
                    "request {i}: aborted with {:?}, not a prefix of {exp:?}",
                    f[0].output()
                );
            }
            r => {
                ensure!(r == FinishReason::Length, "request {i} finished with {r:?}");
                ensure!(
                    f[0].output() == exp,
                    "request {i}: output {:?}, expected {exp:?}",
                    f[0].output()
                );
            }
        }
    }
    ensure!(
        s.kv().usage().used == 0,
        "blocks leaked: {:?}",
        s.kv().usage()
    );
    Ok(())
}

/// A random expert load and placement problem: 1 to 3 layers, experts = groups (1 to 8) × group
/// size (1 to 3), devices = nodes (1 to 4) × devices per node (1 to 3), slots = devices × slots
/// per device ≥ experts, loads in `[0, 1000)`.
pub fn expert_load_case() -> impl Strategy<Value = (ExpertLoad, EplbConfig)> {
    (
        1usize..4,
        1usize..5,
        1usize..9,
        1usize..4,
        1usize..4,
        0usize..5,
    )
        .prop_flat_map(
            |(layers, nodes, groups_per_node_or_any, gsize, dev_per_node, extra)| {
                let groups = groups_per_node_or_any;
                let experts = groups * gsize;
                let devices = nodes * dev_per_node;
                let per_dev = experts.div_ceil(devices) + extra;
                let cfg = EplbConfig {
                    slots: devices * per_dev,
                    groups,
                    nodes,
                    devices,
                };
                (
                    prop::collection::vec(0.0f64..1000.0, layers * experts),
                    Just((layers, experts, cfg)),
                )
            },
        )
        .prop_map(|(data, (layers, experts, cfg))| {
            (
                ExpertLoad::new(layers, experts, data).expect("a consistent load"),
                cfg,
            )
        })
}

/// Checks a placement for `load` under `cfg`: it validates, fills every slot, spreads them
/// evenly over the devices, keeps at least one replica of every expert, and its device loads
/// add up to each layer's load.
pub fn check_placement(p: &Placement, load: &ExpertLoad, cfg: &EplbConfig) -> Result<(), String> {
    p.validate().map_err(|e| e.to_string())?;
    ensure!(
        p.slots() == cfg.slots,
        "{} slots, configured {}",
        p.slots(),
        cfg.slots
    );
    ensure!(
        p.slots_per_device() * cfg.devices == cfg.slots,
        "{} slots per device on {} devices for {} slots",
        p.slots_per_device(),
        cfg.devices,
        cfg.slots
    );
    for l in 0..load.layers() {
        let counts = p.replica_counts(l);
        ensure!(
            counts.iter().all(|&c| c >= 1),
            "layer {l}: an expert lost its replica"
        );
        let replicas = counts.iter().map(|&c| c as usize).sum::<usize>();
        ensure!(
            replicas == cfg.slots,
            "layer {l}: {replicas} replicas in {} slots",
            cfg.slots
        );
        // Device loads add up to the layer's total load.
        let total: f64 = load.layer(l).iter().sum();
        let dev: f64 = p.device_loads(l, load).iter().sum();
        ensure!(
            (total - dev).abs() <= 1e-6 * total.max(1.0),
            "layer {l}: device loads sum to {dev}, the layer's to {total}"
        );
    }
    Ok(())
}
