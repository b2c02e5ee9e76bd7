//! Step-time model `cost = a·q·(q + c) + b·(q + c) + e·o + d`.
//!
//! A step runs a set of rows; each request contributes `q` new tokens on top of
//! `c` cached ones (a decode row is `q = 1`), and `o` of its rows produce
//! logits (every row of a decode row, drafts included; the last row of a
//! prefill chunk that samples; none of a chunk that does not). Attention work
//! grows with `q·(q + c)`, everything linear in the tokens touched with
//! `q + c`, the vocabulary projection (and sampling) with the output rows, and
//! `d` is the fixed launch overhead paid once per step. The step time is
//! therefore
//!
//! ```text
//! t = d + Σ_i [ a·q_i·(q_i + c_i) + b·(q_i + c_i) + e·o_i ]
//! ```
//!
//! which is linear in `(a, b, e, d)`: least squares on the step features
//! `(Σ q(q+c), Σ (q+c), Σ o, 1)` recovers the coefficients. The output term
//! matters where the head is large next to the layers (a small model with a
//! large vocabulary): a decode row then costs far more than a prefill token,
//! and one shared per-token coefficient overcharges prefill chunks or
//! undercharges decode rows. Online refits keep exponentially-forgotten normal
//! equations and clamp every coefficient into caller-given bounds (a noisy
//! burst must never make a coefficient negative, which would let the scheduler
//! believe an infinite chunk is free). A start-up calibration can stay in every
//! refit as a prior: a scheduler that holds its steps at the budget feeds back
//! steps whose time barely varies, which alone would let the per-token terms
//! decay to nothing.

use thiserror::Error;

/// Number of coefficients (and regressors) of the model.
const N: usize = 4;

/// Relative ridge of an online refit toward the coefficients in effect: a
/// proximal step whose fixed point is the least-squares fit, but which leaves a
/// direction the recent steps do not inform (say `e` against `d` while the
/// batch size stays the same) where it was.
const PROXIMAL: f64 = 1e-3;

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
    /// The samples do not vary enough to separate the coefficients (a term
    /// no sample exercises, such as `e` without output rows, is not counted:
    /// it stays at its lower bound).
    #[error("not enough independent samples to fit the model")]
    Underdetermined,
}

/// The four coefficients of the model (time units are the caller's, e.g. ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostCoefficients {
    /// Quadratic (attention) coefficient, per `q·(q + c)`.
    pub a: f64,
    /// Linear coefficient, per token touched `q + c`.
    pub b: f64,
    /// Fixed per-step overhead.
    pub d: f64,
    /// Per output row: a row that produces logits (the vocabulary projection
    /// and sampling), on top of its share of `a` and `b`.
    pub e: f64,
}

impl CostCoefficients {
    /// Predicted time of one chunk of `q` new tokens over `c` cached ones that
    /// produces no logits, without `d`.
    pub fn chunk(&self, q: usize, c: usize) -> f64 {
        let q = q as f64;
        let t = q + c as f64;
        self.a * q * t + self.b * t
    }

    /// Predicted time of one chunk whose last row samples (one output row),
    /// without `d`.
    pub fn sampling_chunk(&self, q: usize, c: usize) -> f64 {
        self.chunk(q, c) + self.e
    }

    /// Predicted time of a step made of a single chunk that samples its last
    /// row (a prompt prefilled whole, alone), overhead included.
    pub fn cost(&self, q: usize, c: usize) -> f64 {
        self.d + self.sampling_chunk(q, c)
    }

    /// Predicted time of `rows` decode rows (one token each, no drafts), each
    /// over `c` cached tokens, without `d`.
    pub fn decode_rows(&self, rows: usize, c: usize) -> f64 {
        rows as f64 * self.sampling_chunk(1, c)
    }

    /// Predicted time of a whole step given its features.
    pub fn step(&self, f: &StepFeatures) -> f64 {
        self.a * f.quad + self.b * f.lin + self.e * f.out_rows + self.d
    }

