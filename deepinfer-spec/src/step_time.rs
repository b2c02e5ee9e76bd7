//! Step-time model: a profiled table of rows → milliseconds, read as a staircase or
//! interpolated, and corrected online with running medians of measured step times.

use crate::error::SpecError;
use crate::median::RunningMedian;

/// How the table is read between its points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TableShape {
    /// Each point `(rows_i, ms_i)` means "`ms_i` for any batch of more than `rows_{i-1}` and at
    /// most `rows_i` rows", the way kernels padded to tile sizes behave (for example "10 ms up
    /// to 4 rows, 13 ms up to 6").
    Staircase,
    /// Linear interpolation between neighbouring points; row counts below the first point take
    /// the first point's time.
    #[default]
    Linear,
}

/// Default number of measurements each bucket's running median keeps.
pub const DEFAULT_WINDOW: usize = 32;
/// Default number of measurements a bucket needs before its correction applies.
pub const DEFAULT_MIN_SAMPLES: usize = 3;

/// Predicts the duration of one engine step from the number of rows it verifies.
///
/// Built from a profiled table that may be jagged (not monotone, not convex): the planner
/// searches the whole curve, so nothing here assumes a shape. Each table point is a *bucket*;
/// [`StepTimeModel::observe`] feeds a measured step time into its bucket, and once a bucket
/// has [`StepTimeModel::min_samples`] measurements its point is scaled by the running median of
/// `measured / profiled` ratios (a ratio so that measurements at different row counts inside one
/// interpolated segment are comparable; for a staircase it is exactly the median step time).
///
/// The table covers `1..=max_rows()`; predictions outside that range are an error rather than a
/// guess.
#[derive(Debug, Clone)]
pub struct StepTimeModel {
    rows: Vec<usize>,
    base_ms: Vec<f64>,
    ms: Vec<f64>,
    shape: TableShape,
    medians: Vec<RunningMedian>,
    min_samples: usize,
}

impl StepTimeModel {
    /// A model from `(rows, ms)` points with strictly increasing, positive row counts and
    /// positive finite times.
    pub fn new(points: &[(usize, f64)], shape: TableShape) -> Result<Self, SpecError> {
        Self::with_window(points, shape, DEFAULT_WINDOW, DEFAULT_MIN_SAMPLES)
    }

    /// A staircase model (see [`TableShape::Staircase`]).
    pub fn staircase(points: &[(usize, f64)]) -> Result<Self, SpecError> {
        Self::new(points, TableShape::Staircase)
    }

    /// A linearly interpolated model (see [`TableShape::Linear`]).
    pub fn linear(points: &[(usize, f64)]) -> Result<Self, SpecError> {
        Self::new(points, TableShape::Linear)
    }

    /// Like [`StepTimeModel::new`] with explicit online-correction settings: each bucket keeps
    /// the last `window` (≥ 1) measurements and applies its correction from `min_samples` (≥ 1)
    /// on.
    pub fn with_window(
        points: &[(usize, f64)],
        shape: TableShape,
        window: usize,
        min_samples: usize,
    ) -> Result<Self, SpecError> {
        if points.is_empty() {
            return Err(SpecError::EmptyTable);
        }
        if window == 0 {
            return Err(SpecError::InvalidConfig(
                "correction window must be at least 1",
            ));
        }
        if min_samples == 0 || min_samples > window {
            return Err(SpecError::InvalidConfig(
                "min_samples must be in 1..=window",
            ));
        }
        let mut previous = 0usize;
        for &(rows, ms) in points {
            if rows <= previous {
                return Err(SpecError::UnsortedTable { previous, rows });
            }
            if !(ms.is_finite() && ms > 0.0) {
                return Err(SpecError::InvalidStepTime { rows, ms });
            }
            previous = rows;
        }
        Ok(Self {
            rows: points.iter().map(|p| p.0).collect(),
            base_ms: points.iter().map(|p| p.1).collect(),
            ms: points.iter().map(|p| p.1).collect(),
            shape,
            medians: (0..points.len())
                .map(|_| RunningMedian::new(window))
                .collect(),
            min_samples,
        })
    }

    /// The largest row count the table covers.
    pub fn max_rows(&self) -> usize {
        *self.rows.last().unwrap_or(&0)
    }

    /// How the table is read between points.
    pub fn shape(&self) -> TableShape {
        self.shape
    }

