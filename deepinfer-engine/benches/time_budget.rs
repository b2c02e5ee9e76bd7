//! Time-budgeted chunked prefill on the embedded default model: 32 requests decode while a
//! 4,000-token prompt is prefilled alongside. Prints the decode-only step time and, without
//! and with `step_time_budget_ms` (1.4 × the decode-only step, or `DEEPINFER_BUDGET_FACTOR`
//! ×), the p99 of the steps that hold decode rows (the step time a decoding request sees)
//! and of all steps, each run back to back in this process.
//!
//! `cargo bench -p deepinfer-engine --bench time_budget`

use deepinfer_engine::runtime::{
    Engine, EngineConfig, GenParams, Request, StepRecord, StepTimes, load_default,
};
use deepinfer_kernels::CpuBackend;

fn requests(long: bool) -> Vec<Request> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut tok = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % 90_000) as u32 + 100
    };
    let mut reqs: Vec<Request> = (0..32u64)
        .map(|i| {
            let mut p = GenParams::greedy(48);
            p.stop_at_eos = false;
            Request::new(i, (0..16).map(|_| tok()).collect(), p)
        })
        .collect();
    if long {
        let mut p = GenParams::greedy(2);
        p.stop_at_eos = false;
        reqs.push(Request::new(99, (0..4000).map(|_| tok()).collect(), p));
    }
    reqs
}

/// Step times after the first (the short prompts' prefill).
fn run(budget: Option<f64>, long: bool) -> Vec<StepRecord> {
    let model = load_default(CpuBackend::new()).expect("the embedded default model");
    let mut e = Engine::new(
        model,
        EngineConfig {
            prefix_caching: false,
            step_time_budget_ms: budget,
            ..EngineConfig::default()
        },
    )
    .expect("engine");
    e.generate(requests(long)).expect("generate");
    e.step_history()[1..].to_vec()
}

fn report(label: &str, steps: &[StepRecord], t: f64) {
    let decode = StepTimes::of_steps(steps, |s| s.decode_rows > 0);
    let all = StepTimes::of_steps(steps, |_| true);
    println!(
        "{label}: decode steps p99 {:.2} ms ({:.2}x), max {:.2} ms, {} steps; all steps p99 {:.2} ms ({:.2}x), max {:.2} ms, {} steps",
        decode.p99,
        decode.p99 / t,
        decode.max,
        decode.steps,
        all.p99,
        all.p99 / t,
        all.max,
        all.steps
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let decode_only = StepTimes::of_steps(&run(None, false), |_| true);
    let t = decode_only.p50;
    let without = run(None, true);
    // DEEPINFER_BUDGET_FACTOR: the budget as a multiple of the decode-only step (1.4).
    let factor: f64 = std::env::var("DEEPINFER_BUDGET_FACTOR")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.4);
    let budget = factor * t;
    let with = run(Some(budget), true);
    println!("decode-only step: p50 {t:.2} ms (32 rows)");
    report("with a 4,000-token prompt, no budget", &without, t);
    report(
        &format!("with a 4,000-token prompt, budget {budget:.2} ms"),
        &with,
        t,
    );
}
