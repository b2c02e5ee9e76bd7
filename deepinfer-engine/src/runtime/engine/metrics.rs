//! Counters and step-time figures over an engine's life.

/// Draft positions counted one by one in [`Metrics::drafts_offered_at`] (deeper drafts count
/// in the totals only).
pub const DRAFT_POSITIONS: usize = 8;

/// How many recent step times [`Engine::step_times`] summarises.
pub const STEP_HISTORY: usize = 65_536;

/// One step as it ran: its wall time and what it held.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepRecord {
    /// Wall time, ms.
    pub ms: f32,
    /// The scheduler's predicted time, ms (a step-time budget is set).
    pub predicted_ms: Option<f32>,
    /// Decode rows (requests past their prompt, one row each plus their drafts).
    pub decode_rows: u32,
    /// Prompt tokens prefilled (all chunks).
    pub prefill_tokens: u32,
}

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

    /// The percentiles of the steps of `steps` that `keep` selects (say, those with decode
    /// rows: the step time a decoding request sees).
    pub fn of_steps(steps: &[StepRecord], keep: impl Fn(&StepRecord) -> bool) -> Self {
        let ms: Vec<f32> = steps.iter().filter(|s| keep(s)).map(|s| s.ms).collect();
        Self::of(&ms)
    }
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
    /// Prefix hits resumed by bounded replay (`EngineConfig::bounded_replay`): a windowless
    /// state and the last window of tokens replayed.
    pub bounded_replays: u64,
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
    /// Rows that verified a draft at position `i` (zero-based), for each `i`.
    pub drafts_offered_at: [u64; DRAFT_POSITIONS],
    /// Rows whose verification kept drafts `0..=i` (every draft up to position `i`).
    pub drafts_accepted_at: [u64; DRAFT_POSITIONS],
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
    /// EPLB placements made.
    pub eplb_rebalances: u64,
    /// Expert slots moved by EPLB after its first placement.
    pub eplb_moved_slots: u64,
    /// `moe_lb` (mean over layers) of the contiguous split under the load the last EPLB
    /// placement was made from (0 before any).
    pub moe_lb_contiguous: f64,
    /// `moe_lb` of that placement under the same load (0 before any).
    pub moe_lb_placed: f64,
}
