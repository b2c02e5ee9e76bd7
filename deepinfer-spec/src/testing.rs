//! Property-testing helpers (feature `testing`): the strategies and checks this crate's own
//! property tests use, for testing a scheduler or engine built on the [`Planner`].
//!
//! - Confidence batches: [`confidence`] (edges 0 and 1 drawn often), [`batch`] (1 to 11
//!   requests of 0 to 6 drafts), [`outcome`] (a verified request: confidences and accepted
//!   drafts).
//! - Step-time curves: [`step_points`] (profiled `(rows, ms)` points), [`jagged_table`] (random,
//!   not monotone), [`convex_table`] (convex, non-decreasing), and [`batch_and_table`] (a batch
//!   with a table that covers it).
//! - Checks: [`check_plan`] (a plan is consistent with its batch and model and takes the best
//!   drafts), [`check_best_prefixes`] (any allocation of draft rows, such as [`crate::split`]'s).
//!
//! Checks return `Err(description)`; in a proptest, `.map_err(TestCaseError::fail)?`.
//!
//! [`Planner`]: crate::Planner

use proptest::prelude::*;

use crate::{Outcome, Plan, StepTimeModel, TableShape};

/// A confidence in `[0, 1]`, with the edges 0 and 1 drawn often (a fifth of the time).
pub fn confidence() -> impl Strategy<Value = f64> {
    prop_oneof![
        1 => Just(0.0),
        1 => Just(1.0),
        8 => 0.0..=1.0f64,
    ]
}

/// A batch: 1 to 11 requests, each with 0 to 6 drafts' [`confidence`]s.
pub fn batch() -> impl Strategy<Value = Vec<Vec<f64>>> {
    prop::collection::vec(prop::collection::vec(confidence(), 0..7), 1..12)
}

/// The most rows a step of `batch` can take: one per request plus every draft.
pub fn max_rows(batch: &[Vec<f64>]) -> usize {
    batch.len() + batch.iter().map(Vec::len).sum::<usize>()
}

/// A verified request: 0 to 4 confidences in `[0, 1]` and how many drafts were accepted.
pub fn outcome() -> impl Strategy<Value = Outcome> {
    prop::collection::vec(0.0..=1.0f64, 0..5).prop_flat_map(|c| {
        let n = c.len();
        (Just(c), 0..=n).prop_map(|(c, a)| Outcome::new(c, a))
    })
}

/// Profiled step times: 1 to 7 `(rows, ms)` points with increasing rows (steps of 1 to 15) and
/// times in `[0.5, 40)` ms, not necessarily monotone.
pub fn step_points() -> impl Strategy<Value = Vec<(usize, f64)>> {
    prop::collection::vec((1usize..16, 0.5..40.0f64), 1..8).prop_map(|steps| {
        let mut rows = 0;
        steps
            .into_iter()
            .map(|(dr, ms)| {
                rows += dr;
                (rows, ms)
            })
            .collect()
    })
}

/// A jagged step-time table (random times, not monotone; staircase or linear) covering at least
/// `min_rows` rows.
pub fn jagged_table(min_rows: usize) -> impl Strategy<Value = StepTimeModel> {
    (
        prop::collection::vec((1usize..20, 1.0..50.0f64), 1..8),
        any::<bool>(),
    )
        .prop_map(move |(steps, stair)| {
            let mut rows = 0;
            let mut points: Vec<(usize, f64)> = steps
                .into_iter()
                .map(|(dr, ms)| {
                    rows += dr;
                    (rows, ms)
                })
                .collect();
            let last = points.last().map_or(1.0, |p| p.1);
            if rows < min_rows {
                points.push((min_rows, last));
            }
            let shape = if stair {
                TableShape::Staircase
            } else {
                TableShape::Linear
            };
            StepTimeModel::new(&points, shape).expect("positive times, increasing rows")
        })
}

