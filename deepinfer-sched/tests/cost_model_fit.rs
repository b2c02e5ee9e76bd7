//! The cost-model fit recovers known coefficients from noisy step times.

use deepinfer_sched::{
    CoefficientBounds, CostCoefficients, PrefillCostModel, StepFeatures, StepSample,
};

/// SplitMix64: a tiny deterministic generator so the test needs no RNG crate.
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
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Standard normal by Box-Muller.
    fn normal(&mut self) -> f64 {
        let u = self.uniform().max(1e-300);
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

const TRUE: CostCoefficients = CostCoefficients {
    a: 1.5e-6,
    b: 2.0e-3,
    d: 5.0,
};

/// A step of a few chunks and decode rows, its true time plus 2% multiplicative noise.
fn sample(rng: &mut Rng, truth: &CostCoefficients) -> StepSample {
    let mut f = StepFeatures::default();
    for _ in 0..1 + rng.below(3) {
        f.add(1 + rng.below(4096) as usize, rng.below(32_768) as usize);
    }
    for _ in 0..rng.below(64) {
        f.add(1, rng.below(16_384) as usize);
    }
    let t = truth.step(&f);
    StepSample {
        features: f,
        time: t * (1.0 + 0.02 * rng.normal()),
    }
}

fn rel(x: f64, y: f64) -> f64 {
    (x - y).abs() / y.abs()
}

#[test]
fn batch_fit_recovers_coefficients() {
    let mut rng = Rng(42);
    let samples: Vec<StepSample> = (0..2000).map(|_| sample(&mut rng, &TRUE)).collect();
    let c = PrefillCostModel::fit(&samples, CoefficientBounds::default()).unwrap();
    assert!(rel(c.a, TRUE.a) < 0.03, "a {} vs {}", c.a, TRUE.a);
    assert!(rel(c.b, TRUE.b) < 0.05, "b {} vs {}", c.b, TRUE.b);
    assert!(rel(c.d, TRUE.d) < 0.10, "d {} vs {}", c.d, TRUE.d);
}

#[test]
fn online_fit_tracks_a_drift_and_stays_clamped() {
    let mut rng = Rng(7);
    let bounds = CoefficientBounds {
        a: (0.0, 1e-3),
        b: (0.0, 1.0),
        d: (1.0, 50.0),
    };
    let start = CostCoefficients {
        a: 1e-5,
        b: 1e-2,
        d: 1.0,
    };
    let mut m = PrefillCostModel::new(start, bounds, 0.99).unwrap();
    for _ in 0..1500 {
        m.observe(sample(&mut rng, &TRUE)).unwrap();
    }
    let c = m.coefficients();
    assert!(rel(c.a, TRUE.a) < 0.05, "a {} vs {}", c.a, TRUE.a);
    assert!(rel(c.b, TRUE.b) < 0.10, "b {} vs {}", c.b, TRUE.b);
    // The hardware gets slower: the forgetting factor lets the fit follow.
    let slow = CostCoefficients {
        a: TRUE.a * 2.0,
        b: TRUE.b * 2.0,
        d: TRUE.d,
    };
    for _ in 0..1500 {
        m.observe(sample(&mut rng, &slow)).unwrap();
    }
    let c = m.coefficients();
    assert!(rel(c.a, slow.a) < 0.05, "a {} vs {}", c.a, slow.a);
    // A burst of nonsense (near-zero times) must clamp at the bounds, never go negative.
    for _ in 0..2000 {
        let mut s = sample(&mut rng, &TRUE);
        s.time = 0.0;
        m.observe(s).unwrap();
    }
    let c = m.coefficients();
    assert!(c.a >= 0.0 && c.b >= 0.0 && c.d >= 1.0, "{c:?}");
}

#[test]
fn fitted_model_solves_the_time_budget() {
    let mut rng = Rng(3);
    let samples: Vec<StepSample> = (0..500).map(|_| sample(&mut rng, &TRUE)).collect();
    let c = PrefillCostModel::fit(&samples, CoefficientBounds::default()).unwrap();
    // Largest chunk that fits 60 ms over a 5k context, by the fitted model and by truth.
    let q_fit = c.max_chunk(5_000, 60.0 - c.d, 1 << 20);
    let q_true = TRUE.max_chunk(5_000, 60.0 - TRUE.d, 1 << 20);
    assert!(q_true > 1000, "{q_true}");
    assert!(
        rel(q_fit as f64, q_true as f64) < 0.05,
        "{q_fit} vs {q_true}"
    );
}
