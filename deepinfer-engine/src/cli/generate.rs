//! `deepinfer generate`: OpenAI Batch API JSONL in, matching output JSONL out; `--prompt`
//! for a quick answer; with no `--model` the embedded default (random weights) and, with no
//! `--input` either, the built-in sample batch.

use super::CliResult;
use super::backend::{self, BackendArg};
use crate::model::Model;
use crate::runtime::{
    ChatFrontend, DEFAULT_SEED, Engine, EngineConfig, SAMPLE_BATCH, default_model_dir,
    materialize_default, run_batch,
};
use clap::Args;
use deepinfer_kernels::{Backend, CpuBackend, CpuConfig};
use deepinfer_recipe::PromptTokenizer;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Arguments of `deepinfer generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Model directory (config.json, weights, engram_token_map.json for V4.1, optionally
    /// tokenizer.json). Default: the embedded tiny V4.1 model with random weights.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// OpenAI Batch API input (JSONL of chat-completions requests).
    #[arg(long, conflicts_with = "prompt")]
    pub input: Option<PathBuf>,
    /// A single user message; the answer is printed.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Output JSONL (default ./deepinfer-output.jsonl; with --prompt, nothing is written unless given).
    #[arg(long)]
    pub output: Option<PathBuf>,
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
    /// KV pool size in blocks.
    #[arg(long, default_value_t = 4096)]
    pub num_blocks: usize,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
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
    /// Disable prefix caching.
    #[arg(long)]
    pub no_prefix_cache: bool,
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

/// The tokenizer for a model directory: its `tokenizer.json`, else the vendored DeepSeek V4 one.
fn tokenizer_for(dir: Option<&Path>, vocab: usize) -> Result<PromptTokenizer, String> {
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

/// Run `deepinfer generate`.
pub fn run(a: &GenerateArgs) -> CliResult {
    let cpu = CpuConfig {
        batch_invariant: a.deterministic,
        threads: a.threads,
    };
    match a.backend {
        BackendArg::Cpu => run_on(a, CpuBackend::with_config(cpu)?),
        BackendArg::Cuda => run_on(a, backend::cuda(cpu)?),
    }
}

fn run_on<B: Backend>(a: &GenerateArgs, be: B) -> CliResult
where
    B::Tensor: Clone,
{
    let t_load = std::time::Instant::now();
    let (model, label) = match &a.model {
        Some(dir) => (Model::load(dir, be)?, dir.display().to_string()),
        None => {
            let dir = default_model_dir(DEFAULT_SEED);
            if !dir.join("model.safetensors").exists() {
                eprintln!(
                    "creating the embedded default model (seed {DEFAULT_SEED:#x}) in {}",
                    dir.display()
                );
            }
            let dir = materialize_default(&dir, DEFAULT_SEED)?;
            (
                Model::load(&dir, be)?,
                "embedded default (tiny deepseek_v41, RANDOM weights: its text is not meaningful)"
                    .to_string(),
            )
        }
    };
    let tok = tokenizer_for(a.model.as_deref(), model.cfg.vocab_size)?;
    let mut front = ChatFrontend::new(tok, model.kind());
    front.default_max_tokens = a.max_tokens;
    front.default_thinking = a.thinking;
    let cfg = EngineConfig {
        num_blocks: a.num_blocks,
        block_size: a.block_size,
        max_num_seqs: a.max_num_seqs,
        max_num_batched_tokens: a.max_num_batched_tokens,
        prefix_caching: !a.no_prefix_cache,
        spec_drafts: a.spec_drafts,
        spec_budget: a.spec_budget.into(),
        overlap: !a.no_overlap,
        sync_check: a.sync_check,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(model, cfg)?.with_tokenizer(front.tokenizer().clone());
    let load_s = t_load.elapsed().as_secs_f64();

    let (input, source) = match (&a.prompt, &a.input) {
        (Some(p), _) => {
            let line = serde_json::json!({"custom_id": "prompt", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "deepinfer", "messages": [{"role": "user", "content": p}]}});
            (line.to_string(), "--prompt".to_string())
        }
        (None, Some(path)) => (
            std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
            path.display().to_string(),
        ),
        (None, None) => (
            SAMPLE_BATCH.to_string(),
            "the built-in sample batch".to_string(),
        ),
    };
    let n_lines = input.lines().filter(|l| !l.trim().is_empty()).count();
    let bar = if n_lines > 1 {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} requests  {msg}")
                .map_err(|e| e.to_string())?,
        );
        Some(b)
    } else {
        None
    };
    let t_gen = std::time::Instant::now();
    let (records, sum) = run_batch(
        &mut engine,
        &front,
        &input,
        a.seed,
        |done, total, tokens| {
            if let Some(b) = &bar {
                b.set_length(total as u64);
                b.set_position(done as u64);
                let s = t_gen.elapsed().as_secs_f64().max(1e-9);
                b.set_message(format!("{tokens} tokens, {:.0} tok/s", tokens as f64 / s));
            }
        },
    )?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let m = engine.metrics();
    if a.prompt.is_some() {
        let rec = records.first().ok_or("no output")?;
        if let Some(err) = rec.get("error").filter(|e| !e.is_null()) {
            return Err(err["message"]
                .as_str()
                .unwrap_or("request failed")
                .to_string()
                .into());
        }
        let msg = &rec["response"]["body"]["choices"][0]["message"];
        if let Some(r) = msg
            .get("reasoning_content")
            .and_then(|r| r.as_str())
            .filter(|r| !r.is_empty())
        {
            println!("[reasoning] {r}");
        }
        println!("{}", msg["content"].as_str().unwrap_or_default());
    }
    let out_path = match (&a.output, &a.prompt) {
        (Some(p), _) => Some(p.clone()),
        (None, None) => Some(PathBuf::from("deepinfer-output.jsonl")),
        (None, Some(_)) => None,
    };
    if let Some(path) = &out_path {
        let f = std::fs::File::create(path)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        let mut w = std::io::BufWriter::new(f);
        for r in &records {
            writeln!(w, "{r}").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        w.flush()
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    eprintln!("model: {label} (ready in {load_s:.1} s)");
    eprintln!(
        "{} request line(s) from {source}: {} completed, {} error record(s); {} prompt + {} generated tokens in {:.2} s ({:.0} generated tok/s)",
        sum.lines,
        sum.completed,
        sum.errors,
        sum.prompt_tokens,
        sum.generated_tokens,
        sum.elapsed_s,
        sum.generated_tokens as f64 / sum.elapsed_s.max(1e-9)
    );
    eprintln!(
        "steps {}, forward {:.0} ms, sampling {:.0} ms, grammar {:.0} ms, scheduling {:.0} ms, building steps {:.0} ms, parsing {:.0} ms (host work done while a step computed: {:.0} ms); prefix-cached prompt tokens {}, preemptions {}, forks {}",
        m.steps,
        m.forward_ms,
        m.sample_ms,
        m.grammar_ms,
        m.sched_ms,
        m.build_ms,
        m.post_ms,
        m.hidden_ms,
        m.cached_prompt_tokens,
        m.preemptions,
        m.forks
    );
    if m.spec_rows > 0 {
        eprintln!(
            "speculation ({:?}): {} drafts per row at most, {:.2} drafts per verified row, acceptance {:.1}% ({} of {}), {:.2} tokens per verified row, drafting {:.0} ms",
            a.spec_budget,
            a.spec_drafts,
            m.draft_tokens as f64 / m.spec_rows as f64,
            100.0 * m.accepted_drafts as f64 / m.draft_tokens.max(1) as f64,
            m.accepted_drafts,
            m.draft_tokens,
            1.0 + m.accepted_drafts as f64 / m.spec_rows as f64,
            m.draft_ms
        );
    }
    if let Some(path) = out_path {
        println!("outputs written to {}", path.display());
    }
    Ok(())
}
