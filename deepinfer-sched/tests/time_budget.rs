//! Time-budgeted chunked prefill keeps decode steps bounded while a long prompt is prefilled.

use deepinfer_sched::testing::*;
use deepinfer_sched::{
    CoefficientBounds, CostCoefficients, PrefillCostModel, SchedulerConfig, StepPlan,
};

const COEF: CostCoefficients = CostCoefficients {
    a: 2e-6,
    b: 1e-3,
    d: 4.0,
};

fn run_with(budget: Option<f64>) -> Vec<StepPlan> {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 16_384,
        max_num_seqs: 64,
        max_model_len: 65_536,
        max_chunk_tokens: 16_384,
        step_time_budget: budget,
        ..Default::default()
    };
    let model = PrefillCostModel::new(COEF, CoefficientBounds::default(), 1.0).unwrap();
    let mut s = scheduler(cfg, 4096, 16).with_cost_model(model);
    // Eight short requests reach decode, then a 32k-token prompt arrives.
    for id in 1..=8 {
        s.add_request(req(id, 64, 40)).unwrap();
    }
    let mut plans = Vec::new();
    for _ in 0..3 {
        let p = s.schedule().unwrap();
        s.update(&run(&p, &s)).unwrap();
        plans.push(p);
    }
    s.add_request(req(100, 32_000, 2)).unwrap();
    let (_, more) = drive_sync(&mut s, 500);
    plans.extend(more);
    plans
}

#[test]
fn budget_bounds_steps_that_mix_decode_and_prefill() {
    let budget = 40.0;
    let with = run_with(Some(budget));
    let without = run_with(None);
    let mixed = |p: &StepPlan| !p.decode.is_empty() && p.prefill.iter().any(|c| c.request == 100);
    let worst = |ps: &[StepPlan]| {
        ps.iter()
            .filter(|p| mixed(p))
            .map(|p| p.predicted_ms.unwrap())
            .fold(0.0, f64::max)
    };
    assert!(with.iter().any(mixed));
    // Every step stays within the budget (the progress floor never triggers here).
    for p in &with {
        assert!(
            p.predicted_ms.unwrap() <= budget + 1e-9,
            "{:?}",
            p.predicted_ms
        );
    }
    // Without the budget the long prompt's chunks stretch decode steps far beyond it.
    assert!(worst(&without) > 3.0 * budget, "{}", worst(&without));
    assert!(worst(&with) <= budget);
}