    /// Measurements a bucket needs before its correction applies.
    pub fn min_samples(&self) -> usize {
        self.min_samples
    }

    /// The table points as currently corrected: `(rows, ms)`.
    pub fn points(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        self.rows.iter().copied().zip(self.ms.iter().copied())
    }

    /// Predicted milliseconds for a step of `rows` rows (with online corrections applied).
    pub fn predict(&self, rows: usize) -> Result<f64, SpecError> {
        self.check(rows)?;
        let seg = self.rows.partition_point(|&r| r < rows);
        Ok(self.eval(&self.ms, seg, rows))
    }

    /// Predicted milliseconds from the profiled table alone, ignoring online corrections.
    pub fn predict_profiled(&self, rows: usize) -> Result<f64, SpecError> {
        self.check(rows)?;
        let seg = self.rows.partition_point(|&r| r < rows);
        Ok(self.eval(&self.base_ms, seg, rows))
    }

    /// Feeds one measured step (`rows` rows took `ms` milliseconds) into its bucket's running
    /// median. The bucket is the staircase step holding `rows`, or for a linear table the
    /// nearest point (the lower one on a tie).
    pub fn observe(&mut self, rows: usize, ms: f64) -> Result<(), SpecError> {
        self.check(rows)?;
        if !(ms.is_finite() && ms > 0.0) {
            return Err(SpecError::InvalidStepTime { rows, ms });
        }
        let seg = self.rows.partition_point(|&r| r < rows);
        let bucket = match self.shape {
            TableShape::Staircase => seg,
            TableShape::Linear => {
                if seg == 0 || self.rows[seg] == rows {
                    seg
                } else if rows - self.rows[seg - 1] <= self.rows[seg] - rows {
                    seg - 1
                } else {
                    seg
                }
            }
        };
        let profiled = self.eval(&self.base_ms, seg, rows);
        let m = &mut self.medians[bucket];
        m.push(ms / profiled);
        if m.len() >= self.min_samples
            && let Some(ratio) = m.median()
        {
            self.ms[bucket] = self.base_ms[bucket] * ratio;
        }
        Ok(())
    }

    /// Drops every online correction, returning to the profiled table.
    pub fn reset_corrections(&mut self) {
        for (m, (ms, base)) in self
            .medians
            .iter_mut()
            .zip(self.ms.iter_mut().zip(&self.base_ms))
        {
            *m = RunningMedian::new(m.capacity());
            *ms = *base;
        }
    }

    fn check(&self, rows: usize) -> Result<(), SpecError> {
        if rows == 0 || rows > self.max_rows() {
            return Err(SpecError::RowsOutOfRange {
                rows,
                max: self.max_rows(),
            });
        }
        Ok(())
    }

    /// Evaluates the table `ms` at `rows`, where `seg` is the first point with `rows_i ≥ rows`.
    #[inline]
    fn eval(&self, ms: &[f64], seg: usize, rows: usize) -> f64 {
        match self.shape {
            TableShape::Staircase => ms[seg],
            TableShape::Linear => {
                if seg == 0 || self.rows[seg] == rows {
                    ms[seg]
                } else {
                    let (x0, slope) = self.segment(ms, seg);
                    ms[seg - 1] + (rows as f64 - x0) * slope
                }
            }
        }
    }

    /// Left end and slope of linear segment `seg` (`seg ≥ 1`).
    #[inline]
    fn segment(&self, ms: &[f64], seg: usize) -> (f64, f64) {
        let (x0, x1) = (self.rows[seg - 1] as f64, self.rows[seg] as f64);
        (x0, (ms[seg] - ms[seg - 1]) / (x1 - x0))
    }

    /// A cursor for predictions at non-decreasing row counts in amortised `O(1)` each (the
    /// planner's scan).
    pub(crate) fn cursor(&self) -> Cursor<'_> {
        Cursor {
            model: self,
            seg: 0,
            x0: 0.0,
            slope: 0.0,
        }
    }
}

/// Walks the table forward for non-decreasing row counts, caching the current segment so each
/// prediction is one multiply-add (and gives exactly what [`StepTimeModel::predict`] gives).
pub(crate) struct Cursor<'a> {
    model: &'a StepTimeModel,
    seg: usize,
    x0: f64,
    slope: f64,
}

