//! Property tests of the planner, `split` and fixed-length mode.

use deepinfer_spec::{
    Plan, Planner, PlannerConfig, Search, StepTimeModel, TableShape, fixed_length, split,
};
use proptest::prelude::*;

/// A confidence, with the edges 0 and 1 drawn often.
fn confidence() -> impl Strategy<Value = f64> {
    prop_oneof![
        1 => Just(0.0),
        1 => Just(1.0),
        8 => 0.0..=1.0f64,
    ]
}

fn batch() -> impl Strategy<Value = Vec<Vec<f64>>> {
    prop::collection::vec(prop::collection::vec(confidence(), 0..7), 1..12)
}

/// A jagged table (random times, not monotone) covering at least `min_rows` rows.
fn jagged_table(min_rows: usize) -> impl Strategy<Value = StepTimeModel> {
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
            let last = points.last().unwrap().1;
            if rows < min_rows {
                points.push((min_rows, last));
            }
            let shape = if stair {
                TableShape::Staircase
            } else {
                TableShape::Linear
            };
            StepTimeModel::new(&points, shape).unwrap()
        })
}

/// A convex, non-decreasing, linearly interpolated table.
fn convex_table(min_rows: usize) -> impl Strategy<Value = StepTimeModel> {
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
            StepTimeModel::linear(&points).unwrap()
        })
}

fn max_rows(b: &[Vec<f64>]) -> usize {
    b.len() + b.iter().map(Vec::len).sum::<usize>()
}

fn batch_and_table() -> impl Strategy<Value = (Vec<Vec<f64>>, StepTimeModel)> {
    batch().prop_flat_map(|b| {
        let need = max_rows(&b);
        (Just(b), jagged_table(need))
    })
}

fn products(confs: &[f64]) -> Vec<f64> {
    confs
        .iter()
        .scan(1.0, |a, &c| {
            *a *= c;
            Some(*a)
        })
        .collect()
}

/// Checks that `rows` takes a prefix of each request and the best drafts overall: every chosen
/// draft's running product is at least every unchosen one's.
fn assert_best_prefixes(b: &[Vec<f64>], rows: &[usize]) -> Result<(), TestCaseError> {
    prop_assert_eq!(rows.len(), b.len());
    let (mut min_in, mut max_out) = (f64::INFINITY, f64::NEG_INFINITY);
    for (confs, &d) in b.iter().zip(rows) {
        prop_assert!(d <= confs.len());
        let a = products(confs);
        for (i, &x) in a.iter().enumerate() {
            if i < d {
                min_in = min_in.min(x);
            } else {
                max_out = max_out.max(x);
            }
        }
    }
    prop_assert!(min_in >= max_out, "chosen {min_in} < unchosen {max_out}");
    Ok(())
}

fn expected_tokens(b: &[Vec<f64>], rows: &[usize]) -> f64 {
    b.iter()
        .zip(rows)
        .map(|(c, &d)| 1.0 + products(c)[..d].iter().sum::<f64>())
        .sum()
}

