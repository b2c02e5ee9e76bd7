//! Calibration of the running products: per-position metrics and per-position temperature
//! scaling fitted left to right.
//!
//! The planner trusts `a_i = c1 × … × ci` as the probability that draft `i` is accepted. Label
//! of position `i` in an [`Outcome`]: whether the target accepted at least `i + 1` drafts
//! (zero-based `i`). Only outcomes that verified draft `i` contribute to position `i`.

use crate::error::SpecError;
use crate::metrics::{auroc, brier, ece};
use crate::outcome::{Outcome, validate};

/// Default number of equal-width ECE bins.
pub const DEFAULT_BINS: usize = 10;

/// Calibration metrics of one draft position's running product.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionCalibration {
    /// Zero-based draft position.
    pub position: usize,
    /// Outcomes that verified this position.
    pub count: usize,
    /// Mean running product (predicted acceptance of drafts `0..=position`).
    pub mean_predicted: f64,
    /// Observed fraction that accepted drafts `0..=position`.
    pub observed: f64,
    /// Expected calibration error.
    pub ece: f64,
    /// Brier score.
    pub brier: f64,
    /// AUROC, `None` when every outcome has the same label.
    pub auroc: Option<f64>,
}

/// Per-position calibration of the running products, as given (no scaling).
pub fn calibration_report(
    samples: &[Outcome],
    bins: usize,
) -> Result<Vec<PositionCalibration>, SpecError> {
    report_with(samples, bins, &TemperatureScaling::identity())
}

fn report_with(
    samples: &[Outcome],
    bins: usize,
    scaling: &TemperatureScaling,
) -> Result<Vec<PositionCalibration>, SpecError> {
    validate(samples)?;
    if bins == 0 {
        return Err(SpecError::InvalidConfig("ECE needs at least one bin"));
    }
    let depth = samples
        .iter()
        .map(|s| s.confidences.len())
        .max()
        .unwrap_or(0);
    let mut products = vec![1.0f64; samples.len()];
    let mut out = Vec::with_capacity(depth);
    let (mut preds, mut labels) = (Vec::new(), Vec::new());
    for pos in 0..depth {
        preds.clear();
        labels.clear();
        for (s, a) in samples.iter().zip(products.iter_mut()) {
            if let Some(&c) = s.confidences.get(pos) {
                *a *= scaling.scale(pos, c);
                preds.push(*a);
                labels.push(s.accepted > pos);
            }
        }
        let n = preds.len() as f64;
        out.push(PositionCalibration {
            position: pos,
            count: preds.len(),
            mean_predicted: preds.iter().sum::<f64>() / n,
            observed: labels.iter().filter(|&&y| y).count() as f64 / n,
            ece: ece(&preds, &labels, bins),
            brier: brier(&preds, &labels),
            auroc: auroc(&preds, &labels),
        });
    }
    Ok(out)
}

/// Per-position temperature scaling of draft confidences: `c' = σ(logit(c) / T_i)`.
///
/// For `T_i > 0` the map is strictly increasing, so it preserves the order of confidences at each
/// position (and 0 and 1 stay fixed): it repairs over- or under-confidence without changing which
/// draft ranks above which at one position. Positions beyond the fitted ones are left as is.
#[derive(Debug, Clone, PartialEq)]
pub struct TemperatureScaling {
    /// Temperature per draft position (`> 1` softens, `< 1` sharpens).
    pub temperatures: Vec<f64>,
}

/// Search range of the temperature (log-spaced grid, then golden-section refinement).
const T_MIN: f64 = 0.05;
const T_MAX: f64 = 20.0;
const GRID: usize = 61;
const REFINE_ITERS: usize = 40;

impl TemperatureScaling {
    /// No scaling at any position.
    pub fn identity() -> Self {
        Self {
            temperatures: Vec::new(),
        }
    }

    /// Fits one temperature per position, left to right: `T_0` minimises the ECE of `a_0`;
    /// then, with positions `0..i` already scaled, `T_i` minimises the ECE of the running
    /// product `a_i` (the quantity the planner ranks by), not of `c_i` alone. Each temperature
    /// is searched on a log grid over `[0.05, 20]` and refined; `T = 1` is always a candidate,
    /// so on the fitting data no position's ECE gets worse than leaving that position unscaled.
    pub fn fit(samples: &[Outcome], bins: usize) -> Result<Self, SpecError> {
        validate(samples)?;
        if bins == 0 {
            return Err(SpecError::InvalidConfig("ECE needs at least one bin"));
        }
        let depth = samples
            .iter()
            .map(|s| s.confidences.len())
            .max()
            .unwrap_or(0);
        let mut temperatures = Vec::with_capacity(depth);
        let mut products = vec![1.0f64; samples.len()];
        let (mut prev, mut conf, mut labels, mut preds) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for pos in 0..depth {
            prev.clear();
            conf.clear();
            labels.clear();
            for (s, &a) in samples.iter().zip(&products) {
                if let Some(&c) = s.confidences.get(pos) {
                    prev.push(a);
                    conf.push(c);
                    labels.push(s.accepted > pos);
                }
            }
            let mut objective = |t: f64| {
                preds.clear();
                preds.extend(prev.iter().zip(&conf).map(|(&a, &c)| a * scale_by(c, t)));
                ece(&preds, &labels, bins)
            };
            let t = minimise_log(&mut objective);
            temperatures.push(t);
            for (s, a) in samples.iter().zip(products.iter_mut()) {
                if let Some(&c) = s.confidences.get(pos) {
                    *a *= scale_by(c, t);
                }
            }
        }
        Ok(Self { temperatures })
    }

