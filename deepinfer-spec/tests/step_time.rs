//! Property tests of the step-time model: table reading and online correction.

use deepinfer_spec::testing::step_points as points;
use deepinfer_spec::{SpecError, StepTimeModel, TableShape};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn staircase_is_the_first_point_at_or_above(pts in points()) {
        let m = StepTimeModel::staircase(&pts).unwrap();
        for rows in 1..=m.max_rows() {
            let want = pts.iter().find(|p| p.0 >= rows).unwrap().1;
            prop_assert_eq!(m.predict(rows).unwrap(), want);
        }
    }

    #[test]
    fn linear_hits_points_and_stays_between_neighbours(pts in points()) {
        let m = StepTimeModel::linear(&pts).unwrap();
        for &(rows, ms) in &pts {
            prop_assert_eq!(m.predict(rows).unwrap(), ms);
        }
        for w in pts.windows(2) {
            let (lo, hi) = (w[0].1.min(w[1].1), w[0].1.max(w[1].1));
            for rows in w[0].0..=w[1].0 {
                let v = m.predict(rows).unwrap();
                prop_assert!(v >= lo - 1e-9 && v <= hi + 1e-9);
            }
        }
        let beyond = matches!(m.predict(m.max_rows() + 1), Err(SpecError::RowsOutOfRange { .. }));
        prop_assert!(beyond);
    }

    #[test]
    fn a_constant_slowdown_is_learned_per_bucket(
        pts in points(), factor in 0.5..3.0f64, stair in any::<bool>(), pick in any::<prop::sample::Index>(),
    ) {
        let shape = if stair { TableShape::Staircase } else { TableShape::Linear };
        let mut m = StepTimeModel::with_window(&pts, shape, 9, 3).unwrap();
        // Measure at one table point only: its bucket learns the factor, the others stay.
        let (rows, ms) = pts[pick.index(pts.len())];
        for _ in 0..3 {
            m.observe(rows, ms * factor).unwrap();
        }
        for &(r, t) in &pts {
            let got = m.predict(r).unwrap();
            let want = if r == rows { t * factor } else { t };
            prop_assert!((got - want).abs() <= 1e-9 * want, "rows {r}: {got} vs {want}");
            prop_assert_eq!(m.predict_profiled(r).unwrap(), t);
        }
    }

    #[test]
    fn the_median_ignores_a_minority_of_outliers(pts in points(), spikes in 1usize..4) {
        let mut m = StepTimeModel::with_window(&pts, TableShape::Staircase, 9, 1).unwrap();
        let (rows, ms) = pts[0];
        for _ in 0..6 {
            m.observe(rows, ms).unwrap();
        }
        for _ in 0..spikes {
            m.observe(rows, ms * 100.0).unwrap();
        }
        prop_assert!((m.predict(rows).unwrap() - ms).abs() <= 1e-9 * ms);
    }
}
