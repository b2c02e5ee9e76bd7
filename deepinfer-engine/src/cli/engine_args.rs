//! The model and engine flags `generate` and `serve` share, and the engine they build.

use super::backend::BackendArg;
use crate::model::Model;
use crate::runtime::draft_calibration::load_calibration;
use crate::runtime::{
    ChatFrontend, Engine, EngineConfig, KvCacheMemory, KvPool, default_model_dir,
    materialize_default,
};
use clap::Args;
use deepinfer_kernels::{Backend, CpuConfig};
use deepinfer_recipe::PromptTokenizer;
use std::path::{Path, PathBuf};

/// The model and the engine settings.
#[derive(Debug, Args)]
pub struct EngineArgs {
    /// Model directory (config.json, weights, engram_token_map.json for V4.1, optionally
    /// tokenizer.json). Default: the embedded toy V4.1 model, trained on Shakespeare.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// `max_tokens` for requests that do not set it.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Base of the per-request seeds of requests that do not set one (line number mixed in).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Deterministic mode: batch-invariant kernels (a request's tokens and log-probabilities do
    /// not depend on its batch-mates or the batch order).
    #[arg(long)]
    pub deterministic: bool,
    /// Thinking mode for requests that do not say.
    #[arg(long)]
    pub thinking: bool,
    /// Numerics of the model (`--fp8-activations`).
    #[command(flatten)]
    pub numerics: NumericsArgs,
    /// KV pool memory: a size (`512M`, `4G`) for the window state of `--max-num-seqs`
    /// sequences and the paged blocks, or `auto` (half the available host memory; `auto:F`
    /// for a fraction F), capped at what `--max-num-seqs` full-length sequences can use.
    #[arg(long, default_value = "auto", value_parser = parse_kv_cache_memory)]
    pub kv_cache_memory: KvCacheMemory,
    /// KV pool size in blocks, instead of `--kv-cache-memory`.
    #[arg(long)]
    pub num_blocks: Option<usize>,
    /// Tokens per KV block (the granularity of prefix hits). Default: the model's block size
    /// (128 for V4.1-Flash and V4-Flash, 32 for the embedded model).
    #[arg(long)]
    pub block_size: Option<usize>,
    /// Most sequences per step.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Most tokens per step.
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// DSpark drafts verified per decode step (fixed-length verification; 0 = off; the model
    /// needs the drafter, as the embedded default has).
    #[arg(long, default_value_t = 0)]
    pub spec_drafts: usize,
    /// `fixed`: every decode row verifies `--spec-drafts` (deterministic); `budgeted`: the
    /// draft planner splits each step's rows from the drafter's confidences and the measured
    /// step times (at most `--spec-drafts` per row).
    #[arg(long, value_enum, default_value_t = SpecBudgetArg::Fixed)]
    pub spec_budget: SpecBudgetArg,
    /// Time-budgeted chunked prefill: each step prefills what the calibrated cost model
    /// predicts to fit this many milliseconds with the step's decode rows (keeps decode
    /// latency bounded while long prompts arrive). Default: token budget only.
    #[arg(long)]
    pub step_time_budget_ms: Option<f64>,
    /// Prompt tokens beyond the last window that a prefix hit always recomputes (a hit
    /// reuses at most L − window − slack tokens; DeepSeek's rule uses 6).
    #[arg(long, default_value_t = 6)]
    pub spec_slack: usize,
    /// A prefix hit without a stored window state replays only the last window of tokens
    /// before it (approximate, as production does) instead of recomputing exactly from the
    /// nearest stored state.
    #[arg(long)]
    pub bounded_replay: bool,
    /// Disable prefix caching.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Expert parallelism over N in-process CPU ranks: each step's sequences are split over
    /// the ranks, which exchange token rows with the rank holding each routed expert.
    #[arg(long, default_value_t = 1)]
    pub expert_parallel: usize,
    /// EPLB with `--expert-parallel`: re-place the routed experts (with a redundant replica
    /// per rank) every this many steps from the measured expert load.
    #[arg(long)]
    pub eplb_interval: Option<usize>,
    /// Keep a prefix state every this many prompt tokens (0: only at each prompt's largest
    /// reusable prefix), so prompts sharing a prefix resume near where they diverge.
    #[arg(long, default_value_t = 512)]
    pub prefix_state_interval: usize,
    /// Most bytes of prefix model states the host tier keeps (e.g. `512M`, `4G`, `1GiB`).
    #[arg(long, default_value = "1G", value_parser = parse_bytes)]
    pub window_cache_memory: u64,
    /// Persistent prefix cache: write prefix states to this directory and find those of
    /// earlier runs of the same model, backend and cache format there.
    #[arg(long)]
    pub kv_cache_dir: Option<PathBuf>,
    /// Most bytes `--kv-cache-dir` keeps (least recently used states are reclaimed).
    #[arg(long, default_value = "8G", value_parser = parse_bytes)]
    pub kv_cache_dir_size: u64,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Run every step in order instead of overlapping the host work (parsing the last
    /// step, planning the next) with the device work of the current one.
    #[arg(long)]
    pub no_overlap: bool,
    /// Debug: fail loudly if the host thread reads device results while a step computes.
    #[arg(long)]
    pub sync_check: bool,
    /// Compute backend: `cpu` (default) or `cuda` (GPU 0; needs a build with the `cuda`
    /// feature, the CUDA driver and libnvrtc at run time).
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    pub backend: BackendArg,
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts_parse_with_units_and_reject_nonsense() {
        assert_eq!(parse_bytes("123"), Ok(123));
        assert_eq!(parse_bytes("4G"), Ok(4 << 30));
        assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
        assert_eq!(parse_bytes("512mb"), Ok(512 << 20));
        assert_eq!(parse_bytes("2K"), Ok(2048));
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("G").is_err());
        assert!(parse_bytes("4X").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }
}

/// Numerics options of the model, shared by the commands that load one.
#[derive(Debug, Args)]
pub struct NumericsArgs {
    /// Round the input of every FP8/FP4-weight product to FP8 (e4m3, a power-of-two scale
    /// per 32 channels) as DeepSeek's kernels do: a fidelity mode, off by default; no effect
    /// on a checkpoint without quantised weights.
    #[arg(long)]
    pub fp8_activations: bool,
}

impl NumericsArgs {
    /// Set them on `model`.
    pub fn apply<B: Backend>(&self, model: &mut Model<B>) {
        model.set_fp8_activations(self.fp8_activations);
    }
}

/// `--spec-budget` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SpecBudgetArg {
    /// Fixed drafts per decode row.
    Fixed,
    /// Draft rows planned per step.
    Budgeted,
}

