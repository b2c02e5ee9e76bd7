//! Time-budgeted chunked prefill keeps decode steps bounded while a long prompt is prefilled.

use deepinfer_sched::testing::*;
use deepinfer_sched::{
    CoefficientBounds, CostCoefficients, PrefillCostModel, Scheduler, SchedulerConfig, StepPlan,
};

const COEF: CostCoefficients = CostCoefficients {
    a: 2e-6,
    b: 1e-3,
    d: 4.0,
    e: 0.5,
};

fn run_with(budget: Option<f64>) -> Vec<StepPlan> {
    run_model(COEF, budget)
}

/// A scheduler with room for a 32k-token prompt, the cost model `coef` and `budget`.
fn budgeted(coef: CostCoefficients, budget: Option<f64>) -> Scheduler {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 16_384,
        max_num_seqs: 64,
        max_model_len: 65_536,
        max_chunk_tokens: 16_384,
        step_time_budget: budget,
        ..Default::default()
    };
    let model = PrefillCostModel::new(coef, CoefficientBounds::default(), 1.0).unwrap();
    scheduler(cfg, 4096, 16).with_cost_model(model)
}

fn run_model(coef: CostCoefficients, budget: Option<f64>) -> Vec<StepPlan> {
    let mut s = budgeted(coef, budget);
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

/// A head-heavy model: a row that produces logits costs far more than a prefill token.
const HEAD_HEAVY: CostCoefficients = CostCoefficients {
    a: 2e-6,
    b: 1e-4,
    d: 4.0,
    e: 2.0,
};

/// The predicted time of a plan's decode rows: their tokens and their output rows.
fn decode_ms(coef: &CostCoefficients, p: &StepPlan) -> f64 {
    p.decode
        .iter()
        .map(|d| coef.chunk(1 + d.drafts, d.position) + coef.e * (1 + d.drafts) as f64)
        .sum()
}

#[test]
fn decode_rows_and_the_sampling_row_are_charged() {
    let budget = 40.0;
    let plans = run_model(HEAD_HEAVY, Some(budget));
    let mut mixed = 0;
    let mut finals = 0;
    for p in &plans {
        let Some(chunk) = p.prefill.iter().find(|c| c.request == 100) else {
            continue;
        };
        let dec = decode_ms(&HEAD_HEAVY, p);
        let chunk_ms = if chunk.samples {
            HEAD_HEAVY.sampling_chunk(chunk.len, chunk.start)
        } else {
            HEAD_HEAVY.chunk(chunk.len, chunk.start)
        };
        // The plan's prediction counts every output row: one per decode row, one
        // for a chunk that samples.
        let want = HEAD_HEAVY.d + dec + chunk_ms;
        let got = p.predicted_ms.unwrap();
        assert!(
            (got - want).abs() <= 1e-9 * want,
            "predicted {got} vs {want}"
        );
        assert!(got <= budget + 1e-9, "{got}");
        mixed += usize::from(!p.decode.is_empty());
        // The chunk is the largest that fits what the decode rows (output rows
        // included) left of the budget, its sampling row charged if it ends the prompt.
        let remaining = 32_000 - chunk.start;
        let cap = remaining.min(16_384 - p.decode.len());
        let left = budget - HEAD_HEAVY.d - dec;
        assert_eq!(
            chunk.len,
            HEAD_HEAVY.max_chunk_of(chunk.start, remaining, left, cap),
            "step {}",
            p.step
        );
        finals += usize::from(chunk.samples);
    }
    assert!(mixed > 3, "{mixed}");
    assert_eq!(finals, 1);
    // The same run with the output rows ignored (e folded away) takes longer
    // chunks next to the same decode rows: the rows' head cost is what shrinks them.
    let blind = CostCoefficients {
        e: 0.0,
        ..HEAD_HEAVY
    };
    let first_chunk = |ps: &[StepPlan]| {
        ps.iter()
            .find(|p| !p.decode.is_empty() && p.prefill.iter().any(|c| c.request == 100))
            .map(|p| p.prefill.iter().find(|c| c.request == 100).unwrap().len)
            .unwrap()
    };
    let blind_plans = run_model(blind, Some(budget));
    assert!(
        first_chunk(&plans) < first_chunk(&blind_plans),
        "{} vs {}",
        first_chunk(&plans),
        first_chunk(&blind_plans)
    );
}

/// A prompt that arrives while a step computes joins the plan made ahead with a chunk the
/// budget still has room for; a plan other than the last one made is an error.
#[test]
fn a_late_prompt_joins_the_plan_ahead_within_its_budget() {
    let budget = 40.0;
    let mut s = budgeted(COEF, Some(budget));
    let mut nothing = StepPlan::default();
    assert!(s.admit_into_planned(&mut nothing).is_err());
    for id in 1..=8 {
        s.add_request(req(id, 64, 40)).unwrap();
    }
    let first = s.schedule().unwrap();
    s.update(&run(&first, &s)).unwrap();
    // Step N computes; N+1 is planned ahead; then the prompt arrives.
    let mut running = s.schedule().unwrap();
    let mut ahead = s.schedule().unwrap();
    let before = ahead.predicted_ms.unwrap();
    s.add_request(req(100, 32_000, 2)).unwrap();
    assert!(s.admit_into_planned(&mut running).is_err());
    assert_eq!(s.admit_into_planned(&mut ahead).unwrap(), 1);
    let chunk = ahead.prefill.iter().find(|c| c.request == 100).unwrap();
    assert_eq!(chunk.start, 0);
    assert!(chunk.len > 0 && chunk.len < 32_000);
    let after = ahead.predicted_ms.unwrap();
    assert!(
        after > before && after <= budget + 1e-9,
        "{before} -> {after}"
    );
    assert_eq!(
        ahead.num_tokens,
        ahead.decode.len() + ahead.prefill.iter().map(|c| c.len).sum::<usize>()
    );
    // Nothing more waits: a second call admits nobody.
    assert_eq!(s.admit_into_planned(&mut ahead).unwrap(), 0);
    // The steps then run as usual, and every request finishes.
    let out = run(&running, &s);
    let res = s.update(&out).unwrap();
    res.apply_to(&mut ahead);
    let out = run(&ahead, &s);
    s.update(&out).unwrap();
    let (done, _) = drive_sync(&mut s, 500);
    assert!(done.iter().any(|f| f.id == 100));
    assert!(s.is_idle());
}