/// A convex, non-decreasing, linearly interpolated step-time table covering at least `min_rows`
/// rows (where early stopping equals the full search).
pub fn convex_table(min_rows: usize) -> impl Strategy<Value = StepTimeModel> {
    (
        0.5..20.0f64,
        prop::collection::vec((1usize..10, 0.0..3.0f64), 1..8),
    )
        .prop_map(move |(base, segs)| {
            let (mut rows, mut ms, mut slope) = (1usize, base, 0.0f64);
            let mut points = vec![(rows, ms)];
            for (dr, dslope) in segs {
                slope += dslope;
                rows += dr;
                ms += slope * dr as f64;
                points.push((rows, ms));
            }
            if rows < min_rows {
                slope += 1.0;
                ms += slope * (min_rows - rows) as f64;
                points.push((min_rows, ms));
            }
            StepTimeModel::linear(&points).expect("positive times, increasing rows")
        })
}

/// A [`batch`] and a [`jagged_table`] covering its [`max_rows`].
pub fn batch_and_table() -> impl Strategy<Value = (Vec<Vec<f64>>, StepTimeModel)> {
    batch().prop_flat_map(|b| {
        let need = max_rows(&b);
        (Just(b), jagged_table(need))
    })
}

/// Running products of `confs`: the probability that every draft up to each one is accepted.
pub fn running_products(confs: &[f64]) -> Vec<f64> {
    confs
        .iter()
        .scan(1.0, |a, &c| {
            *a *= c;
            Some(*a)
        })
        .collect()
}

/// Expected tokens of verifying the first `rows[i]` drafts of request `i`: one per request plus
/// each verified draft's running product.
pub fn expected_tokens(batch: &[Vec<f64>], rows: &[usize]) -> f64 {
    batch
        .iter()
        .zip(rows)
        .map(|(c, &d)| 1.0 + running_products(c)[..d].iter().sum::<f64>())
        .sum()
}

/// Checks that `rows` (draft rows per request) takes a prefix of each request's drafts and the
/// best drafts overall: every chosen draft's running product is at least every unchosen one's.
pub fn check_best_prefixes(batch: &[Vec<f64>], rows: &[usize]) -> Result<(), String> {
    if rows.len() != batch.len() {
        return Err(format!("{} rows for {} requests", rows.len(), batch.len()));
    }
    let (mut min_in, mut max_out) = (f64::INFINITY, f64::NEG_INFINITY);
    for (i, (confs, &d)) in batch.iter().zip(rows).enumerate() {
        if d > confs.len() {
            return Err(format!(
                "request {i}: {d} draft rows for {} drafts",
                confs.len()
            ));
        }
        for (k, &x) in running_products(confs).iter().enumerate() {
            if k < d {
                min_in = min_in.min(x);
            } else {
                max_out = max_out.max(x);
            }
        }
    }
    if min_in < max_out {
        return Err(format!("chosen {min_in} < unchosen {max_out}"));
    }
    Ok(())
}

/// Checks that `plan` is consistent with the batch it was made for and the model that predicted
/// it: best prefixes ([`check_best_prefixes`]), `total_rows` one per request plus the draft rows,
/// `expected_tokens` as [`expected_tokens`] computes it (within `1e-9`), and `predicted_ms` the
/// model's prediction for `total_rows`.
pub fn check_plan(batch: &[Vec<f64>], model: &StepTimeModel, plan: &Plan) -> Result<(), String> {
    check_best_prefixes(batch, &plan.draft_rows)?;
    let total = batch.len() + plan.draft_rows.iter().sum::<usize>();
    if plan.total_rows != total {
        return Err(format!(
            "total_rows {}, requests + draft rows {total}",
            plan.total_rows
        ));
    }
    let want = expected_tokens(batch, &plan.draft_rows);
    if (plan.expected_tokens - want).abs() >= 1e-9 {
        return Err(format!(
            "expected_tokens {}, the drafts give {want}",
            plan.expected_tokens
        ));
    }
    let ms = model.predict(plan.total_rows).map_err(|e| e.to_string())?;
    if plan.predicted_ms != ms {
        return Err(format!(
            "predicted_ms {}, the model predicts {ms}",
            plan.predicted_ms
        ));
    }
    Ok(())
}