impl From<SpecBudgetArg> for crate::runtime::SpecBudget {
    fn from(a: SpecBudgetArg) -> Self {
        match a {
            SpecBudgetArg::Fixed => Self::Fixed,
            SpecBudgetArg::Budgeted => Self::Budgeted,
        }
    }
}

/// A byte count: a number with an optional unit, `K`/`M`/`G`/`T` (powers of 1024, with or
/// without `i` and `B`: `4G`, `4GiB`, `4GB` are the same) or none (bytes).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a byte count (e.g. 512M, 4G)"))?;
    let shift = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches('B')
        .trim_end_matches('I')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("`{s}`: unknown unit (use K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// One line saying how the KV pool was sized, for the CLI's start-up report.
pub fn pool_line(pool: &KvPool, sequences: usize) -> String {
    format!(
        "kv pool: {} blocks of {} tokens ({} tokens), {:.1} MiB with the window state of {} sequences",
        pool.num_blocks,
        pool.block_size,
        pool.num_blocks * pool.block_size,
        pool.bytes(sequences) as f64 / (1u64 << 20) as f64,
        sequences
    )
}

/// `auto`, `auto:F` (a fraction in (0, 1]) or a byte size, for `--kv-cache-memory`.
pub fn parse_kv_cache_memory(s: &str) -> Result<KvCacheMemory, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("auto") {
        return Ok(KvCacheMemory::Auto(0.5));
    }
    if let Some(f) = t.strip_prefix("auto:") {
        let v: f64 = f
            .parse()
            .map_err(|_| format!("`{s}`: the fraction after auto: is not a number"))?;
        if !(v > 0.0 && v <= 1.0) {
            return Err(format!("`{s}`: the fraction must be in (0, 1]"));
        }
        return Ok(KvCacheMemory::Auto(v));
    }
    match parse_bytes(t)? {
        0 => Err(format!("`{s}`: the KV cache needs some memory")),
        b => Ok(KvCacheMemory::Bytes(b)),
    }
}