    /// The largest `q ≤ cap` whose non-sampling chunk cost over `c` cached
    /// tokens is at most `budget` (the budget excludes `d`; subtract it first
    /// when the chunk runs alone). See [`CostCoefficients::max_chunk_of`] for a
    /// chunk that may end its prompt and sample.
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

    /// The largest `q ≤ min(cap, remaining)` for the next chunk of a prompt
    /// with `remaining` tokens left after `c`, whose cost fits `budget`
    /// (without `d`): a chunk that takes all `remaining` tokens samples its
    /// last row and is charged `e` for it ([`CostCoefficients::sampling_chunk`]),
    /// a shorter one is not ([`CostCoefficients::chunk`]).
    pub fn max_chunk_of(&self, c: usize, remaining: usize, budget: f64, cap: usize) -> usize {
        let cap = cap.min(remaining);
        if cap == 0 || budget.is_nan() || budget <= 0.0 {
            return 0;
        }
        if cap == remaining && self.sampling_chunk(remaining, c) <= budget {
            return remaining;
        }
        self.max_chunk(c, budget, cap.min(remaining - 1))
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
    /// `[lo, hi]` for `e`.
    pub e: (f64, f64),
}

impl Default for CoefficientBounds {
    /// Non-negative and finite: the physical meaning of every term.
    fn default() -> Self {
        Self {
            a: (0.0, f64::MAX),
            b: (0.0, f64::MAX),
            d: (0.0, f64::MAX),
            e: (0.0, f64::MAX),
        }
    }
}

impl CoefficientBounds {
    fn check(&self) -> Result<(), CostModelError> {
        for (name, (lo, hi)) in [("a", self.a), ("b", self.b), ("d", self.d), ("e", self.e)] {
            if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
                return Err(CostModelError::InvalidBounds { name, lo, hi });
            }
        }
        Ok(())
    }

    /// In regressor order `(a, b, e, d)`.
    fn as_array(&self) -> [(f64, f64); N] {
        [self.a, self.b, self.e, self.d]
    }
}

/// The regressors of one step: `Σ q·(q + c)` and `Σ (q + c)` over its rows,
/// and how many of its rows produce logits.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepFeatures {
    /// `Σ q_i·(q_i + c_i)`.
    pub quad: f64,
    /// `Σ (q_i + c_i)`.
    pub lin: f64,
    /// Rows that produce logits: every row of a decode row (its drafts
    /// included) and the last row of a chunk that samples.
    pub out_rows: f64,
}

impl StepFeatures {
    /// Add one row group that produces no logits: `q` new tokens over `c` cached.
    pub fn add(&mut self, q: usize, c: usize) {
        let q = q as f64;
        let t = q + c as f64;
        self.quad += q * t;
        self.lin += t;
    }

    /// Add `n` rows that produce logits (to groups added with [`StepFeatures::add`]).
    pub fn add_outputs(&mut self, n: usize) {
        self.out_rows += n as f64;
    }

    /// Add one decode row with `drafts` draft rows, its input at position `c`:
    /// `1 + drafts` new tokens over `c` cached, all of them output rows.
    pub fn add_decode(&mut self, c: usize, drafts: usize) {
        self.add(1 + drafts, c);
        self.add_outputs(1 + drafts);
    }

    /// Features of a single chunk that produces no logits.
    pub fn of_chunk(q: usize, c: usize) -> Self {
        let mut f = Self::default();
        f.add(q, c);
        f
    }

    /// Features of a single chunk that samples its last row.
    pub fn of_sampling_chunk(q: usize, c: usize) -> Self {
        let mut f = Self::of_chunk(q, c);
        f.add_outputs(1);
        f
    }

