//! Fixed-length verification: every request verifies the same number of drafts.

use crate::candidates;
use crate::error::SpecError;
use crate::plan::Plan;
use crate::step_time::StepTimeModel;

/// The plan in which every request verifies its first `drafts` drafts (or all it has, if
/// fewer). `drafts = 0` is the no-draft plan.
///
/// This is the mode that keeps sampling deterministic: whether a request's row is an accept, a
/// resample or a plain sample never depends on its batch-mates, because its verified length
/// does not. Budgeted planning trades that property for throughput.
///
/// Errors: [`SpecError::EmptyBatch`], [`SpecError::InvalidConfidence`],
/// [`SpecError::RowsOutOfRange`] when the rows exceed the step-time table.
pub fn fixed_length<C: AsRef<[f64]>>(
    model: &StepTimeModel,
    drafts: usize,
    requests: &[C],
) -> Result<Plan, SpecError> {
    if requests.is_empty() {
        return Err(SpecError::EmptyBatch);
    }
    let mut plan = Plan {
        draft_rows: Vec::with_capacity(requests.len()),
        total_rows: requests.len(),
        expected_tokens: requests.len() as f64,
        predicted_ms: 0.0,
    };
    for (r, confs) in requests.iter().enumerate() {
        let confs = confs.as_ref();
        let mut a = 1.0;
        for (i, &c) in confs.iter().enumerate() {
            candidates::check(r, i, c)?;
            if i < drafts {
                a *= c;
                plan.expected_tokens += a;
            }
        }
        let n = drafts.min(confs.len());
        plan.draft_rows.push(n);
        plan.total_rows += n;
    }
    plan.predicted_ms = model.predict(plan.total_rows)?;
    Ok(plan)
}
