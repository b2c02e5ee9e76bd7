//! Time-budgeted chunked prefill on the embedded default model: 32 requests decode while a
//! 4,000-token prompt is prefilled alongside. Prints the decode-only step time and the p99
//! step time of the mixed phase without and with `step_time_budget_ms` (1.4 × the
//! decode-only step, or `DEEPINFER_BUDGET_FACTOR` ×), each run back to back in this process.
//!
//! `cargo bench -p deepinfer-engine --bench time_budget`

use deepinfer_engine::runtime::{
    Engine, EngineConfig, GenParams, Request, StepTimes, load_default,
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
fn run(budget: Option<f64>, long: bool) -> Vec<f32> {
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
    e.step_time_history()[1..].to_vec()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let decode_only = StepTimes::of(&run(None, false));
    let t = decode_only.p50;
    let without = StepTimes::of(&run(None, true));
    // DEEPINFER_BUDGET_FACTOR: the budget as a multiple of the decode-only step (1.4).
    let factor: f64 = std::env::var("DEEPINFER_BUDGET_FACTOR")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.4);
    let budget = factor * t;
    let with = StepTimes::of(&run(Some(budget), true));
    println!("decode-only step: p50 {:.2} ms (32 rows)", t);
    println!(
        "with a 4,000-token prompt, no budget: p99 {:.2} ms ({:.2}x), max {:.2} ms, {} steps",
        without.p99,
        without.p99 / t,
        without.max,
        without.steps
    );
    println!(
        "with a 4,000-token prompt, budget {:.2} ms: p99 {:.2} ms ({:.2}x), max {:.2} ms, {} steps",
        budget,
        with.p99,
        with.p99 / t,
        with.max,
        with.steps
    );
}
