//! Scheduler simulator: Poisson arrivals, random prompt and output lengths, a
//! synthetic step-time model. Prints throughput and TTFT / TPOT / queue-time
//! percentiles with and without the prefill time budget, and the worst step
//! time of decode steps that ran while one very long prompt was prefilled.
//!
//! The step-time model is synthetic (`a·q·(q+c) + b·(q+c) + d` with made-up
//! coefficients); nothing here ran on a GPU. The scheduler starts with a wrong
//! cost model and refits it online from the simulated step times.
//!
//! `cargo run --release -p deepinfer-sched --example serving_sim -- [rate_per_s] [seconds] [budget_ms]`

use std::collections::HashMap;

use deepinfer_kv::{BlockManager, BlockManagerConfig};
use deepinfer_sched::{
    CoefficientBounds, CostCoefficients, NewRequest, PrefillCostModel, Scheduler, SchedulerConfig,
    StepOutput,
};

/// SplitMix64 random numbers.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn exp(&mut self, mean: f64) -> f64 {
        -mean * self.uniform().ln()
    }
    fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * self.uniform()).cos()
    }
    /// Log-normal length with the given median, clamped.
    fn length(&mut self, median: f64, sigma: f64, lo: usize, hi: usize) -> usize {
        ((median * (sigma * self.normal()).exp()) as usize).clamp(lo, hi)
    }
}

/// The "hardware": true step-time coefficients (ms).
const TRUE: CostCoefficients = CostCoefficients {
    a: 1e-6,
    b: 2e-5,
    d: 10.0,
    e: 0.02,
};

#[derive(Default, Clone)]
struct Track {
    arrival: f64,
    first_sched: Option<f64>,
    first_token: Option<f64>,
    finish: Option<f64>,
    outputs: usize,
}

struct Report {
    throughput: f64,
    ttft: Vec<f64>,
    tpot: Vec<f64>,
    queue: Vec<f64>,
    worst_mixed_step: f64,
    mixed_steps: usize,
    fitted: CostCoefficients,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn simulate(rate: f64, seconds: f64, budget: Option<f64>, seed: u64) -> Report {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 16_384,
        max_num_seqs: 256,
        max_model_len: 131_072,
        max_chunk_tokens: 16_384,
        step_time_budget: budget,
        ..Default::default()
    };
    let mut kv = BlockManagerConfig::new(40_000, 128);
    kv.watermark = 0.01;
    // Start from a deliberately wrong model; online refits fix it.
    let guess = CostCoefficients {
        a: 5e-6,
        b: 1e-3,
        d: 1.0,
        e: 0.0,
    };
    let model = PrefillCostModel::new(guess, CoefficientBounds::default(), 0.98).unwrap();
    let mut s = Scheduler::new(cfg, BlockManager::new(kv).unwrap())
        .unwrap()
        .with_cost_model(model);
    let mut rng = Rng(seed);
    let mut arrivals = Vec::new();
    let mut t = 0.0;
    let mut id = 0u64;
    while t < seconds * 1000.0 {
        t += rng.exp(1000.0 / rate);
        let p = rng.length(1500.0, 0.8, 16, 16_000);
        let o = rng.length(200.0, 0.7, 4, 2000);
        arrivals.push((t, NewRequest::new(id, vec![(id % 1000) as u32 + 5; p], o)));
        id += 1;
    }
    // One very long prompt a third of the way in.
    let long_id = id;
    arrivals.push((
        seconds * 1000.0 / 3.0,
        NewRequest::new(long_id, vec![3; 100_000], 16),
    ));
    arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));

    let mut track: HashMap<u64, Track> = HashMap::new();
    let mut now = 0.0f64;
    let mut next_arrival = 0;
    let mut out = StepOutput::default();
    let mut tokens_out = 0usize;
    let mut worst_mixed = 0.0f64;
    let mut mixed_steps = 0;
    loop {
        while next_arrival < arrivals.len() && arrivals[next_arrival].0 <= now {
            let (at, r) = arrivals[next_arrival].clone();
            track.insert(
                r.id,
                Track {
                    arrival: at,
                    ..Default::default()
                },
            );
            s.add_request(r).unwrap();
            next_arrival += 1;
        }
        if s.is_idle() {
            if next_arrival == arrivals.len() {
                break;
            }
            now = arrivals[next_arrival].0;
            continue;
        }
        let plan = s.schedule().unwrap();
        // True step time with 3% noise.
        let mut ms = TRUE.d;
        for c in &plan.prefill {
            ms += if c.samples {
                TRUE.sampling_chunk(c.len, c.start)
            } else {
                TRUE.chunk(c.len, c.start)
            };
        }
        for d in &plan.decode {
            ms += TRUE.chunk(1 + d.drafts, d.position) + TRUE.e * (1 + d.drafts) as f64;
        }
        ms *= 1.0 + 0.03 * rng.normal();
        if !plan.decode.is_empty() && plan.prefill.iter().any(|c| c.request == long_id) {
            worst_mixed = worst_mixed.max(ms);
            mixed_steps += 1;
        }
        out.clear(plan.step);
        for c in &plan.prefill {
            let tr = track.get_mut(&c.request).unwrap();
            tr.first_sched.get_or_insert(now);
            if c.samples {
                out.push(c.request, &[1], false);
            } else {
                out.push(c.request, &[], false);
            }
        }
        for d in &plan.decode {
            out.push(d.request, &[1], false);
        }
        out.step_ms = Some(ms);
        now += ms;
        for c in &plan.prefill {
            if c.samples {
                let tr = track.get_mut(&c.request).unwrap();
                tr.first_token.get_or_insert(now);
            }
        }
        tokens_out += out.tokens.len();
        let res = s.update(&out).unwrap();
        for f in res.finished {
            let tr = track.get_mut(&f.id).unwrap();
            tr.finish = Some(now);
            tr.outputs = f.output().len();
        }
    }
    let mut ttft = Vec::new();
    let mut tpot = Vec::new();
    let mut queue = Vec::new();
    for tr in track.values() {
        if let (Some(fs), Some(ft), Some(fin)) = (tr.first_sched, tr.first_token, tr.finish) {
            queue.push(fs - tr.arrival);
            ttft.push(ft - tr.arrival);
            if tr.outputs > 1 {
                tpot.push((fin - ft) / (tr.outputs - 1) as f64);
            }
        }
    }
    Report {
        throughput: tokens_out as f64 / (now / 1000.0),
        ttft,
        tpot,
        queue,
        worst_mixed_step: worst_mixed,
        mixed_steps,
        fitted: s.cost_model().unwrap().coefficients(),
    }
}

