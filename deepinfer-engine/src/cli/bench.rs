//! `deepinfer bench`: offline runs at several concurrencies on the given or embedded model;
//! prints a table and writes JSON and an SVG chart.

use super::CliResult;
use super::generate::SpecBudgetArg;
use crate::model::Model;
use crate::runtime::bench::{bench_json, bench_svg, bench_table, run_bench};
use crate::runtime::{DEFAULT_SEED, Engine, EngineConfig, default_model_dir, materialize_default};
use clap::Args;
use deepinfer_kernels::{CpuBackend, CpuConfig};
use std::path::PathBuf;

/// Arguments of `deepinfer bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Model directory (default: the embedded tiny V4.1 model with random weights).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Concurrency levels.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 4, 16, 64])]
    pub concurrency: Vec<usize>,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 64)]
    pub prompt_len: usize,
    /// New tokens per request.
    #[arg(long, default_value_t = 32)]
    pub new_tokens: usize,
    /// DSpark drafts per decode step (0 = off; with `--spec-budget budgeted` the most per row).
    #[arg(long, default_value_t = 0)]
    pub spec_drafts: usize,
    /// `fixed`: every decode row verifies `--spec-drafts`; `budgeted`: the draft planner
    /// splits each step's rows from the drafter's confidences and measured step times.
    #[arg(long, value_enum, default_value_t = SpecBudgetArg::Fixed)]
    pub spec_budget: SpecBudgetArg,
    /// Batch-invariant kernels.
    #[arg(long)]
    pub deterministic: bool,
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
    /// Write the run's engine figures (prompt, computed and cached tokens, preemptions,
    /// step-time percentiles, KV blocks) to this JSON file.
    #[arg(long)]
    pub metrics_json: Option<PathBuf>,
    /// Time-budgeted chunked prefill (see `generate --step-time-budget-ms`).
    #[arg(long)]
    pub step_time_budget_ms: Option<f64>,
    /// Count the tokens routed to each expert and report the `moe_lb` (max over mean load
    /// per rank) that this many expert-parallel ranks would see, with the experts split
    /// contiguously and with EPLB's placement from the measured counts.
    #[arg(long)]
    pub expert_load_ranks: Option<usize>,
    /// Expert parallelism over N in-process CPU ranks (see `generate --expert-parallel`).
    #[arg(long, default_value_t = 1)]
    pub expert_parallel: usize,
    /// EPLB every this many steps (see `generate --eplb-interval`).
    #[arg(long)]
    pub eplb_interval: Option<usize>,
    /// Output prefix: writes PREFIX.json and PREFIX.svg.
    #[arg(long, default_value = "deepinfer-bench")]
    pub output: PathBuf,
}

/// Run `deepinfer bench`.
pub fn run(a: &BenchArgs) -> CliResult {
    let be = CpuBackend::with_config(CpuConfig {
        batch_invariant: a.deterministic,
        threads: a.threads,
    })?;
    let (mut model, label) = match &a.model {
        Some(dir) => (Model::load(dir, be)?, dir.display().to_string()),
        None => {
            let dir = materialize_default(&default_model_dir(DEFAULT_SEED), DEFAULT_SEED)?;
            (
                Model::load(&dir, be)?,
                "embedded default (random weights)".to_string(),
            )
        }
    };
    if let Some(r) = a.expert_load_ranks {
        let e = model.cfg.n_routed_experts;
        if r == 0 || !e.is_multiple_of(r) {
            return Err(format!(
                "--expert-load-ranks: {e} experts do not split evenly over {r} ranks"
            )
            .into());
        }
    }
    model.count_expert_load(a.expert_load_ranks.is_some());
    let max_c = a.concurrency.iter().copied().max().unwrap_or(1);
    let cfg = EngineConfig {
        max_num_seqs: max_c,
        max_num_batched_tokens: (max_c * (a.spec_drafts + 1)).max(a.prompt_len * 4).max(256),
        max_model_len: a.prompt_len + a.new_tokens + 16,
        prefix_caching: false,
        spec_drafts: a.spec_drafts,
        spec_budget: a.spec_budget.into(),
        overlap: !a.no_overlap,
        sync_check: a.sync_check,
        step_time_budget_ms: a.step_time_budget_ms,
        expert_parallel: a.expert_parallel,
        eplb_interval: a.eplb_interval,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(model, cfg)?;
    eprintln!(
        "bench on {label}: prompts of {} tokens, {} new tokens each, concurrency {:?}",
        a.prompt_len, a.new_tokens, a.concurrency
    );
    let points = run_bench(
        &mut engine,
        &a.concurrency,
        a.prompt_len,
        a.new_tokens,
        |p| {
            eprintln!(
                "  concurrency {}: {:.1} tok/s total",
                p.concurrency, p.total_tok_s
            );
        },
    )?;
    print!("{}", bench_table(&points));
    let eplb = match (a.expert_load_ranks, engine.model().expert_load()) {
        (Some(ranks), Some(load)) => Some(crate::runtime::eplb_report(&load, ranks)?),
        _ => None,
    };
    if let Some(r) = &eplb {
        print!("{}", r.table());
    }
    let setup = serde_json::json!({
        "model": label, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
        "spec_drafts": a.spec_drafts, "spec_budget": format!("{:?}", a.spec_budget).to_lowercase(), "deterministic": a.deterministic, "threads": a.threads, "overlap": !a.no_overlap, "expert_parallel": a.expert_parallel,
        "backend": "cpu",
    });
    let json_path = a.output.with_extension("json");
    let svg_path = a.output.with_extension("svg");
    let write = |p: &PathBuf, text: String| {
        std::fs::write(p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))
    };
    let mut json = bench_json(&points, &setup);
    if let (Some(r), Some(obj)) = (&eplb, json.as_object_mut()) {
        obj.insert("expert_load".into(), r.to_json());
    }
    write(&json_path, serde_json::to_string_pretty(&json)?)?;
    write(
        &svg_path,
        bench_svg(&points, &format!("deepinfer offline decode, {label}, CPU")),
    )?;
    if let Some(p) = &a.metrics_json {
        write(p, serde_json::to_string_pretty(&engine.metrics_json())?)?;
    }
    println!("wrote {} and {}", json_path.display(), svg_path.display());
    Ok(())
}
