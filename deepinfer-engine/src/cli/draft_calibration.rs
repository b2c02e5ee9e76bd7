//! `deepinfer draft-calibration --text FILE [--model DIR] [--write]`: how well the DSpark
//! drafter's confidences predict acceptance on a text, per draft position, before and after
//! `deepinfer-spec`'s temperature fit. The fit uses the first half of the anchors and is
//! judged on the second half; `--write` stores it as the model directory's
//! `dspark_calibration.json`, which generate, serve and bench then apply.

use super::CliResult;
use super::engine_args::tokenizer_for;
use crate::model::Model;
use crate::runtime::draft_calibration::{CALIBRATION_FILE, calibration_json, draft_outcomes};
use crate::runtime::{default_model_dir, materialize_default};
use clap::Args;
use deepinfer_kernels::CpuBackend;
use deepinfer_spec::{DEFAULT_BINS, PositionCalibration, TemperatureScaling, calibration_report};
use std::path::PathBuf;

/// Arguments of `deepinfer draft-calibration`.
#[derive(Debug, Args)]
pub struct DraftCalibrationArgs {
    /// The text to draft on (UTF-8).
    #[arg(long)]
    pub text: PathBuf,
    /// Model directory (default: the embedded toy V4.1 model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Anchors (drafted blocks), evenly spaced over the text.
    #[arg(long, default_value_t = 400)]
    pub anchors: usize,
    /// Context tokens before each anchor.
    #[arg(long, default_value_t = 128)]
    pub context: usize,
    /// Drafts per anchor (at most the drafter's block size).
    #[arg(long, default_value_t = 5)]
    pub depth: usize,
    /// Write the fitted temperatures into the model directory.
    #[arg(long)]
    pub write: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `deepinfer draft-calibration`.
pub fn run(a: &DraftCalibrationArgs) -> CliResult {
    let dir = match &a.model {
        Some(d) => d.clone(),
        None => materialize_default(&default_model_dir())?,
    };
    let model = Model::load(&dir, CpuBackend::new())?;
    let text = std::fs::read_to_string(&a.text)
        .map_err(|e| format!("cannot read {}: {e}", a.text.display()))?;
    let ids = tokenizer_for(a.model.as_deref(), model.cfg.vocab_size)?
        .encode_plain(&text)
        .map_err(|e| format!("{}: {e}", a.text.display()))?;
    let outcomes = draft_outcomes(&model, &ids, a.anchors, a.context, a.depth)?;
    if outcomes.len() < 4 {
        return Err(format!("only {} anchors fit the text: too short", outcomes.len()).into());
    }
    let (fit_on, judge_on) = outcomes.split_at(outcomes.len() / 2);
    let fit = TemperatureScaling::fit(fit_on, DEFAULT_BINS)?;
    let before = calibration_report(judge_on, DEFAULT_BINS)?;
    let after = fit.report(judge_on, DEFAULT_BINS)?;
    let accepted = outcomes.iter().map(|o| o.accepted).sum::<usize>() as f64;
    let mean_accepted = accepted / outcomes.len() as f64;
    if a.json {
        let rows: Vec<_> = before
            .iter()
            .zip(&after)
            .zip(&fit.temperatures)
            .map(|((b, f), t)| position_json(b, f, *t))
            .collect();
        let v = serde_json::json!({
            "anchors": outcomes.len(), "fit_anchors": fit_on.len(), "judged_anchors": judge_on.len(),
            "mean_accepted": mean_accepted, "positions": rows,
        });
        println!("{v}");
    } else {
        println!(
            "{} anchors ({} to fit, {} to judge), {mean_accepted:.2} drafts accepted per block",
            outcomes.len(),
            fit_on.len(),
            judge_on.len()
        );
        println!(
            "{:>8} {:>6} {:>10} {:>9} {:>11} {:>11} {:>12}",
            "position", "rows", "predicted", "observed", "ECE before", "ECE after", "temperature"
        );
        for ((b, f), t) in before.iter().zip(&after).zip(&fit.temperatures) {
            println!(
                "{:>8} {:>6} {:>10.3} {:>9.3} {:>11.4} {:>11.4} {:>12.3}",
                b.position + 1,
                b.count,
                b.mean_predicted,
                b.observed,
                b.ece,
                f.ece,
                t
            );
        }
    }
    if a.write {
        let path = dir.join(CALIBRATION_FILE);
        std::fs::write(&path, calibration_json(&fit))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn position_json(b: &PositionCalibration, f: &PositionCalibration, t: f64) -> serde_json::Value {
    serde_json::json!({
        "position": b.position + 1, "rows": b.count, "observed": b.observed,
        "predicted_before": b.mean_predicted, "predicted_after": f.mean_predicted,
        "ece_before": b.ece, "ece_after": f.ece, "temperature": t,
    })
}