/// The tokenizer for a model directory: its `tokenizer.json`, else the vendored DeepSeek V4 one.
pub fn tokenizer_for(dir: Option<&Path>, vocab: usize) -> Result<PromptTokenizer, String> {
    let tok = match dir.map(|d| d.join("tokenizer.json")).filter(|p| p.exists()) {
        Some(p) => {
            let bytes =
                std::fs::read(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            PromptTokenizer::from_json_bytes(&bytes).map_err(|e| format!("{}: {e}", p.display()))?
        }
        None => PromptTokenizer::deepseek_v4().map_err(|e| e.to_string())?,
    };
    if tok.vocab_size() > vocab {
        return Err(format!(
            "the tokenizer has {} tokens but the model only {vocab}; put a matching tokenizer.json in the model directory",
            tok.vocab_size()
        ));
    }
    Ok(tok)
}

/// A loaded engine with its chat front end.
pub struct Loaded<B: Backend> {
    /// The engine (tokenizer attached).
    pub engine: Engine<B>,
    /// Chat bodies to requests and back.
    pub front: ChatFrontend,
    /// What was loaded, for the user.
    pub label: String,
    /// Load time, s.
    pub load_s: f64,
}

impl EngineArgs {
    /// The CPU backend's settings.
    pub fn cpu_config(&self) -> CpuConfig {
        CpuConfig {
            batch_invariant: self.deterministic,
            threads: self.threads,
        }
    }

    /// The engine configuration these flags give.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            num_blocks: self
                .num_blocks
                .unwrap_or(EngineConfig::default().num_blocks),
            kv_cache_memory: match self.num_blocks {
                Some(_) => None,
                None => Some(self.kv_cache_memory),
            },
            block_size: self.block_size.unwrap_or(0),
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            prefix_caching: !self.no_prefix_cache,
            spec_drafts: self.spec_drafts,
            spec_budget: self.spec_budget.into(),
            overlap: !self.no_overlap,
            sync_check: self.sync_check,
            step_time_budget_ms: self.step_time_budget_ms,
            spec_slack: self.spec_slack,
            bounded_replay: self.bounded_replay,
            expert_parallel: self.expert_parallel,
            eplb_interval: self.eplb_interval,
            prefix_state_interval: self.prefix_state_interval,
            window_cache_memory: self.window_cache_memory,
            kv_cache_dir: self.kv_cache_dir.clone(),
            kv_cache_dir_size: self.kv_cache_dir_size,
            ..EngineConfig::default()
        }
    }

    /// Load the model (or make the embedded default), its tokenizer and the engine.
    pub fn load<B: Backend>(
        &self,
        be: B,
    ) -> Result<Loaded<B>, Box<dyn std::error::Error + Send + Sync>>
    where
        B::Tensor: Clone,
    {
        let t_load = std::time::Instant::now();
        let (dir, label) = match &self.model {
            Some(dir) => (dir.clone(), dir.display().to_string()),
            None => {
                let dir = default_model_dir();
                if !dir.join("model.safetensors").exists() {
                    eprintln!(
                        "unpacking the embedded default model into {}",
                        dir.display()
                    );
                }
                (
                    materialize_default(&dir)?,
                    "embedded default (a toy deepseek_v41 trained on Shakespeare)".to_string(),
                )
            }
        };
        let mut model = Model::load(&dir, be)?;
        self.numerics.apply(&mut model);
        let mut cfg = self.engine_config();
        cfg.draft_calibration = load_calibration(&dir)?;
        if let Some(s) = model.skipped_summary() {
            eprintln!("{s}");
        }
        let tok = tokenizer_for(self.model.as_deref(), model.cfg.vocab_size)?;
        let mut front = ChatFrontend::new(tok, model.kind());
        front.default_max_tokens = self.max_tokens;
        front.default_thinking = self.thinking;
        let engine = Engine::new(model, cfg)?.with_tokenizer(front.tokenizer().clone());
        Ok(Loaded {
            engine,
            front,
            label,
            load_s: t_load.elapsed().as_secs_f64(),
        })
    }
}
