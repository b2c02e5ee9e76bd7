//! Bad input is a typed error, never a panic.

use deepinfer_spec::{
    Planner, PlannerConfig, SpecError, StepTimeModel, TableShape, fixed_length, split,
};

fn planner() -> Planner {
    let model = StepTimeModel::staircase(&[(4, 10.0), (6, 13.0), (8, 16.0)]).unwrap();
    Planner::new(model, PlannerConfig::default()).unwrap()
}

#[test]
fn confidences_outside_unit_interval_or_nan() {
    for bad in [f64::NAN, -0.1, 1.0001, f64::INFINITY, f64::NEG_INFINITY] {
        let batch = [vec![0.9, 0.9], vec![0.5, bad]];
        let want = |e: &SpecError| {
            matches!(e, SpecError::InvalidConfidence { request: 1, position: 1, value }
                if value.to_bits() == bad.to_bits())
        };
        assert!(want(&planner().plan(&batch).unwrap_err()));
        assert!(want(&split(2, &batch).unwrap_err()));
        let model = StepTimeModel::linear(&[(8, 1.0)]).unwrap();
        assert!(want(&fixed_length(&model, 1, &batch).unwrap_err()));
    }
}

#[test]
fn edge_confidences_are_fine() {
    let batch = [vec![0.0, 1.0], vec![1.0, -0.0]];
    let plan = planner().plan(&batch).unwrap();
    assert_eq!(plan.draft_rows.len(), 2);
}

#[test]
fn empty_batch() {
    let empty: [Vec<f64>; 0] = [];
    assert_eq!(planner().plan(&empty).unwrap_err(), SpecError::EmptyBatch);
    assert_eq!(split(3, &empty).unwrap_err(), SpecError::EmptyBatch);
    let model = StepTimeModel::linear(&[(8, 1.0)]).unwrap();
    assert_eq!(
        fixed_length(&model, 1, &empty).unwrap_err(),
        SpecError::EmptyBatch
    );
}

#[test]
fn non_positive_step_times() {
    for bad in [0.0, -5.0, f64::NAN, f64::INFINITY] {
        for shape in [TableShape::Linear, TableShape::Staircase] {
            assert!(matches!(
                StepTimeModel::new(&[(4, 10.0), (8, bad)], shape),
                Err(SpecError::InvalidStepTime { rows: 8, .. })
            ));
        }
        let mut p = planner();
        assert!(matches!(
            p.observe(4, bad),
            Err(SpecError::InvalidStepTime { .. })
        ));
    }
}

#[test]
fn batch_larger_than_table_or_cap() {
    let batch = vec![vec![0.5]; 9];
    assert_eq!(
        planner().plan(&batch).unwrap_err(),
        SpecError::BatchTooLarge {
            requests: 9,
            max: 8
        }
    );
    let model = StepTimeModel::staircase(&[(4, 10.0), (6, 13.0), (8, 16.0)]).unwrap();
    let capped = PlannerConfig {
        max_total_rows: Some(3),
        ..PlannerConfig::default()
    };
    let mut p = Planner::new(model.clone(), capped).unwrap();
    let plan = p.plan(&[[0.9, 0.9], [0.9, 0.9]]).unwrap();
    assert_eq!(plan.total_rows, 3);
    assert!(matches!(
        p.plan(&[[0.9], [0.9], [0.9], [0.9]]),
        Err(SpecError::BatchTooLarge {
            requests: 4,
            max: 3
        })
    ));
    assert!(matches!(
        Planner::new(
            model.clone(),
            PlannerConfig {
                max_total_rows: Some(0),
                ..PlannerConfig::default()
            }
        ),
        Err(SpecError::InvalidConfig(_))
    ));
    assert!(matches!(
        fixed_length(&model, 3, &[[0.9; 3], [0.9; 3], [0.9; 3]]),
        Err(SpecError::RowsOutOfRange { rows: 12, max: 8 })
    ));
}

#[test]
fn drafts_beyond_the_table_are_never_planned() {
    // 2 requests × 10 drafts would be 22 rows; the table ends at 8.
    let plan = planner().plan(&[[1.0; 10], [1.0; 10]]).unwrap();
    assert!(plan.total_rows <= 8);
}

#[test]
fn max_drafts_per_request_caps_each_request() {
    let model = StepTimeModel::linear(&[(64, 1.0)]).unwrap();
    let config = PlannerConfig {
        max_drafts_per_request: Some(2),
        ..PlannerConfig::default()
    };
    let mut p = Planner::new(model, config).unwrap();
    let plan = p.plan(&[[1.0; 5], [0.9; 5]]).unwrap();
    assert_eq!(plan.draft_rows, [2, 2]);
    assert_eq!(p.fixed_length(5, &[[1.0; 5]]).unwrap().draft_rows, [2]);
}
