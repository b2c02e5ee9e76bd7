//! Verification outcomes: the input of calibration and acceptance statistics.

use crate::candidates;
use crate::error::SpecError;

/// One verified draft run: the drafter's confidences for the drafts that were *verified*, and
/// how many of them the target accepted (a prefix: drafts after the first rejection count as
/// rejected).
///
/// Only verified drafts belong here: an unverified draft has no label.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Outcome {
    /// Confidence `c_i` of each verified draft (probability of acceptance given the earlier
    /// drafts were accepted), in draft order.
    pub confidences: Vec<f64>,
    /// Number of leading drafts accepted, `0..=confidences.len()`.
    pub accepted: usize,
}

impl Outcome {
    /// An outcome from confidences and an accepted length.
    pub fn new(confidences: Vec<f64>, accepted: usize) -> Self {
        Self {
            confidences,
            accepted,
        }
    }
}

/// Checks a set of outcomes: non-empty, confidences in `[0, 1]`, accepted lengths in range.
pub(crate) fn validate(samples: &[Outcome]) -> Result<(), SpecError> {
    if samples.is_empty() {
        return Err(SpecError::NoSamples);
    }
    for (s, o) in samples.iter().enumerate() {
        for (i, &c) in o.confidences.iter().enumerate() {
            candidates::check(s, i, c)?;
        }
        if o.accepted > o.confidences.len() {
            return Err(SpecError::AcceptedTooLong {
                sample: s,
                accepted: o.accepted,
                drafts: o.confidences.len(),
            });
        }
    }
    Ok(())
}
