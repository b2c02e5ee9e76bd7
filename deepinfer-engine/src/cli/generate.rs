//! `deepinfer generate`: OpenAI Batch API JSONL in, matching output JSONL out; `--prompt`
//! for a quick answer; with no `--model` the embedded default (a toy trained on Shakespeare) and, with no
//! `--input` either, the built-in sample batch.

use super::CliResult;
use super::backend::{self, BackendArg};
pub use super::engine_args::SpecBudgetArg;
use super::engine_args::{EngineArgs, Loaded};
use crate::runtime::{SAMPLE_BATCH, run_batch};
use clap::Args;
use deepinfer_kernels::{Backend, CpuBackend};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `deepinfer generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// OpenAI Batch API input (JSONL of chat-completions requests).
    #[arg(long, conflicts_with = "prompt")]
    pub input: Option<PathBuf>,
    /// A single user message; the answer is printed.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Output JSONL (default ./deepinfer-output.jsonl; with --prompt, nothing is written unless given).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Write the run's figures (prompt, computed, cached and replayed tokens, preemptions,
    /// step-time percentiles, KV blocks) to this JSON file.
    #[arg(long)]
    pub metrics_json: Option<PathBuf>,
    /// The model and the engine.
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Run `deepinfer generate`.
pub fn run(a: &GenerateArgs) -> CliResult {
    let cpu = a.engine.cpu_config();
    match a.engine.backend {
        BackendArg::Cpu => run_on(a, CpuBackend::with_config(cpu)?),
        BackendArg::Cuda => run_on(a, backend::cuda(cpu)?),
    }
}

fn run_on<B: Backend>(a: &GenerateArgs, be: B) -> CliResult
where
    B::Tensor: Clone,
{
    let Loaded {
        mut engine,
        front,
        label,
        load_s,
    } = a.engine.load(be)?;

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
        a.engine.seed,
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
        "{}",
        super::engine_args::pool_line(&engine.kv_pool(), a.engine.max_num_seqs)
    );
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
            a.engine.spec_budget,
            a.engine.spec_drafts,
            m.draft_tokens as f64 / m.spec_rows as f64,
            100.0 * m.accepted_drafts as f64 / m.draft_tokens.max(1) as f64,
            m.accepted_drafts,
            m.draft_tokens,
            1.0 + m.accepted_drafts as f64 / m.spec_rows as f64,
            m.draft_ms
        );
    }
    if let Some(path) = &a.metrics_json {
        let text = serde_json::to_string_pretty(&engine.metrics_json())?;
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(path) = out_path {
        println!("outputs written to {}", path.display());
    }
    Ok(())
}
