//! How well the DSpark drafter's confidences predict acceptance, and the per-position
//! temperatures (`deepinfer-spec`'s [`TemperatureScaling`]) that correct them.
//!
//! The budgeted planner ranks drafts by running products of confidences, so a drafter that is
//! over- or under-confident misallocates the step's rows. [`draft_outcomes`] measures it on a
//! text: at evenly spaced anchors the model reads the text before the anchor, drafts a block
//! and greedy decoding of the target decides how many drafts it would keep. A model directory
//! may carry the fitted temperatures as [`CALIBRATION_FILE`]; the engine then scales every
//! confidence by them before planning.

use super::engine::EngineError;
use crate::model::argmax;
use crate::{BatchItem, Logits, Model};
use deepinfer_kernels::Backend;
use deepinfer_spec::{Outcome, TemperatureScaling};
use std::path::Path;

/// File name of a model directory's drafter calibration (`{"temperatures": [T_0, T_1, …]}`).
pub const CALIBRATION_FILE: &str = "dspark_calibration.json";

/// Greedy drafting outcomes on the token stream `ids`: `anchors` anchors evenly spaced over
/// it, each with up to `context` tokens of context before it, `depth` drafts each (at most
/// the drafter's block size).
pub fn draft_outcomes<B: Backend>(
    model: &Model<B>,
    ids: &[u32],
    anchors: usize,
    context: usize,
    depth: usize,
) -> Result<Vec<Outcome>, EngineError>
where
    B::Tensor: Clone,
{
    let input = |m: String| EngineError::Config(m);
    let block = match &model.cfg.dspark {
        Some(d) if model.has_drafter() => d.block_size,
        _ => return Err(input("the model has no DSpark drafter".into())),
    };
    if anchors == 0 || context == 0 || depth == 0 {
        return Err(input(
            "anchors, context and depth must be at least 1".into(),
        ));
    }
    let depth = depth.min(block);
    if ids.len() < depth + 2 {
        return Err(input(format!(
            "the text has {} tokens, too few to draft {depth} after a context",
            ids.len()
        )));
    }
    // Anchor positions p in 1 ..= len - 1 - depth, so every draft has a text position.
    let last = ids.len() - 1 - depth;
    let step = (last as f64 / anchors as f64).max(1.0);
    let mut out = Vec::with_capacity(anchors);
    for k in 0..anchors {
        let p = 1 + (k as f64 * step) as usize;
        if p > last {
            break;
        }
        let from = p.saturating_sub(context);
        let mut st = model.new_state();
        model.forward(
            &mut [BatchItem {
                state: &mut st,
                tokens: &ids[from..p],
            }],
            Logits::Last,
            None,
        )?;
        let d = model.draft(&st, ids[p])?;
        let confidences = d.planner_confidences(depth);
        // The target's greedy tokens after the anchor, as long as they match the drafts.
        let mut accepted = 0;
        let mut next = ids[p];
        while accepted < depth {
            let logits = model
                .forward(
                    &mut [BatchItem {
                        state: &mut st,
                        tokens: &[next],
                    }],
                    Logits::Last,
                    None,
                )?
                .remove(0);
            let t = argmax(&logits) as u32;
            if t != d.draft_ids[accepted] {
                break;
            }
            accepted += 1;
            next = t;
        }
        out.push(Outcome::new(confidences, accepted));
    }
    Ok(out)
}

/// Reads a model directory's [`CALIBRATION_FILE`], if it has one.
pub fn load_calibration(dir: &Path) -> Result<Option<TemperatureScaling>, EngineError> {
    let path = dir.join(CALIBRATION_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(EngineError::Config(format!("{}: {e}", path.display()))),
    };
    parse_calibration(&text)
        .map(Some)
        .map_err(|e| EngineError::Config(format!("{}: {e}", path.display())))
}

/// Parses `{"temperatures": [T_0, …]}`: every temperature finite and positive.
pub fn parse_calibration(text: &str) -> Result<TemperatureScaling, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let temps = v["temperatures"]
        .as_array()
        .ok_or("expected {\"temperatures\": [numbers]}")?;
    let mut temperatures = Vec::with_capacity(temps.len());
    for (i, t) in temps.iter().enumerate() {
        match t.as_f64() {
            Some(t) if t.is_finite() && t > 0.0 => temperatures.push(t),
            _ => return Err(format!("temperature {i} is not a positive number: {t}")),
        }
    }
    Ok(TemperatureScaling { temperatures })
}

/// The file text of a calibration.
pub fn calibration_json(scaling: &TemperatureScaling) -> String {
    serde_json::json!({ "temperatures": scaling.temperatures }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_files_round_trip_and_bad_ones_are_errors() {
        let s = TemperatureScaling {
            temperatures: vec![1.5, 0.75],
        };
        assert_eq!(parse_calibration(&calibration_json(&s)).unwrap(), s);
        for bad in [
            "",
            "{}",
            r#"{"temperatures": [1.0, 0]}"#,
            r#"{"temperatures": [-2]}"#,
            r#"{"temperatures": ["x"]}"#,
            r#"{"temperatures": 3}"#,
        ] {
            assert!(parse_calibration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.0, 2.0, 2.0, 1.0]), 1);
        assert_eq!(argmax(&[3.0]), 0);
    }
}
