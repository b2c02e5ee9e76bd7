//! The scheduler's public settings and counters.
//!
//! A [`SchedulerConfig`] that passes `check` has every budget non-zero and a
//! finite, positive step time budget (if any); [`Scheduler::new`] refuses any
//! other.
//!
//! [`Scheduler::new`]: super::Scheduler::new

use crate::error::SchedError;

/// Token id written into the KV manager for draft rows, whose ids the
/// scheduler does not know. `update` commits accepted drafts under the ids
/// the engine reports (`BlockManager::commit_drafts`), so they are cached
/// under the right hashes.
pub const PLACEHOLDER_TOKEN: u32 = u32::MAX;

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
    ///
    /// [`Scheduler::with_planner`]: super::Scheduler::with_planner
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
    /// Every budget is non-zero and the time budget, if any, finite and positive.
    pub(super) fn check(&self) -> Result<(), SchedError> {
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