    /// The scaled confidence of a draft at `position`.
    pub fn scale(&self, position: usize, confidence: f64) -> f64 {
        match self.temperatures.get(position) {
            Some(&t) => scale_by(confidence, t),
            None => confidence,
        }
    }

    /// Scales a request's confidences in place (position `i` with `T_i`).
    pub fn apply(&self, confidences: &mut [f64]) {
        for (i, c) in confidences.iter_mut().enumerate() {
            *c = self.scale(i, *c);
        }
    }

    /// Per-position calibration after scaling (see [`calibration_report`]).
    pub fn report(
        &self,
        samples: &[Outcome],
        bins: usize,
    ) -> Result<Vec<PositionCalibration>, SpecError> {
        report_with(samples, bins, self)
    }
}

/// `σ(logit(c) / t)`, with 0 and 1 fixed points.
fn scale_by(c: f64, t: f64) -> f64 {
    if c <= 0.0 || c >= 1.0 || t == 1.0 {
        return c;
    }
    let logit = (c / (1.0 - c)).ln();
    1.0 / (1.0 + (-logit / t).exp())
}

/// Minimises `f` over `t ∈ [T_MIN, T_MAX]` in log space: grid, then golden section around the
/// best grid point. Keeps the best value seen, `t = 1` included.
fn minimise_log(f: &mut impl FnMut(f64) -> f64) -> f64 {
    let (lo, hi) = (T_MIN.ln(), T_MAX.ln());
    let step = (hi - lo) / (GRID - 1) as f64;
    let (mut best_t, mut best_v) = (1.0, f(1.0));
    let mut best_k = None;
    for k in 0..GRID {
        let t = (lo + step * k as f64).exp();
        let v = f(t);
        if v < best_v {
            (best_t, best_v, best_k) = (t, v, Some(k));
        }
    }
    if let Some(k) = best_k {
        let (mut a, mut b) = (
            lo + step * k.saturating_sub(1) as f64,
            lo + step * (k + 1) as f64,
        );
        let b_max = hi;
        b = b.min(b_max);
        let g = (5f64.sqrt() - 1.0) / 2.0;
        let (mut x1, mut x2) = (b - g * (b - a), a + g * (b - a));
        let (mut f1, mut f2) = (f(x1.exp()), f(x2.exp()));
        for _ in 0..REFINE_ITERS {
            if f1 <= f2 {
                b = x2;
                (x2, f2) = (x1, f1);
                x1 = b - g * (b - a);
                f1 = f(x1.exp());
            } else {
                a = x1;
                (x1, f1) = (x2, f2);
                x2 = a + g * (b - a);
                f2 = f(x2.exp());
            }
            for (x, v) in [(x1, f1), (x2, f2)] {
                if v < best_v {
                    (best_t, best_v) = (x.exp(), v);
                }
            }
        }
    }
    best_t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_fixes_edges_and_is_monotone() {
        for t in [0.1, 0.5, 1.0, 2.0, 10.0] {
            assert_eq!(scale_by(0.0, t), 0.0);
            assert_eq!(scale_by(1.0, t), 1.0);
            assert!((scale_by(0.5, t) - 0.5).abs() < 1e-15);
            let mut prev = 0.0;
            for i in 1..100 {
                let v = scale_by(i as f64 / 100.0, t);
                assert!(v >= prev, "order kept (saturation may tie at 1.0)");
                prev = v;
            }
        }
        // T > 1 pulls towards 1/2.
        assert!(scale_by(0.9, 2.0) < 0.9);
        assert!(scale_by(0.9, 0.5) > 0.9);
    }

    #[test]
    fn minimiser_finds_a_smooth_minimum() {
        let t = minimise_log(&mut |t: f64| (t.ln() - 3f64.ln()).powi(2));
        assert!((t - 3.0).abs() < 1e-3, "{t}");
    }
}
