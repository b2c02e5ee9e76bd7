//! Property tests of the planner, `split` and fixed-length mode.

use deepinfer_spec::testing::{
    batch, batch_and_table, check_best_prefixes, check_plan, convex_table, jagged_table, max_rows,
    running_products as products,
};
use deepinfer_spec::{Plan, Planner, PlannerConfig, Search, fixed_length, split};
use proptest::prelude::*;

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
        // Best prefixes, total rows, expected tokens and predicted time.
        check_plan(&b, &model, &plan).map_err(TestCaseError::fail)?;
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
        check_best_prefixes(&b, &rows).map_err(TestCaseError::fail)?;
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