fn main() {
    let args: Vec<f64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rate = args.first().copied().unwrap_or(3.0);
    let seconds = args.get(1).copied().unwrap_or(120.0);
    let budget = args.get(2).copied().unwrap_or(40.0);
    println!(
        "Poisson arrivals {rate}/s for {seconds} s, prompts log-normal (median 1500), outputs log-normal (median 200),"
    );
    println!(
        "plus one 100,000-token prompt at t = {:.0} s. Synthetic step time: a={:e} b={:e} d={} e={} ms.",
        seconds / 3.0,
        TRUE.a,
        TRUE.b,
        TRUE.d,
        TRUE.e
    );
    println!();
    println!(
        "{:<14} {:>10} {:>9} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9} {:>14}",
        "mode",
        "tok/s",
        "TTFT p50",
        "TTFT p90",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99",
        "queue p50",
        "queue p99",
        "worst mixed ms"
    );
    for (name, b) in [("no budget", None), ("time budget", Some(budget))] {
        let mut r = simulate(rate, seconds, b, 42);
        let label = match b {
            Some(v) => format!("{name} {v}"),
            None => name.to_string(),
        };
        println!(
            "{:<14} {:>10.0} {:>9.0} {:>9.0} {:>9.0} {:>8.1} {:>8.1} {:>9.0} {:>9.0} {:>9.1} ({:>3})",
            label,
            r.throughput,
            pct(&mut r.ttft, 0.5),
            pct(&mut r.ttft, 0.9),
            pct(&mut r.ttft, 0.99),
            pct(&mut r.tpot, 0.5),
            pct(&mut r.tpot, 0.99),
            pct(&mut r.queue, 0.5),
            pct(&mut r.queue, 0.99),
            r.worst_mixed_step,
            r.mixed_steps
        );
        {
            println!(
                "  online fit after the run: a={:.3e} b={:.3e} d={:.2} e={:.3} (true a={:e} b={:e} d={} e={})",
                r.fitted.a, r.fitted.b, r.fitted.d, r.fitted.e, TRUE.a, TRUE.b, TRUE.d, TRUE.e
            );
        }
    }
    println!();
    println!(
        "times in ms; 'worst mixed' = slowest step that ran decode rows next to a chunk of the long prompt (count in brackets)."
    );
}
