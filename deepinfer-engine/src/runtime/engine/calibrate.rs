//! Start-up calibration: the step-time and prefill cost models, the prefix-hit rule.

use super::*;

/// A step-time model for the draft planner: forward passes of 1 and 16 rows on a scratch
/// state (best of three), extended linearly to `max_rows`; the scheduler corrects each
/// bucket online from the measured step times.
pub(super) fn calibrate<B: Backend>(
    model: &Model<B>,
    max_rows: usize,
) -> Result<StepTimeModel, EngineError>
where
    B::Tensor: Clone,
{
    let time = |rows: usize| -> Result<f64, EngineError> {
        let mut best = f64::INFINITY;
        let toks: Vec<u32> = (0..rows as u32).map(|i| 3 + i % 64).collect();
        for _ in 0..3 {
            let mut st = model.new_state();
            let t = Instant::now();
            model.forward(
                &mut [BatchItem {
                    state: &mut st,
                    tokens: &toks,
                }],
                Logits::Last,
                None,
            )?;
            best = best.min(ms_since(t));
        }
        Ok(best.max(1e-3))
    };
    let hi = max_rows.clamp(2, 16);
    let (t1, th) = (time(1)?, time(hi)?);
    let slope = ((th - t1) / (hi - 1) as f64).max(t1 * 1e-3);
    let base = (t1 - slope).max(t1 * 0.1);
    let mut points = Vec::new();
    let mut r = 1;
    while r < max_rows {
        points.push((r, base + slope * r as f64));
        r *= 2;
    }
    points.push((max_rows, base + slope * max_rows as f64));
    StepTimeModel::linear(&points).map_err(|e| EngineError::Config(format!("step-time model: {e}")))
}

/// The step cost model, fitted from timed forward calls over fresh states: single chunks
/// of several lengths from position 0 and one after a cached prefix (each samples its
/// last row: one output row), and decode steps of 1, a quarter of and all `max_num_seqs`
/// rows (capped at 64) over a short prompt (one output row each). The decode steps of
/// several batch sizes separate the per-output-row term `e` (the vocabulary projection,
/// which dominates a decode row of a small model with a large head) from the per-token
/// `b` and the per-step `d`. It is only a starting point: the scheduler refits it from
/// every measured step.
pub(super) fn calibrate_prefill<B: Backend>(
    model: &Model<B>,
    cfg: &EngineConfig,
) -> Result<PrefillCostModel, EngineError>
where
    B::Tensor: Clone,
{
    let cap = cfg
        .max_num_batched_tokens
        .min(cfg.max_model_len.saturating_sub(1))
        .max(2);
    let toks: Vec<u32> = (0..2 * cap as u32).map(|i| 3 + i % 64).collect();
    // Best of two: the time of `q` tokens after `c` already in the state.
    let time = |q: usize, c: usize| -> Result<f64, EngineError> {
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            let mut st = model.new_state();
            if c > 0 {
                model.forward(
                    &mut [BatchItem {
                        state: &mut st,
                        tokens: &toks[..c],
                    }],
                    Logits::Last,
                    None,
                )?;
            }
            let t = Instant::now();
            model.forward(
                &mut [BatchItem {
                    state: &mut st,
                    tokens: &toks[c..c + q],
                }],
                Logits::Last,
                None,
            )?;
            best = best.min(ms_since(t));
        }
        Ok(best.max(1e-3))
    };
    // Best of two: one decode row each for `rows` sequences holding `ctx` tokens.
    let ctx = 16.min(cap - 1);
    let time_decode = |rows: usize| -> Result<f64, EngineError> {
        let mut best = f64::INFINITY;
        for _ in 0..2 {
            let mut states: Vec<_> = (0..rows).map(|_| model.new_state()).collect();
            let mut items: Vec<_> = states
                .iter_mut()
                .map(|st| BatchItem {
                    state: st,
                    tokens: &toks[..ctx],
                })
                .collect();
            model.forward(&mut items, Logits::Last, None)?;
            let mut items: Vec<_> = states
                .iter_mut()
                .map(|st| BatchItem {
                    state: st,
                    tokens: &toks[ctx..ctx + 1],
                })
                .collect();
            let t = Instant::now();
            model.forward(&mut items, Logits::Last, None)?;
            best = best.min(ms_since(t));
        }
        Ok(best.max(1e-3))
    };
    let mut points = vec![(1, 0), (cap / 8, 0), (cap / 2, 0), (cap, 0)];
    points.push(((cap / 4).max(1), cap / 2));
    points.push((1, cap));
    let mut samples = Vec::new();
    for (q, c) in points {
        let q = q.max(1);
        samples.push(StepSample {
            features: StepFeatures::of_sampling_chunk(q, c),
            time: time(q, c)?,
        });
    }
    let most_rows = cfg.max_num_seqs.clamp(1, 64);
    let mut batch_sizes = vec![1, (most_rows / 4).max(1), most_rows];
    batch_sizes.dedup();
    for rows in batch_sizes {
        samples.push(StepSample {
            features: StepFeatures::of_decode(rows, ctx),
            time: time_decode(rows)?,
        });
    }
    let bounds = CoefficientBounds::default();
    let coef = PrefillCostModel::fit(&samples, bounds).unwrap_or_else(|_| {
        // Too little variation to separate the terms: a linear guess from the longest
        // chunk, the decode rows' excess over their tokens as the output-row term.
        let t = samples[..6].iter().map(|s| s.time).fold(0.0, f64::max);
        let b = t / cap as f64;
        let widest = samples[samples.len() - 1];
        let excess = widest.time - samples[0].time - b * widest.features.lin;
        let e = (excess / widest.features.out_rows).max(0.0);
        CostCoefficients {
            a: 0.0,
            b,
            d: samples[0].time,
            e,
        }
    });
    PrefillCostModel::new(coef, bounds, 0.98)
        .and_then(|m| m.with_prior(&samples))
        .map_err(|e| EngineError::Config(format!("prefill cost model: {e}")))
}

/// The prefix-hit rule: the last window (plus the speculative slack) is always recomputed.
pub(super) fn hit_rule<B: Backend>(model: &Model<B>, cfg: &EngineConfig) -> HitRule {
    HitRule {
        window: model.cfg.sliding_window,
        spec_slack: cfg.spec_slack,
    }
}
