//! Acceptance statistics and the two readings of "tokens per step".
//!
//! # Two readings of tokens per step
//!
//! A step that verifies `n` drafts yields one token from the target (the correction after the
//! first rejected draft, or the bonus token when all are accepted) plus the accepted drafts. The
//! expected tokens per step is therefore `1 + E[accepted length]`. Two formulas circulate, and
//! they take *different* acceptance rates:
//!
//! * **`1 + n·a`** ([`tokens_per_step_linear`]) with `a` the *mean acceptance rate*: accepted
//!   drafts ÷ verified drafts. This is exact by definition when every step verifies `n` drafts
//!   (`n·a` is the mean accepted length), and it is the rate engines usually report.
//! * **`1 + a + a² + … + aⁿ`** ([`tokens_per_step_geometric`]) with `a` the *conditional
//!   per-draft acceptance*: the probability that a draft is accepted given that every earlier
//!   one was, assumed equal at every position. A draft only counts if all before it survive,
//!   hence the powers; this is the planner's running-product view.
//!
//! Plugging one number into both gives different answers (`a = 0.8`, `n = 3`: 3.4 versus
//! 2.952), because for the same drafter the mean rate is lower than the conditional one: later
//! drafts are reached less often and the mean rate divides by all verified drafts, reached or
//! not. [`AcceptanceStats`] reports both rates measured from the same data, so either formula
//! can be fed its own rate: `1 + n·mean_rate` reproduces the measured tokens per step exactly,
//! while the geometric reading with the pooled conditional rate is a model that matches only
//! when the conditional acceptance is the same at every position
//! ([`AcceptanceStats::geometric_equivalent_rate`] gives the constant rate that would match).

use crate::error::SpecError;
use crate::outcome::{Outcome, validate};

/// `1 + n·a`, with `a` the mean acceptance rate over verified drafts (see the module docs).
pub fn tokens_per_step_linear(n: usize, mean_rate: f64) -> Result<f64, SpecError> {
    check_rate(mean_rate)?;
    Ok(1.0 + n as f64 * mean_rate)
}

/// `1 + a + a² + … + aⁿ`, with `a` the conditional per-draft acceptance (see the module docs).
pub fn tokens_per_step_geometric(n: usize, conditional_rate: f64) -> Result<f64, SpecError> {
    check_rate(conditional_rate)?;
    let (mut sum, mut term) = (1.0, 1.0);
    for _ in 0..n {
        term *= conditional_rate;
        sum += term;
    }
    Ok(sum)
}

fn check_rate(a: f64) -> Result<(), SpecError> {
    if (0.0..=1.0).contains(&a) {
        Ok(())
    } else {
        Err(SpecError::InvalidProbability(a))
    }
}

/// Acceptance at one draft position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PositionAcceptance {
    /// Zero-based draft position.
    pub position: usize,
    /// Outcomes that verified this draft.
    pub verified: usize,
    /// Outcomes that reached this draft (verified it and accepted every earlier one).
    pub reached: usize,
    /// Outcomes that accepted this draft (and so every earlier one).
    pub accepted: usize,
}

impl PositionAcceptance {
    /// `P(accepted | reached)`, the conditional acceptance; `None` if never reached.
    pub fn conditional_rate(&self) -> Option<f64> {
        (self.reached > 0).then(|| self.accepted as f64 / self.reached as f64)
    }

    /// `P(accepted | verified)`, the unconditional acceptance of the running product;
    /// `None` if never verified.
    pub fn rate(&self) -> Option<f64> {
        (self.verified > 0).then(|| self.accepted as f64 / self.verified as f64)
    }
}

/// Acceptance statistics over a set of outcomes.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptanceStats {
    /// Number of outcomes (steps × requests).
    pub samples: usize,
    /// Drafts verified in total.
    pub verified_drafts: usize,
    /// Drafts accepted in total.
    pub accepted_drafts: usize,
    /// `histogram[l]`: outcomes that accepted exactly `l` drafts.
    pub accepted_length_histogram: Vec<usize>,
    /// Per-position acceptance.
    pub per_position: Vec<PositionAcceptance>,
}

