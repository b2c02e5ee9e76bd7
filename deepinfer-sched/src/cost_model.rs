//! Prefill step-time model `cost(q, c) = a·q·(q + c) + b·(q + c) + d`.
//!
//! A step runs a set of rows; each request contributes `q` new tokens on top of
//! `c` cached ones (a decode row is `q = 1`). Attention work grows with
//! `q·(q + c)`, everything linear in the tokens touched with `q + c`, and `d` is
//! the fixed launch overhead paid once per step. The step time is therefore
//!
//! ```text
//! t = d + Σ_i [ a·q_i·(q_i + c_i) + b·(q_i + c_i) ]
//! ```
//!
//! which is linear in `(a, b, d)`: least squares on the step features
//! `(Σ q(q+c), Σ (q+c), 1)` recovers the coefficients. Online refits keep
//! exponentially-forgotten normal equations and clamp every coefficient into
//! caller-given bounds (a noisy burst must never make a coefficient negative,
//! which would let the scheduler believe an infinite chunk is free).

use thiserror::Error;

/// Errors from building or fitting a cost model.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CostModelError {
    /// A bound pair is inverted or not finite.
    #[error("invalid bounds for coefficient {name}: [{lo}, {hi}]")]
    InvalidBounds {
        /// Which coefficient.
        name: &'static str,
        /// Lower bound.
        lo: f64,
        /// Upper bound.
        hi: f64,
    },
    /// The forgetting factor must lie in (0, 1].
    #[error("forgetting factor {0} outside (0, 1]")]
    InvalidForgetting(f64),
    /// A measured time or feature is negative or not finite.
    #[error("invalid sample: {0}")]
    InvalidSample(&'static str),
    /// Fewer than three informative samples, or the samples do not vary enough
    /// to separate the three coefficients.
    #[error("not enough independent samples to fit the model")]
    Underdetermined,
}

/// The three coefficients of the model (time units are the caller's, e.g. ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostCoefficients {
    /// Quadratic (attention) coefficient, per `q·(q + c)`.
    pub a: f64,
    /// Linear coefficient, per token touched `q + c`.
    pub b: f64,
    /// Fixed per-step overhead.
    pub d: f64,
}

impl CostCoefficients {
    /// Predicted time of one chunk of `q` new tokens over `c` cached ones, without `d`.
    pub fn chunk(&self, q: usize, c: usize) -> f64 {
        let q = q as f64;
        let t = q + c as f64;
        self.a * q * t + self.b * t
    }

    /// Predicted time of a step made of a single chunk, overhead included.
    pub fn cost(&self, q: usize, c: usize) -> f64 {
        self.d + self.chunk(q, c)
    }

    /// Predicted time of a whole step given its features.
    pub fn step(&self, f: &StepFeatures) -> f64 {
        self.a * f.quad + self.b * f.lin + self.d
    }

    /// The largest `q ≤ cap` whose chunk cost over `c` cached tokens is at most `budget`
    /// (the budget excludes `d`; subtract it first when the chunk runs alone).
    ///
    /// Solves `a·q² + (a·c + b)·q + (b·c − budget) ≤ 0` in closed form and then
    /// nudges by one to absorb floating-point error. Returns 0 when even one token
    /// does not fit.
    pub fn max_chunk(&self, c: usize, budget: f64, cap: usize) -> usize {
        if cap == 0 || budget.is_nan() || budget <= 0.0 {
            return 0;
        }
        if budget.is_infinite() {
            return cap;
        }
        let cf = c as f64;
        let (qa, qb, qc) = (self.a, self.a * cf + self.b, self.b * cf - budget);
        let root = if qa > 0.0 {
            let disc = qb * qb - 4.0 * qa * qc;
            if disc < 0.0 {
                return 0;
            }
            // Numerically stable root of the upward parabola.
            let s = disc.sqrt();
            if qb >= 0.0 {
                (2.0 * -qc) / (qb + s)
            } else {
                (-qb + s) / (2.0 * qa)
            }
        } else if qb > 0.0 {
            -qc / qb
        } else {
            // Free tokens: the model has no positive coefficient on q.
            return cap;
        };
        if root.is_nan() || root < 1.0 {
            return if self.chunk(1, c) <= budget {
                1.min(cap)
            } else {
                0
            };
        }
        let mut q = if root >= cap as f64 {
            cap
        } else {
            root.floor() as usize
        };
        while q > 0 && self.chunk(q, c) > budget {
            q -= 1;
        }
        while q < cap && self.chunk(q + 1, c) <= budget {
            q += 1;
        }
        q
    }
}