fn value(p: &Plan) -> f64 {
    p.tokens_per_ms()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn plan_beats_fixed_length_and_no_drafts((b, model) in batch_and_table()) {
        let mut planner = Planner::new(model.clone(), PlannerConfig::default()).unwrap();
        let plan = planner.plan(&b).unwrap();
        for n in 0..=6 {
            let fixed = fixed_length(&model, n, &b).unwrap();
            prop_assert!(value(&plan) >= value(&fixed) * (1.0 - 1e-12),
                "plan {} < fixed-{n} {}", value(&plan), value(&fixed));
        }
        // The scanned curve's best point is the plan.
        let best = planner.last_curve().iter().map(|p| p.tokens_per_ms()).fold(0.0, f64::max);
        prop_assert!((best - value(&plan)).abs() <= 1e-12 * best, "{best} vs {}", value(&plan));
    }

    #[test]
    fn plan_is_consistent_and_takes_best_prefixes((b, model) in batch_and_table()) {
        let mut planner = Planner::new(model.clone(), PlannerConfig::default()).unwrap();
        let plan = planner.plan(&b).unwrap();
        assert_best_prefixes(&b, &plan.draft_rows)?;
        prop_assert_eq!(plan.total_rows, b.len() + plan.draft_rows.iter().sum::<usize>());
        prop_assert!((plan.expected_tokens - expected_tokens(&b, &plan.draft_rows)).abs() < 1e-9);
        prop_assert_eq!(plan.predicted_ms, model.predict(plan.total_rows).unwrap());
        // The overlapped split of the same budget over the same confidences is the same plan.
        prop_assert_eq!(split(plan.total_drafts(), &b).unwrap(), plan.draft_rows.clone());
        // Reusing the output buffer gives the same answer.
        let mut again = Plan::default();
        planner.plan_into(&b, &mut again).unwrap();
        prop_assert_eq!(again, plan);
    }

    #[test]
    fn dominating_confidences_get_no_fewer_drafts((b, model) in batch_and_table()) {
        let mut planner = Planner::new(model, PlannerConfig::default()).unwrap();
        let plan = planner.plan(&b).unwrap();
        for i in 0..b.len() {
            for j in 0..b.len() {
                let (ai, aj) = (products(&b[i]), products(&b[j]));
                let strictly = ai.len() >= aj.len() && aj.iter().zip(&ai).all(|(x, y)| y > x);
                let same_and_earlier = i < j && b[i] == b[j];
                if strictly || same_and_earlier {
                    prop_assert!(plan.draft_rows[i] >= plan.draft_rows[j],
                        "request {i} dominates {j} but gets {} < {}",
                        plan.draft_rows[i], plan.draft_rows[j]);
                }
            }
        }
    }

    #[test]
    fn uniform_confidence_gives_allocations_monotone_in_confidence(
        n in 1usize..10, len in 1usize..6, cs in prop::collection::vec(0.0..=1.0f64, 1..10),
        model in jagged_table(60),
    ) {
        // Requests differ only in their (constant per position) confidence: sorting requests by
        // confidence sorts their allocations.
        let b: Vec<Vec<f64>> = cs.iter().take(n).map(|&c| vec![c; len]).collect();
        let mut planner = Planner::new(model, PlannerConfig::default()).unwrap();
        let plan = planner.plan(&b).unwrap();
        for i in 0..b.len() {
            for j in 0..b.len() {
                if b[i][0] > b[j][0] {
                    prop_assert!(plan.draft_rows[i] >= plan.draft_rows[j]);
                }
            }
        }
    }

    #[test]
    fn split_never_exceeds_k(b in batch(), k in 0usize..50) {
        let rows = split(k, &b).unwrap();
        let total: usize = b.iter().map(Vec::len).sum();
        prop_assert_eq!(rows.iter().sum::<usize>(), k.min(total));
        assert_best_prefixes(&b, &rows)?;
    }

    #[test]
    fn early_stop_never_beats_full_and_matches_on_convex_curves(
        (b, model) in batch().prop_flat_map(|b| { let n = max_rows(&b); (Just(b), convex_table(n)) }),
        jagged in jagged_table(80),
    ) {
        let greedy_cfg = PlannerConfig { search: Search::EarlyStop, ..PlannerConfig::default() };
        let full = Planner::new(model.clone(), PlannerConfig::default()).unwrap().plan(&b).unwrap();
        let greedy = Planner::new(model, greedy_cfg).unwrap().plan(&b).unwrap();
        prop_assert!(value(&greedy) >= value(&full) * (1.0 - 1e-9),
            "convex: greedy {} < full {}", value(&greedy), value(&full));
        if b.len() <= 80 {
            let full = Planner::new(jagged.clone(), PlannerConfig::default()).unwrap().plan(&b);
            let greedy = Planner::new(jagged, greedy_cfg).unwrap().plan(&b);
            if let (Ok(full), Ok(greedy)) = (full, greedy) {
                prop_assert!(value(&greedy) <= value(&full));
            }
        }
    }

    #[test]
    fn caps_are_respected((b, model) in batch_and_table(), cap in 1usize..40, per in 0usize..4) {
        let config = PlannerConfig {
            max_total_rows: Some(cap),
            max_drafts_per_request: Some(per),
            ..PlannerConfig::default()
        };
        let mut planner = Planner::new(model, config).unwrap();
        match planner.plan(&b) {
            Ok(plan) => {
                prop_assert!(plan.total_rows <= cap);
                prop_assert!(plan.draft_rows.iter().all(|&d| d <= per));
            }
            Err(e) => prop_assert!(b.len() > cap, "unexpected {e}"),
        }
    }
}