impl AcceptanceStats {
    /// Statistics of `samples` (typed errors for empty input or invalid outcomes).
    pub fn from_outcomes(samples: &[Outcome]) -> Result<Self, SpecError> {
        validate(samples)?;
        let depth = samples
            .iter()
            .map(|s| s.confidences.len())
            .max()
            .unwrap_or(0);
        let mut per_position: Vec<PositionAcceptance> = (0..depth)
            .map(|position| PositionAcceptance {
                position,
                verified: 0,
                reached: 0,
                accepted: 0,
            })
            .collect();
        let mut histogram = vec![0usize; depth + 1];
        let (mut verified, mut accepted) = (0, 0);
        for s in samples {
            let n = s.confidences.len();
            verified += n;
            accepted += s.accepted;
            histogram[s.accepted] += 1;
            for (i, p) in per_position.iter_mut().enumerate().take(n) {
                p.verified += 1;
                if s.accepted >= i {
                    p.reached += 1;
                }
                if s.accepted > i {
                    p.accepted += 1;
                }
            }
        }
        Ok(Self {
            samples: samples.len(),
            verified_drafts: verified,
            accepted_drafts: accepted,
            accepted_length_histogram: histogram,
            per_position,
        })
    }

    /// Mean accepted length per outcome.
    pub fn mean_accepted_length(&self) -> f64 {
        self.accepted_drafts as f64 / self.samples as f64
    }

    /// Measured tokens per step per request: `1 + mean accepted length`.
    pub fn tokens_per_step(&self) -> f64 {
        1.0 + self.mean_accepted_length()
    }

    /// Accepted ÷ verified drafts: the rate of the `1 + n·a` reading. `None` with no drafts.
    pub fn mean_rate(&self) -> Option<f64> {
        (self.verified_drafts > 0)
            .then(|| self.accepted_drafts as f64 / self.verified_drafts as f64)
    }

    /// Pooled conditional acceptance: accepted ÷ reached over all positions, the rate of the
    /// geometric reading when it is assumed constant. `None` if no draft was reached.
    pub fn conditional_rate(&self) -> Option<f64> {
        let reached: usize = self.per_position.iter().map(|p| p.reached).sum();
        let accepted: usize = self.per_position.iter().map(|p| p.accepted).sum();
        (reached > 0).then(|| accepted as f64 / reached as f64)
    }

    /// The constant conditional rate `a` for which `1 + a + … + aⁿ` equals the measured tokens
    /// per step, with `n` the largest number of drafts verified (bisection). `None` without
    /// drafts or if the measurement is unreachable with `n` drafts.
    pub fn geometric_equivalent_rate(&self) -> Option<f64> {
        let n = self.per_position.len();
        let target = self.tokens_per_step();
        if n == 0 || target > (n + 1) as f64 + 1e-12 {
            return None;
        }
        let f = |a: f64| tokens_per_step_geometric(n, a).unwrap_or(f64::NAN);
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        for _ in 0..60 {
            let mid = 0.5 * (lo + hi);
            if f(mid) < target {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(0.5 * (lo + hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_differ_for_the_same_number() {
        assert!((tokens_per_step_linear(3, 0.8).unwrap() - 3.4).abs() < 1e-12);
        assert!((tokens_per_step_geometric(3, 0.8).unwrap() - 2.952).abs() < 1e-12);
        assert_eq!(tokens_per_step_geometric(0, 0.8).unwrap(), 1.0);
        assert_eq!(tokens_per_step_geometric(4, 1.0).unwrap(), 5.0);
        assert!(tokens_per_step_linear(3, 1.5).is_err());
        assert!(tokens_per_step_geometric(3, f64::NAN).is_err());
    }

    #[test]
    fn stats_by_hand() {
        let s = AcceptanceStats::from_outcomes(&[
            Outcome::new(vec![0.9, 0.8, 0.7], 3),
            Outcome::new(vec![0.9, 0.8, 0.7], 1),
            Outcome::new(vec![0.9, 0.8], 0),
        ])
        .unwrap();
        assert_eq!(s.accepted_length_histogram, [1, 1, 0, 1]);
        assert_eq!((s.verified_drafts, s.accepted_drafts), (8, 4));
        assert_eq!(s.mean_rate(), Some(0.5));
        let p: Vec<(usize, usize, usize)> = s
            .per_position
            .iter()
            .map(|p| (p.verified, p.reached, p.accepted))
            .collect();
        assert_eq!(p, [(3, 3, 2), (3, 2, 1), (2, 1, 1)]);
        // Conditional: 4 accepted of 6 reached.
        assert!((s.conditional_rate().unwrap() - 4.0 / 6.0).abs() < 1e-12);
        assert!((s.tokens_per_step() - (1.0 + 4.0 / 3.0)).abs() < 1e-12);
        let a = s.geometric_equivalent_rate().unwrap();
        assert!((tokens_per_step_geometric(3, a).unwrap() - s.tokens_per_step()).abs() < 1e-9);
    }
}
