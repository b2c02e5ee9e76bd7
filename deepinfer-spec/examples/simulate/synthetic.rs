//! The simulator's synthetic world: a step-time curve, a drafter/acceptance model and the
//! sweep. Every figure it produces is synthetic; nothing here was measured on hardware.
//!
//! Assumptions, each chosen to be plausible for an MoE decode step on one device, not fitted to
//! any published number:
//!
//! * **Step time** ([`StepCurve`]) is a roofline over the step's rows `B`: a fixed overhead plus
//!   the larger of a memory term and a compute term. Memory: dense weights and KV are read once
//!   per step; expert weights are read for every expert that at least one row routes to, and with
//!   `k` of `E` experts per row the expected touched fraction is `1 − (1 − k/E)^B`, so memory time
//!   rises steeply for small batches and saturates. Compute: proportional to rows padded to the
//!   GEMM tile (64 rows), which makes the curve a jagged staircase once compute-bound.
//! * **Acceptance** ([`AcceptanceModel`]): each request has a latent quality (logit-normal);
//!   the conditional acceptance of draft `i` falls mildly with depth and varies token to token.
//!   The drafter sees that probability through logit noise, so its confidences are informative
//!   but imperfectly calibrated. Requests finish after a geometric number of steps and are
//!   replaced by fresh ones.
//! * **Budgeted overhead**: budgeted verification gives requests different draft counts, so the
//!   verify step runs ragged kernels and the host plans every step; this is charged as a fixed
//!   `ragged_overhead_ms` per step. It is the only thing that can make budgeted slower than
//!   fixed-5 when the planner keeps every draft, which is why the table also prints the gain
//!   without it.
//!
//! Both modes see the same random draws (common random numbers): identical confidences and
//! identical accept/reject coins, so the difference is the verification policy alone.

use deepinfer_spec::{Outcome, Plan, Planner, PlannerConfig, StepTimeModel, TemperatureScaling};

/// SplitMix64: small, deterministic, good enough for a simulation.
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Synthetic per-device step time as a function of rows.
#[derive(Debug, Clone)]
pub struct StepCurve {
    /// Launches, collectives, sampling: paid every step (ms).
    pub overhead_ms: f64,
    /// Dense weights, attention and KV reads (ms).
    pub dense_ms: f64,
    /// Reading every local expert's weights once (ms).
    pub experts_ms: f64,
    /// Routed experts per row.
    pub top_k: f64,
    /// Experts in the model.
    pub experts: f64,
    /// Compute per row once compute-bound (ms).
    pub ms_per_row: f64,
    /// GEMM tile rows (compute pads to a multiple).
    pub tile: usize,
}

impl Default for StepCurve {
    fn default() -> Self {
        Self {
            overhead_ms: 4.0,
            dense_ms: 6.0,
            experts_ms: 10.0,
            top_k: 8.0,
            experts: 256.0,
            ms_per_row: 0.045,
            tile: 64,
        }
    }
}

impl StepCurve {
    /// Step time for `rows` rows (ms).
    pub fn ms(&self, rows: usize) -> f64 {
        let touched = 1.0 - (1.0 - self.top_k / self.experts).powi(rows as i32);
        let memory = self.dense_ms + self.experts_ms * touched;
        let padded = rows.div_ceil(self.tile) * self.tile;
        let compute = self.ms_per_row * padded as f64;
        self.overhead_ms + memory.max(compute)
    }

    /// The table a profiler would record: the curve sampled every `every` rows up to `max`.
    pub fn profile(&self, every: usize, max: usize) -> StepTimeModel {
        let points: Vec<(usize, f64)> = (1..=max.div_ceil(every))
            .map(|i| (i * every, self.ms(i * every)))
            .collect();
        StepTimeModel::linear(&points).expect("positive, increasing profile")
    }
}

/// Synthetic drafter and target acceptance.
#[derive(Debug, Clone)]
pub struct AcceptanceModel {
    /// Mean of a request's quality logit.
    pub mean_logit: f64,
    /// Spread of quality across requests (logit sd).
    pub request_sd: f64,
    /// Conditional acceptance falls by this much logit per draft depth.
    pub depth_decay: f64,
    /// Token-to-token variation (logit sd).
    pub token_sd: f64,
    /// Drafter's estimation noise on the true logit (sd).
    pub drafter_sd: f64,
    /// Mean request lifetime in steps.
    pub mean_life_steps: f64,
}

impl Default for AcceptanceModel {
    fn default() -> Self {
        Self {
            mean_logit: 1.6,
            request_sd: 1.0,
            depth_decay: 0.25,
            token_sd: 1.0,
            drafter_sd: 0.6,
            mean_life_steps: 300.0,
        }
    }
}

/// Simulation settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Drafts the MTP drafter proposes per request (fixed mode verifies all of them).
    pub drafts: usize,
    /// Measured steps per load.
    pub steps: usize,
    /// Steps (fixed-n verification) used to fit temperature scaling before measuring.
    pub warmup_steps: usize,
    /// Extra cost of a budgeted (ragged) step (ms).
    pub ragged_overhead_ms: f64,
    /// Random seed.
    pub seed: u64,
    /// Step-time curve.
    pub curve: StepCurve,
    /// Acceptance model.
    pub acceptance: AcceptanceModel,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            drafts: 5,
            steps: 2000,
            warmup_steps: 200,
            ragged_overhead_ms: 0.3,
            seed: 42,
            curve: StepCurve::default(),
            acceptance: AcceptanceModel::default(),
        }
    }
}