/// Bounds each refit clamps a coefficient into.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CoefficientBounds {
    /// `[lo, hi]` for `a`.
    pub a: (f64, f64),
    /// `[lo, hi]` for `b`.
    pub b: (f64, f64),
    /// `[lo, hi]` for `d`.
    pub d: (f64, f64),
}

impl Default for CoefficientBounds {
    /// Non-negative and finite: the physical meaning of every term.
    fn default() -> Self {
        Self {
            a: (0.0, f64::MAX),
            b: (0.0, f64::MAX),
            d: (0.0, f64::MAX),
        }
    }
}

impl CoefficientBounds {
    fn check(&self) -> Result<(), CostModelError> {
        for (name, (lo, hi)) in [("a", self.a), ("b", self.b), ("d", self.d)] {
            if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
                return Err(CostModelError::InvalidBounds { name, lo, hi });
            }
        }
        Ok(())
    }

    fn as_array(&self) -> [(f64, f64); 3] {
        [self.a, self.b, self.d]
    }
}

/// The regressors of one step: `Σ q·(q + c)` and `Σ (q + c)` over its rows.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepFeatures {
    /// `Σ q_i·(q_i + c_i)`.
    pub quad: f64,
    /// `Σ (q_i + c_i)`.
    pub lin: f64,
}

impl StepFeatures {
    /// Add one row group: `q` new tokens over `c` cached.
    pub fn add(&mut self, q: usize, c: usize) {
        let q = q as f64;
        let t = q + c as f64;
        self.quad += q * t;
        self.lin += t;
    }

    /// Features of a single chunk.
    pub fn of_chunk(q: usize, c: usize) -> Self {
        let mut f = Self::default();
        f.add(q, c);
        f
    }
}

/// One measured step: its features and the time it took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSample {
    /// The step's regressors.
    pub features: StepFeatures,
    /// Measured wall time.
    pub time: f64,
}

/// The cost model with online refitting.
#[derive(Debug, Clone)]
pub struct PrefillCostModel {
    coef: CostCoefficients,
    bounds: CoefficientBounds,
    forgetting: f64,
    // Normal equations X^T X (symmetric 3×3) and X^T y, forgotten exponentially.
    xtx: [[f64; 3]; 3],
    xty: [f64; 3],
    samples: f64,
}

impl PrefillCostModel {
    /// A model with initial coefficients, clamp bounds and a forgetting factor in
    /// (0, 1] (1 keeps every sample forever; 0.99 has a memory of about 100 steps).
    pub fn new(
        initial: CostCoefficients,
        bounds: CoefficientBounds,
        forgetting: f64,
    ) -> Result<Self, CostModelError> {
        bounds.check()?;
        if !(forgetting > 0.0 && forgetting <= 1.0) {
            return Err(CostModelError::InvalidForgetting(forgetting));
        }
        let coef = clamp(initial, &bounds);
        Ok(Self {
            coef,
            bounds,
            forgetting,
            xtx: [[0.0; 3]; 3],
            xty: [0.0; 3],
            samples: 0.0,
        })
    }

    /// Fit from a batch of samples (ordinary least squares, clamped).
    pub fn fit(
        samples: &[StepSample],
        bounds: CoefficientBounds,
    ) -> Result<CostCoefficients, CostModelError> {
        bounds.check()?;
        let mut xtx = [[0.0; 3]; 3];
        let mut xty = [0.0; 3];
        for s in samples {
            check_sample(s)?;
            accumulate(&mut xtx, &mut xty, s, 1.0);
        }
        solve_clamped(&xtx, &xty, &bounds).ok_or(CostModelError::Underdetermined)
    }

    /// Current coefficients.
    pub fn coefficients(&self) -> CostCoefficients {
        self.coef
    }

    /// Number of effective samples behind the current fit (after forgetting).
    pub fn effective_samples(&self) -> f64 {
        self.samples
    }