    /// Features of `rows` decode rows (no drafts), each with its input at position `c`.
    pub fn of_decode(rows: usize, c: usize) -> Self {
        let mut f = Self::default();
        for _ in 0..rows {
            f.add_decode(c, 0);
        }
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
    // Normal equations X^T X (symmetric 4×4) and X^T y, forgotten exponentially,
    // in regressor order (quad, lin, out_rows, 1).
    xtx: [[f64; N]; N],
    xty: [f64; N],
    samples: f64,
    // Normal equations of the calibration samples ([`PrefillCostModel::with_prior`]),
    // added to every refit and never forgotten.
    prior_xtx: [[f64; N]; N],
    prior_xty: [f64; N],
    has_prior: bool,
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
            xtx: [[0.0; N]; N],
            xty: [0.0; N],
            samples: 0.0,
            prior_xtx: [[0.0; N]; N],
            prior_xty: [0.0; N],
            has_prior: false,
        })
    }

    /// Keep `samples` (a start-up calibration) as a prior that every refit adds to
    /// the forgotten online samples: directions the recent steps inform follow them,
    /// the others stay where the calibration put them. Without one, a scheduler that
    /// holds every step at its budget feeds the refit steps whose time does not vary
    /// while their context grows, which drives the per-token terms toward zero, and the
    /// next prompt alone is planned as one huge "cheap" chunk.
    pub fn with_prior(mut self, samples: &[StepSample]) -> Result<Self, CostModelError> {
        let (mut xtx, mut xty) = ([[0.0; N]; N], [0.0; N]);
        for s in samples {
            check_sample(s)?;
            accumulate(&mut xtx, &mut xty, s, 1.0);
        }
        self.prior_xtx = xtx;
        self.prior_xty = xty;
        self.has_prior = !samples.is_empty();
        Ok(self)
    }

    /// Fit from a batch of samples (ordinary least squares, clamped). A term no
    /// sample exercises (all its features zero, e.g. `e` without output rows)
    /// is set to its lower bound.
    pub fn fit(
        samples: &[StepSample],
        bounds: CoefficientBounds,
    ) -> Result<CostCoefficients, CostModelError> {
        bounds.check()?;
        let mut xtx = [[0.0; N]; N];
        let mut xty = [0.0; N];
        for s in samples {
            check_sample(s)?;
            accumulate(&mut xtx, &mut xty, s, 1.0);
        }
        let lower = bounds.as_array().map(|(lo, _)| lo);
        solve_clamped(&xtx, &xty, &bounds, &lower, 0.0).ok_or(CostModelError::Underdetermined)
    }

    /// Current coefficients.
    pub fn coefficients(&self) -> CostCoefficients {
        self.coef
    }

    /// Number of effective samples behind the current fit (after forgetting).
    pub fn effective_samples(&self) -> f64 {
        self.samples
    }

    /// Feed one measured step and refit. Without a prior, keeps the old coefficients
    /// until four samples are in; after that (and from the first with one) each refit is a least-squares step that
    /// leaves a coefficient the recent steps do not inform where it was (a
    /// small proximal ridge toward the coefficients in effect). Returns whether
    /// a refit happened.
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
        if self.samples < N as f64 && !self.has_prior {
            return Ok(false);
        }
        let (mut xtx, mut xty) = (self.xtx, self.xty);
        for (row, prior) in xtx.iter_mut().zip(&self.prior_xtx) {
            for (v, p) in row.iter_mut().zip(prior) {
                *v += p;
            }
        }
        for (v, p) in xty.iter_mut().zip(&self.prior_xty) {
            *v += p;
        }
        let cur = to_array(&self.coef);
        match solve_clamped(&xtx, &xty, &self.bounds, &cur, PROXIMAL) {
            Some(c) => {
                self.coef = c;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Predicted time of one chunk run alone, sampling its last row (overhead included).
    pub fn cost(&self, q: usize, c: usize) -> f64 {
        self.coef.cost(q, c)
    }

    /// Largest `q ≤ cap` such that a step holding only this chunk, sampling
    /// its last row, fits `budget`.
    pub fn max_chunk_alone(&self, c: usize, budget: f64, cap: usize) -> usize {
        self.coef
            .max_chunk(c, budget - self.coef.d - self.coef.e, cap)
    }
}

fn check_sample(s: &StepSample) -> Result<(), CostModelError> {
    let f = &s.features;
    if !(s.time.is_finite() && s.time >= 0.0) {
        return Err(CostModelError::InvalidSample(
            "time must be finite and >= 0",
        ));
    }
    if ![f.quad, f.lin, f.out_rows]
        .iter()
        .all(|v| v.is_finite() && *v >= 0.0)
    {
        return Err(CostModelError::InvalidSample(
            "features must be finite and >= 0",
        ));
    }
    Ok(())
}

#[allow(clippy::needless_range_loop)]
fn accumulate(xtx: &mut [[f64; N]; N], xty: &mut [f64; N], s: &StepSample, w: f64) {
    let f = &s.features;
    let x = [f.quad, f.lin, f.out_rows, 1.0];
    for i in 0..N {
        for j in 0..N {
            xtx[i][j] += w * x[i] * x[j];
        }
        xty[i] += w * x[i] * s.time;
    }
}

/// Coefficients in regressor order `(a, b, e, d)`.
fn to_array(c: &CostCoefficients) -> [f64; N] {
    [c.a, c.b, c.e, c.d]
}

fn clamp(c: CostCoefficients, b: &CoefficientBounds) -> CostCoefficients {
    CostCoefficients {
        a: c.a.clamp(b.a.0, b.a.1),
        b: c.b.clamp(b.b.0, b.b.1),
        d: c.d.clamp(b.d.0, b.d.1),
        e: c.e.clamp(b.e.0, b.e.1),
    }
}

/// Least squares with box constraints by a small active-set loop: solve over the
/// free coefficients, pin the most violated one to its bound, repeat (four
/// unknowns, so at most four rounds). A coefficient whose regressor is zero in
/// every sample is pinned to `rest` (clamped) from the start. With `ridge > 0`
/// the system is `(XᵀX + ridge·D)β = Xᵀy + ridge·D·rest`, `D` the diagonal of
/// `XᵀX`: a proximal step toward `rest`.
#[allow(clippy::needless_range_loop)]
fn solve_clamped(
    xtx: &[[f64; N]; N],
    xty: &[f64; N],
    bounds: &CoefficientBounds,
    rest: &[f64; N],
    ridge: f64,
) -> Option<CostCoefficients> {
    let bnd = bounds.as_array();
    let mut fixed: [Option<f64>; N] = [None; N];
    for i in 0..N {
        if xtx[i][i] <= 0.0 {
            fixed[i] = Some(rest[i].clamp(bnd[i].0, bnd[i].1));
        }
    }
    if fixed.iter().all(Option::is_some) {
        return None;
    }
    for _ in 0..=N {
        let free: Vec<usize> = (0..N).filter(|&i| fixed[i].is_none()).collect();
        let mut beta = [0.0; N];
        for i in 0..N {
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
                r[ii] = xty[i] + ridge * xtx[i][i] * rest[i];
                for k in 0..N {
                    if let Some(v) = fixed[k] {
                        r[ii] -= xtx[i][k] * v;
                    }
                }
                for (jj, &j) in free.iter().enumerate() {
                    m[ii][jj] = xtx[i][j];
                }
                m[ii][ii] += ridge * xtx[i][i];
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
                        e: beta[2],
                        d: beta[3],
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
            e: 0.5,
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
            e: 0.0,
        };
        assert_eq!(free.max_chunk(10, 1.0, 7), 7);
    }

    #[test]
    fn final_chunk_pays_its_sampling_row() {
        let c = coef();
        // 1,000 tokens left: the whole rest fits only with room for `e` too.
        let exact = c.chunk(1000, 0);
        assert_eq!(c.max_chunk_of(0, 1000, exact + c.e, 4096), 1000);
        // Just short of that: the chunk stops before the last token (and does not sample).
        let q = c.max_chunk_of(0, 1000, exact + c.e / 2.0, 4096);
        assert_eq!(q, 999);
        assert!(c.chunk(q, 0) <= exact + c.e / 2.0);
        // A cap below the rest: no sampling row, same as `max_chunk`.
        assert_eq!(c.max_chunk_of(0, 1000, 1e9, 500), 500);
        assert_eq!(c.max_chunk_of(0, 0, 1e9, 500), 0);
        assert_eq!(c.max_chunk_of(0, 10, f64::INFINITY, 500), 10);
        assert_eq!(c.max_chunk_of(0, 10, f64::NAN, 500), 0);
        // One token left that does not fit with its sampling row: nothing.
        assert_eq!(c.max_chunk_of(0, 1, c.e / 2.0, 500), 0);
    }

    #[test]
    fn features_count_output_rows() {
        let mut f = StepFeatures::of_sampling_chunk(100, 20);
        f.add_decode(50, 2);
        assert_eq!(f.quad, 100.0 * 120.0 + 3.0 * 53.0);
        assert_eq!(f.lin, 120.0 + 53.0);
        assert_eq!(f.out_rows, 4.0);
        assert_eq!(StepFeatures::of_chunk(100, 20).out_rows, 0.0);
        let d = StepFeatures::of_decode(8, 10);
        assert_eq!((d.quad, d.lin, d.out_rows), (88.0, 88.0, 8.0));
        let c = coef();
        assert!((c.step(&d) - (c.d + c.decode_rows(8, 10))).abs() < 1e-12);
        assert!(
            (c.cost(100, 20) - c.step(&StepFeatures::of_sampling_chunk(100, 20))).abs() < 1e-12
        );
    }

    #[test]
    fn fit_without_output_rows_leaves_e_at_its_lower_bound() {
        let mut c = coef();
        c.e = 0.0;
        let samples: Vec<StepSample> =
            [(1usize, 0usize), (64, 0), (512, 0), (128, 1024), (1, 4096)]
                .iter()
                .map(|&(q, ctx)| StepSample {
                    features: StepFeatures::of_chunk(q, ctx),
                    time: c.step(&StepFeatures::of_chunk(q, ctx)),
                })
                .collect();
        let bounds = CoefficientBounds {
            e: (0.25, 10.0),
            ..Default::default()
        };
        let f = PrefillCostModel::fit(&samples, bounds).unwrap();
        assert_eq!(f.e, 0.25);
        assert!((f.a - c.a).abs() / c.a < 1e-6, "{f:?}");
        assert!((f.b - c.b).abs() / c.b < 1e-6, "{f:?}");
    }

    #[test]
    fn online_refit_keeps_an_uninformed_split_where_it_was() {
        // Decode-only steps of one batch size cannot tell `e` from `d`: the refit
        // must not wander along that line, only match the step time.
        let truth = coef();
        let mut m = PrefillCostModel::new(truth, Default::default(), 0.98).unwrap();
        for i in 0..300 {
            let f = StepFeatures::of_decode(32, 100 + i);
            m.observe(StepSample {
                features: f,
                time: truth.step(&f),
            })
            .unwrap();
        }
        let c = m.coefficients();
        assert!((c.e - truth.e).abs() < 1e-3 * truth.e, "{c:?}");
        assert!((c.d - truth.d).abs() < 1e-3 * truth.d, "{c:?}");
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
        let bad_e = CoefficientBounds {
            e: (0.0, f64::INFINITY),
            ..Default::default()
        };
        assert!(matches!(
            PrefillCostModel::new(coef(), bad_e, 1.0),
            Err(CostModelError::InvalidBounds { name: "e", .. })
        ));
        assert!(PrefillCostModel::new(coef(), Default::default(), 0.0).is_err());
        let mut m = PrefillCostModel::new(coef(), Default::default(), 1.0).unwrap();
        let s = StepSample {
            features: StepFeatures::of_chunk(1, 1),
            time: f64::NAN,
        };
        assert!(m.observe(s).is_err());
        assert!(matches!(
            PrefillCostModel::new(coef(), Default::default(), 1.0)
                .unwrap()
                .with_prior(&[s]),
            Err(CostModelError::InvalidSample(_))
        ));
        let mut neg = StepFeatures::of_chunk(1, 1);
        neg.out_rows = -1.0;
        assert!(
            m.observe(StepSample {
                features: neg,
                time: 1.0
            })
            .is_err()
        );
        assert_eq!(
            PrefillCostModel::fit(&[], Default::default()),
            Err(CostModelError::Underdetermined)
        );
    }
}