/// One line of the sweep.
#[derive(Debug, Clone)]
pub struct Row {
    /// Requests per device.
    pub load: usize,
    /// Fixed-n tokens per ms.
    pub fixed_tpm: f64,
    /// Budgeted tokens per ms (ragged overhead charged).
    pub budgeted_tpm: f64,
    /// Budgeted tokens per ms without the ragged overhead.
    pub budgeted_free_tpm: f64,
    /// Mean drafts verified per request, budgeted.
    pub mean_drafts: f64,
    /// Mean fixed-n step time (ms).
    pub fixed_ms: f64,
    /// Mean budgeted step time, overhead included (ms).
    pub budgeted_ms: f64,
    /// Mean accepted drafts per request per step, fixed-n.
    pub fixed_accepted: f64,
}

struct Request {
    quality: f64,
}

fn new_request(m: &AcceptanceModel, rng: &mut Rng) -> Request {
    Request {
        quality: m.mean_logit + m.request_sd * rng.normal(),
    }
}

/// One step's draws for one request: drafter confidences and the accepted length if every
/// draft were verified.
fn draw(
    m: &AcceptanceModel,
    req: &Request,
    drafts: usize,
    rng: &mut Rng,
    conf: &mut Vec<f64>,
) -> usize {
    conf.clear();
    let mut accepted = drafts;
    for i in 0..drafts {
        let logit = req.quality - m.depth_decay * i as f64 + m.token_sd * rng.normal();
        conf.push(sigmoid(logit + m.drafter_sd * rng.normal()));
        let accept = rng.uniform() < sigmoid(logit);
        if !accept && accepted == drafts {
            accepted = i;
        }
    }
    accepted
}

/// Runs fixed-n and budgeted verification side by side at `load` requests per device.
pub fn simulate(load: usize, cfg: &Config) -> Row {
    let m = &cfg.acceptance;
    let mut rng = Rng::new(cfg.seed ^ (load as u64).wrapping_mul(0x100_0000_01B3));
    let mut requests: Vec<Request> = (0..load).map(|_| new_request(m, &mut rng)).collect();
    let mut confs: Vec<Vec<f64>> = vec![Vec::new(); load];
    let mut accepted = vec![0usize; load];
    let retire = 1.0 / m.mean_life_steps;

    let mut step = |requests: &mut Vec<Request>, rng: &mut Rng, confs: &mut Vec<Vec<f64>>| {
        for (r, req) in requests.iter_mut().enumerate() {
            if rng.uniform() < retire {
                *req = new_request(m, rng);
            }
            accepted[r] = draw(m, req, cfg.drafts, rng, &mut confs[r]);
        }
        accepted.clone()
    };

    // Warm-up: verify every draft (fixed-n), collect outcomes, fit temperature scaling.
    let mut outcomes = Vec::with_capacity(cfg.warmup_steps * load);
    for _ in 0..cfg.warmup_steps {
        let acc = step(&mut requests, &mut rng, &mut confs);
        for (c, &a) in confs.iter().zip(&acc) {
            outcomes.push(Outcome::new(c.clone(), a));
        }
    }
    let scaling =
        TemperatureScaling::fit(&outcomes, 10).unwrap_or_else(|_| TemperatureScaling::identity());

    let max_rows = load * (cfg.drafts + 1);
    let mut planner = Planner::new(cfg.curve.profile(16, max_rows), PlannerConfig::default())
        .expect("valid planner config");
    let mut plan = Plan::default();
    let (mut fixed_tokens, mut fixed_ms) = (0.0, 0.0);
    let (mut bud_tokens, mut bud_ms, mut bud_drafts) = (0.0, 0.0, 0usize);
    let mut fixed_acc = 0usize;
    for _ in 0..cfg.steps {
        let acc = step(&mut requests, &mut rng, &mut confs);
        // Fixed-n: every draft verified.
        fixed_tokens += (load + acc.iter().sum::<usize>()) as f64;
        fixed_acc += acc.iter().sum::<usize>();
        fixed_ms += cfg.curve.ms(max_rows);
        // Budgeted: plan on calibrated confidences, verify the chosen prefixes.
        for c in confs.iter_mut() {
            scaling.apply(c);
        }
        planner.plan_into(&confs, &mut plan).expect("valid batch");
        let got: usize = acc
            .iter()
            .zip(&plan.draft_rows)
            .map(|(&a, &d)| a.min(d))
            .sum();
        bud_tokens += (load + got) as f64;
        let ms = cfg.curve.ms(plan.total_rows) + cfg.ragged_overhead_ms;
        bud_ms += ms;
        bud_drafts += plan.total_drafts();
        planner
            .observe(plan.total_rows, ms)
            .expect("measured step in range");
    }
    let steps = cfg.steps as f64;
    Row {
        load,
        fixed_tpm: fixed_tokens / fixed_ms,
        budgeted_tpm: bud_tokens / bud_ms,
        budgeted_free_tpm: bud_tokens / (bud_ms - cfg.ragged_overhead_ms * steps),
        mean_drafts: bud_drafts as f64 / (steps * load as f64),
        fixed_ms: fixed_ms / steps,
        budgeted_ms: bud_ms / steps,
        fixed_accepted: fixed_acc as f64 / (steps * load as f64),
    }
}
