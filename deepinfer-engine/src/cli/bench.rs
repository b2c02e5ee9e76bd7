//! `deepinfer bench`: offline runs at several concurrencies on the given or embedded model;
//! prints a table and writes JSON and an SVG chart.

use super::CliResult;
use super::engine_args::{NumericsArgs, tokenizer_for};
use super::generate::SpecBudgetArg;
use crate::model::Model;
use crate::runtime::bench::{
    BenchPoint, BenchPrompts, bench_json, bench_svg, bench_table, run_bench,
};
use crate::runtime::{Engine, EngineConfig, SpecBudget, default_model_dir, materialize_default};
use clap::Args;
use deepinfer_kernels::{CpuBackend, CpuConfig};
use std::path::PathBuf;

/// Arguments of `deepinfer bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Model directory (default: the embedded toy V4.1 model, trained on Shakespeare).
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
    /// Run several speculation settings one after the other and chart them together: no
    /// drafts, fixed 1 ..= `--spec-drafts` drafts, and budgeted with at most `--spec-drafts`.
    #[arg(long)]
    pub spec_sweep: bool,
    /// Take the prompts from this text file (tokenised once; each request reads its own
    /// window) instead of pseudo-random token ids, so a drafter that learned the language
    /// can be measured.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Batch-invariant kernels.
    #[arg(long)]
    pub deterministic: bool,
    /// Numerics of the model (`--fp8-activations`).
    #[command(flatten)]
    pub numerics: NumericsArgs,
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
    if a.spec_sweep && a.spec_drafts == 0 {
        return Err("--spec-sweep needs --spec-drafts N (the most drafts it tries)".into());
    }
    let dir = match &a.model {
        Some(dir) => dir.clone(),
        None => materialize_default(&default_model_dir())?,
    };
    let label = match &a.model {
        Some(dir) => dir.display().to_string(),
        None => "embedded default (toy, trained on Shakespeare)".to_string(),
    };
    let prompts = match &a.prompt_file {
        None => BenchPrompts::Random,
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            let vocab = crate::config::ModelConfig::from_file(&dir.join("config.json"))?.vocab_size;
            let ids = tokenizer_for(a.model.as_deref(), vocab)?
                .encode_plain(&text)
                .map_err(|e| format!("{}: {e}", p.display()))?;
            if ids.len() < a.prompt_len {
                return Err(format!(
                    "{} has {} tokens, fewer than --prompt-len {}",
                    p.display(),
                    ids.len(),
                    a.prompt_len
                )
                .into());
            }
            BenchPrompts::Text(ids)
        }
    };
    let settings: Vec<(String, usize, SpecBudget)> = if a.spec_sweep {
        std::iter::once(("no drafts".to_string(), 0, SpecBudget::Fixed))
            .chain((1..=a.spec_drafts).map(|n| (format!("fixed {n}"), n, SpecBudget::Fixed)))
            .chain(std::iter::once((
                format!("budgeted ≤ {}", a.spec_drafts),
                a.spec_drafts,
                SpecBudget::Budgeted,
            )))
            .collect()
    } else {
        vec![(
            setting_label(a.spec_drafts, a.spec_budget.into()),
            a.spec_drafts,
            a.spec_budget.into(),
        )]
    };
    eprintln!(
        "bench on {label}: prompts of {} tokens ({}), {} new tokens each, concurrency {:?}",
        a.prompt_len,
        if a.prompt_file.is_some() {
            "text"
        } else {
            "random ids"
        },
        a.new_tokens,
        a.concurrency
    );
    let mut series: Vec<(String, Vec<BenchPoint>)> = Vec::new();
    let mut last = None;
    for (name, drafts, budget) in &settings {
        eprintln!("{name}:");
        let (points, engine) = run_setting(a, &dir, &prompts, *drafts, *budget)?;
        if settings.len() > 1 {
            println!("{name}");
        }
        print!("{}", bench_table(&points));
        series.push((name.clone(), points));
        last = Some(engine);
    }
    let engine = last.ok_or("no setting ran")?;
    let eplb = match (a.expert_load_ranks, engine.model().expert_load()) {
        (Some(ranks), Some(load)) => Some(crate::runtime::eplb_report(&load, ranks)?),
        _ => None,
    };
    if let Some(r) = &eplb {
        print!("{}", r.table());
    }
    let setup = serde_json::json!({
        "model": label, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
        "prompts": a.prompt_file.as_ref().map_or("random ids".to_string(), |p| p.display().to_string()),
        "spec_drafts": a.spec_drafts, "spec_budget": format!("{:?}", a.spec_budget).to_lowercase(), "spec_sweep": a.spec_sweep, "deterministic": a.deterministic, "threads": a.threads, "overlap": !a.no_overlap, "expert_parallel": a.expert_parallel,
        "backend": "cpu",
    });
    let json_path = a.output.with_extension("json");
    let svg_path = a.output.with_extension("svg");
    let write = |p: &PathBuf, text: String| {
        std::fs::write(p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))
    };
    let mut json = bench_json(&series[0].1, &setup);
    if let Some(obj) = json.as_object_mut() {
        if series.len() > 1 {
            let all: Vec<_> = series
                .iter()
                .map(|(name, pts)| {
                    let mut one = bench_json(pts, &serde_json::Value::Null);
                    one["setting"] = name.as_str().into();
                    one
                })
                .collect();
            obj.insert("series".into(), all.into());
        }
        if let Some(r) = &eplb {
            obj.insert("expert_load".into(), r.to_json());
        }
    }
    write(&json_path, serde_json::to_string_pretty(&json)?)?;
    write(
        &svg_path,
        bench_svg(&series, &format!("deepinfer offline decode, {label}, CPU")),
    )?;
    if let Some(p) = &a.metrics_json {
        write(p, serde_json::to_string_pretty(&engine.metrics_json())?)?;
    }
    println!("wrote {} and {}", json_path.display(), svg_path.display());
    Ok(())
}

fn setting_label(drafts: usize, budget: SpecBudget) -> String {
    match (drafts, budget) {
        (0, _) => "no drafts".to_string(),
        (n, SpecBudget::Fixed) => format!("fixed {n}"),
        (n, SpecBudget::Budgeted) => format!("budgeted ≤ {n}"),
    }
}

/// One speculation setting on a freshly loaded model, every concurrency level.
fn run_setting(
    a: &BenchArgs,
    dir: &std::path::Path,
    prompts: &BenchPrompts,
    spec_drafts: usize,
    spec_budget: SpecBudget,
) -> Result<(Vec<BenchPoint>, Engine<CpuBackend>), Box<dyn std::error::Error + Send + Sync>> {
    let be = CpuBackend::with_config(CpuConfig {
        batch_invariant: a.deterministic,
        threads: a.threads,
    })?;
    let mut model = Model::load(dir, be)?;
    a.numerics.apply(&mut model);
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
        max_num_batched_tokens: (max_c * (spec_drafts + 1)).max(a.prompt_len * 4).max(256),
        max_model_len: a.prompt_len + a.new_tokens + 16,
        prefix_caching: false,
        spec_drafts,
        spec_budget,
        draft_calibration: crate::runtime::draft_calibration::load_calibration(dir)?,
        overlap: !a.no_overlap,
        sync_check: a.sync_check,
        step_time_budget_ms: a.step_time_budget_ms,
        expert_parallel: a.expert_parallel,
        eplb_interval: a.eplb_interval,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(model, cfg)?;
    let points = run_bench(
        &mut engine,
        prompts,
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
    Ok((points, engine))
}