    /// Feed one measured step and refit. Keeps the old coefficients while the
    /// data cannot separate the three terms yet. Returns whether a refit happened.
    pub fn observe(&mut self, sample: StepSample) -> Result<bool, CostModelError> {
        check_sample(&sample)?;
        let l = self.forgetting;
        for row in &mut self.xtx {
            for v in row.iter_mut() {
                *v *= l;
            }
        }
        for v in &mut self.xty {
            *v *= l;
        }
        self.samples = self.samples * l + 1.0;
        accumulate(&mut self.xtx, &mut self.xty, &sample, 1.0);
        match solve_clamped(&self.xtx, &self.xty, &self.bounds) {
            Some(c) if self.samples >= 3.0 => {
                self.coef = c;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Predicted time of one chunk run alone (overhead included).
    pub fn cost(&self, q: usize, c: usize) -> f64 {
        self.coef.cost(q, c)
    }

    /// Largest `q ≤ cap` such that a step holding only this chunk fits `budget`.
    pub fn max_chunk_alone(&self, c: usize, budget: f64, cap: usize) -> usize {
        self.coef.max_chunk(c, budget - self.coef.d, cap)
    }
}

fn check_sample(s: &StepSample) -> Result<(), CostModelError> {
    let f = &s.features;
    if !(s.time.is_finite() && s.time >= 0.0) {
        return Err(CostModelError::InvalidSample(
            "time must be finite and >= 0",
        ));
    }
    if !(f.quad.is_finite() && f.quad >= 0.0 && f.lin.is_finite() && f.lin >= 0.0) {
        return Err(CostModelError::InvalidSample(
            "features must be finite and >= 0",
        ));
    }
    Ok(())
}

#[allow(clippy::needless_range_loop)]
fn accumulate(xtx: &mut [[f64; 3]; 3], xty: &mut [f64; 3], s: &StepSample, w: f64) {
    let x = [s.features.quad, s.features.lin, 1.0];
    for i in 0..3 {
        for j in 0..3 {
            xtx[i][j] += w * x[i] * x[j];
        }
        xty[i] += w * x[i] * s.time;
    }
}

fn clamp(c: CostCoefficients, b: &CoefficientBounds) -> CostCoefficients {
    CostCoefficients {
        a: c.a.clamp(b.a.0, b.a.1),
        b: c.b.clamp(b.b.0, b.b.1),
        d: c.d.clamp(b.d.0, b.d.1),
    }
}

/// Least squares with box constraints by a small active-set loop: solve over the
/// free coefficients, pin the most violated one to its bound, repeat (three
/// unknowns, so at most three rounds).
#[allow(clippy::needless_range_loop)]
fn solve_clamped(
    xtx: &[[f64; 3]; 3],
    xty: &[f64; 3],
    bounds: &CoefficientBounds,
) -> Option<CostCoefficients> {
    let bnd = bounds.as_array();
    let mut fixed: [Option<f64>; 3] = [None; 3];
    for _ in 0..=3 {
        let free: Vec<usize> = (0..3).filter(|&i| fixed[i].is_none()).collect();
        let mut beta = [0.0; 3];
        for i in 0..3 {
            if let Some(v) = fixed[i] {
                beta[i] = v;
            }
        }
        if !free.is_empty() {
            // Reduced system over the free coefficients, with the pinned ones moved right.
            let n = free.len();
            let mut m = vec![vec![0.0; n]; n];
            let mut r = vec![0.0; n];
            for (ii, &i) in free.iter().enumerate() {
                r[ii] = xty[i];
                for k in 0..3 {
                    if let Some(v) = fixed[k] {
                        r[ii] -= xtx[i][k] * v;
                    }
                }
                for (jj, &j) in free.iter().enumerate() {
                    m[ii][jj] = xtx[i][j];
                }
            }
            let sol = solve_scaled(m, r)?;
            for (ii, &i) in free.iter().enumerate() {
                beta[i] = sol[ii];
            }
        }
        // Most violated bound among the free coefficients, in relative terms.
        let mut worst: Option<(usize, f64, f64)> = None;
        for &i in &free {
            let (lo, hi) = bnd[i];
            let (target, viol) = if beta[i] < lo {
                (lo, lo - beta[i])
            } else if beta[i] > hi {
                (hi, beta[i] - hi)
            } else {
                continue;
            };
            let scale = xtx[i][i].sqrt().max(f64::MIN_POSITIVE);
            let v = viol * scale;
            if worst.is_none_or(|w| v > w.2) {
                worst = Some((i, target, v));
            }
        }
        match worst {
            None => {
                return Some(clamp(
                    CostCoefficients {
                        a: beta[0],
                        b: beta[1],
                        d: beta[2],
                    },
                    bounds,
                ));
            }
            Some((i, target, _)) => fixed[i] = Some(target),
        }
    }
    None
}

/// Gaussian elimination with partial pivoting on a Jacobi-scaled system (the
/// features span many orders of magnitude: q·(q+c) ~ 1e8 next to a constant 1).
#[allow(clippy::needless_range_loop)] // index form mirrors the matrix algebra
fn solve_scaled(mut m: Vec<Vec<f64>>, mut r: Vec<f64>) -> Option<Vec<f64>> {
    let n = r.len();
    let s: Vec<f64> = (0..n)
        .map(|i| {
            let d = m[i][i];
            if d > 0.0 { 1.0 / d.sqrt() } else { 0.0 }
        })
        .collect();
    if s.iter().any(|&v| v == 0.0 || !v.is_finite()) {
        return None;
    }
    for i in 0..n {
        r[i] *= s[i];
        for j in 0..n {
            m[i][j] *= s[i] * s[j];
        }
    }
    for col in 0..n {
        let piv = (col..n).max_by(|&x, &y| m[x][col].abs().total_cmp(&m[y][col].abs()))?;
        // Scaled diagonal is 1; a pivot this small means collinear features.
        if m[piv][col].abs() < 1e-10 {
            return None;
        }
        m.swap(col, piv);
        r.swap(col, piv);
        for row in col + 1..n {
            let f = m[row][col] / m[col][col];
            for k in col..n {
                m[row][k] -= f * m[col][k];
            }
            r[row] -= f * r[col];
        }
    }
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        let mut acc = r[i];
        for k in i + 1..n {
            acc -= m[i][k] * x[k];
        }
        x[i] = acc / m[i][i];
    }
    for i in 0..n {
        x[i] *= s[i];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coef() -> CostCoefficients {
        CostCoefficients {
            a: 2e-6,
            b: 3e-3,
            d: 4.0,
        }
    }

    #[test]
    fn max_chunk_is_largest_fitting() {
        let c = coef();
        for ctx in [0usize, 100, 5000, 100_000] {
            for budget in [0.01, 1.0, 10.0, 50.0] {
                let q = c.max_chunk(ctx, budget, 1 << 20);
                if q > 0 {
                    assert!(c.chunk(q, ctx) <= budget);
                }
                assert!(
                    c.chunk(q + 1, ctx) > budget,
                    "ctx {ctx} budget {budget} q {q}"
                );
            }
        }
    }

    #[test]
    fn max_chunk_respects_cap_and_zero_budget() {
        let c = coef();
        assert_eq!(c.max_chunk(0, 1e9, 64), 64);
        assert_eq!(c.max_chunk(0, 0.0, 64), 0);
        assert_eq!(c.max_chunk(0, -1.0, 64), 0);
        assert_eq!(c.max_chunk(0, f64::NAN, 64), 0);
        let free = CostCoefficients {
            a: 0.0,
            b: 0.0,
            d: 1.0,
        };
        assert_eq!(free.max_chunk(10, 1.0, 7), 7);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let bad = CoefficientBounds {
            a: (1.0, 0.0),
            ..Default::default()
        };
        assert!(matches!(
            PrefillCostModel::new(coef(), bad, 1.0),
            Err(CostModelError::InvalidBounds { name: "a", .. })
        ));
        assert!(PrefillCostModel::new(coef(), Default::default(), 0.0).is_err());
        let mut m = PrefillCostModel::new(coef(), Default::default(), 1.0).unwrap();
        let s = StepSample {
            features: StepFeatures::of_chunk(1, 1),
            time: f64::NAN,
        };
        assert!(m.observe(s).is_err());
        assert_eq!(
            PrefillCostModel::fit(&[], Default::default()),
            Err(CostModelError::Underdetermined)
        );
    }
}
