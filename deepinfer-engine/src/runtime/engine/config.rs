//! The engine's settings.

use super::*;

/// Engine settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// KV blocks in the pool, when [`EngineConfig::kv_cache_memory`] is `None` (fewer blocks
    /// means preemption sooner).
    pub num_blocks: usize,
    /// The KV pool's memory budget: the block count then comes from the model's cache layout
    /// (`Model::kv_layout`) and this budget, and `num_blocks` is not used. `None`: exactly
    /// `num_blocks` blocks.
    pub kv_cache_memory: Option<KvCacheMemory>,
    /// Tokens per KV block (also the granularity of prefix hits); 0: the model's block size,
    /// the least multiple of 32, of every compression ratio and of the sliding window
    /// (rounded up to a power of two, at most 128): 128 for V4.1-Flash and V4-Flash.
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
    /// Per-position temperatures applied to the drafter's confidences before the budgeted
    /// planner reads them (see `runtime::draft_calibration`); `None`: as the drafter gives
    /// them. The CLI reads a model directory's `dspark_calibration.json`.
    pub draft_calibration: Option<deepinfer_spec::TemperatureScaling>,
    /// Overlapped scheduling: step N's device work runs on a worker thread while this
    /// thread parses step N−1's tokens and plans step N+1 (see the module docs). Outputs
    /// are the same either way; off runs every step in order. The device loop runs on a
    /// thread of rayon's global pool; a `generate` call made from inside a rayon pool runs in
    /// order (it could hold the pool's only thread).
    pub overlap: bool,
    /// Debug mode: with overlap, fail with [`ModelError::HostSync`] when the host thread
    /// reads device results while a step is in flight (a host–device synchronisation).
    pub sync_check: bool,
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
    /// Bounded replay: a prefix hit whose window state is not stored resumes from a state
    /// without one and replays only the last `sliding_window` tokens before the hit (window
    /// attention then sees no rows before the replay, compressor overlap rows are lost), as
    /// production engines do, instead of recomputing exactly from the nearest stored state
    /// or from position 0 (`false`, the default). Approximate: see the engine README.
    pub bounded_replay: bool,
    /// Expert parallelism over this many in-process ranks (1: off): each forward splits its
    /// sequences over the ranks (data-parallel attention) and the ranks exchange token rows
    /// with the rank holding each routed expert at every MoE layer ([`Model::forward_ep`]);
    /// with batch-invariant kernels outputs are those of one rank. At most the number of
    /// routed experts. The drafter's experts run where its rows are.
    pub expert_parallel: usize,
    /// EPLB: with expert parallelism, re-place the routed experts every this many steps from
    /// the expert load counted since the last placement (one redundant replica per rank;
    /// after the first placement at most two slot moves per layer). `None`: the contiguous
    /// split throughout.
    pub eplb_interval: Option<usize>,
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
            kv_cache_memory: None,
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
            draft_calibration: None,
            overlap: true,
            sync_check: false,
            step_time_budget_ms: None,
            spec_slack: 6,
            bounded_replay: false,
            expert_parallel: 1,
            eplb_interval: None,
        }
    }
}