impl Cursor<'_> {
    /// Prediction at `rows`, which must be in range and not below the previous call's.
    #[inline]
    pub(crate) fn at(&mut self, rows: usize) -> f64 {
        let m = self.model;
        if m.rows[self.seg] < rows {
            while m.rows[self.seg] < rows {
                self.seg += 1;
            }
            if self.seg > 0 {
                (self.x0, self.slope) = m.segment(&m.ms, self.seg);
            }
        }
        match m.shape {
            TableShape::Staircase => m.ms[self.seg],
            TableShape::Linear => {
                if self.seg == 0 || m.rows[self.seg] == rows {
                    m.ms[self.seg]
                } else {
                    m.ms[self.seg - 1] + (rows as f64 - self.x0) * self.slope
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staircase_reads_up_to() {
        let m = StepTimeModel::staircase(&[(4, 10.0), (6, 13.0), (8, 16.0)]).unwrap();
        let got: Vec<f64> = (1..=8).map(|r| m.predict(r).unwrap()).collect();
        assert_eq!(got, [10.0, 10.0, 10.0, 10.0, 13.0, 13.0, 16.0, 16.0]);
        assert!(matches!(
            m.predict(9),
            Err(SpecError::RowsOutOfRange { .. })
        ));
        assert!(matches!(
            m.predict(0),
            Err(SpecError::RowsOutOfRange { .. })
        ));
    }

    #[test]
    fn linear_interpolates_and_clamps_below() {
        let m = StepTimeModel::linear(&[(4, 10.0), (8, 18.0)]).unwrap();
        assert_eq!(m.predict(1).unwrap(), 10.0);
        assert_eq!(m.predict(6).unwrap(), 14.0);
        assert_eq!(m.predict(8).unwrap(), 18.0);
    }

    #[test]
    fn cursor_matches_predict() {
        let m = StepTimeModel::linear(&[(2, 3.0), (5, 2.0), (9, 7.0), (10, 7.5)]).unwrap();
        let mut c = m.cursor();
        for r in 1..=10 {
            assert_eq!(c.at(r), m.predict(r).unwrap());
        }
    }

    #[test]
    fn bad_tables() {
        assert_eq!(
            StepTimeModel::linear(&[]).unwrap_err(),
            SpecError::EmptyTable
        );
        assert!(matches!(
            StepTimeModel::linear(&[(4, 1.0), (4, 2.0)]),
            Err(SpecError::UnsortedTable { .. })
        ));
        assert!(matches!(
            StepTimeModel::linear(&[(0, 1.0)]),
            Err(SpecError::UnsortedTable { .. })
        ));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                StepTimeModel::linear(&[(4, bad)]),
                Err(SpecError::InvalidStepTime { .. })
            ));
        }
    }

    #[test]
    fn online_correction_uses_running_median() {
        let mut m =
            StepTimeModel::with_window(&[(4, 10.0), (8, 20.0)], TableShape::Staircase, 5, 3)
                .unwrap();
        m.observe(6, 30.0).unwrap();
        m.observe(7, 31.0).unwrap();
        // Below min_samples: still the profiled value.
        assert_eq!(m.predict(8).unwrap(), 20.0);
        // An outlier does not move the median much.
        m.observe(8, 500.0).unwrap();
        assert_eq!(m.predict(8).unwrap(), 31.0);
        // The other bucket is untouched.
        assert_eq!(m.predict(3).unwrap(), 10.0);
        assert_eq!(m.predict_profiled(8).unwrap(), 20.0);
        assert!(m.observe(8, -1.0).is_err());
        assert!(m.observe(9, 1.0).is_err());
        m.reset_corrections();
        assert_eq!(m.predict(8).unwrap(), 20.0);
    }

    #[test]
    fn linear_correction_scales_nearest_point() {
        let mut m = StepTimeModel::with_window(&[(10, 10.0), (20, 20.0)], TableShape::Linear, 8, 1)
            .unwrap();
        // 12 rows is nearest to the 10-row point: profiled 12 ms, measured 24 ms → ×2.
        m.observe(12, 24.0).unwrap();
        assert_eq!(m.predict(10).unwrap(), 20.0);
        assert_eq!(m.predict(20).unwrap(), 20.0);
        assert_eq!(m.predict(15).unwrap(), 20.0);
    }
}
