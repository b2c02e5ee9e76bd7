//! Calibration metrics, temperature scaling and acceptance statistics on synthetic drafters.

use deepinfer_spec::testing::outcome;
use deepinfer_spec::{
    AcceptanceStats, Outcome, SpecError, TemperatureScaling, auroc, calibration_report,
    tokens_per_step_geometric, tokens_per_step_linear,
};
use proptest::prelude::*;

struct Rng(u64);
impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// A drafter whose confidences are `σ(scale · logit(p))` of the true conditional acceptance
/// `p`: calibrated for `scale = 1`, overconfident for `scale > 1`.
fn outcomes(n: usize, drafts: usize, scale: f64, seed: u64) -> Vec<Outcome> {
    let mut rng = Rng(seed);
    (0..n)
        .map(|_| {
            let mut confs = Vec::with_capacity(drafts);
            let mut accepted = drafts;
            for i in 0..drafts {
                let logit = 4.0 * rng.uniform() - 1.5 - 0.3 * i as f64;
                confs.push(sigmoid(scale * logit));
                if accepted == drafts && rng.uniform() >= sigmoid(logit) {
                    accepted = i;
                }
            }
            Outcome::new(confs, accepted)
        })
        .collect()
}

#[test]
fn temperature_scaling_repairs_an_overconfident_drafter() {
    let train = outcomes(6000, 4, 2.5, 7);
    let test = outcomes(6000, 4, 2.5, 99);
    let raw = calibration_report(&test, 10).unwrap();
    let scaling = TemperatureScaling::fit(&train, 10).unwrap();
    let fixed = scaling.report(&test, 10).unwrap();
    assert_eq!(scaling.temperatures.len(), 4);
    // The true temperature is 2.5: the fitted ones land near it.
    for &t in &scaling.temperatures {
        assert!((1.8..3.4).contains(&t), "temperature {t}");
    }
    for (r, f) in raw.iter().zip(&fixed) {
        assert!(
            f.ece < 0.5 * r.ece,
            "position {}: {} vs {}",
            r.position,
            f.ece,
            r.ece
        );
        assert!(f.brier <= r.brier + 1e-3);
        assert_eq!(r.count, f.count);
    }
    // Position 0 is a monotone transform of the raw confidence: AUROC unchanged.
    assert!((raw[0].auroc.unwrap() - fixed[0].auroc.unwrap()).abs() < 1e-12);
}

#[test]
fn a_calibrated_drafter_stays_near_identity() {
    let train = outcomes(8000, 3, 1.0, 3);
    let scaling = TemperatureScaling::fit(&train, 10).unwrap();
    for &t in &scaling.temperatures {
        assert!((0.75..1.35).contains(&t), "temperature {t}");
    }
    let report = calibration_report(&train, 10).unwrap();
    for p in &report {
        assert!(p.ece < 0.03, "position {} ece {}", p.position, p.ece);
        assert!((p.mean_predicted - p.observed).abs() < 0.03);
    }
}

#[test]
fn statistics_readings_on_data() {
    let data = outcomes(5000, 5, 1.0, 11);
    let s = AcceptanceStats::from_outcomes(&data).unwrap();
    // Every outcome verified 5 drafts: the linear reading with the mean rate is exact.
    let linear = tokens_per_step_linear(5, s.mean_rate().unwrap()).unwrap();
    assert!((linear - s.tokens_per_step()).abs() < 1e-9);
    // The geometric reading needs the (larger) conditional rate; the equivalent constant rate
    // reproduces the measurement.
    assert!(s.conditional_rate().unwrap() > s.mean_rate().unwrap());
    let a = s.geometric_equivalent_rate().unwrap();
    assert!((tokens_per_step_geometric(5, a).unwrap() - s.tokens_per_step()).abs() < 1e-9);
    // Histogram and per-position counts agree.
    assert_eq!(s.accepted_length_histogram.iter().sum::<usize>(), 5000);
    let accepted: usize = s.per_position.iter().map(|p| p.accepted).sum();
    assert_eq!(accepted, s.accepted_drafts);
    for w in s.per_position.windows(2) {
        assert!(w[1].reached == w[0].accepted);
    }
}

#[test]
fn bad_outcomes_are_typed_errors() {
    assert_eq!(
        AcceptanceStats::from_outcomes(&[]).unwrap_err(),
        SpecError::NoSamples
    );
    assert_eq!(
        TemperatureScaling::fit(&[], 10).unwrap_err(),
        SpecError::NoSamples
    );
    assert!(matches!(
        calibration_report(&[Outcome::new(vec![0.5], 2)], 10),
        Err(SpecError::AcceptedTooLong {
            sample: 0,
            accepted: 2,
            drafts: 1
        })
    ));
    assert!(matches!(
        AcceptanceStats::from_outcomes(&[Outcome::new(vec![f64::NAN], 0)]),
        Err(SpecError::InvalidConfidence { .. })
    ));
    assert!(matches!(
        calibration_report(&[Outcome::new(vec![0.5], 0)], 0),
        Err(SpecError::InvalidConfig(_))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn scaling_preserves_order_at_each_position(
        data in prop::collection::vec(outcome(), 1..60),
        probes in prop::collection::vec(0.0..=1.0f64, 2..20),
    ) {
        let scaling = TemperatureScaling::fit(&data, 10).unwrap();
        for (pos, &t) in scaling.temperatures.iter().enumerate() {
            prop_assert!(t > 0.0);
            for &x in &probes {
                for &y in &probes {
                    if x < y {
                        prop_assert!(scaling.scale(pos, x) <= scaling.scale(pos, y));
                    }
                }
            }
        }
    }

    #[test]
    fn first_position_ece_never_worse_after_fit(data in prop::collection::vec(outcome(), 1..80)) {
        let scaling = TemperatureScaling::fit(&data, 10).unwrap();
        let raw = calibration_report(&data, 10).unwrap();
        let fitted = scaling.report(&data, 10).unwrap();
        if let (Some(r), Some(f)) = (raw.first(), fitted.first()) {
            prop_assert!(f.ece <= r.ece + 1e-12);
        }
        for p in &fitted {
            prop_assert!((0.0..=1.0).contains(&p.ece));
            prop_assert!((0.0..=1.0).contains(&p.brier));
            if let Some(a) = p.auroc { prop_assert!((0.0..=1.0).contains(&a)); }
        }
    }

    #[test]
    fn auroc_is_invariant_under_monotone_maps(
        pairs in prop::collection::vec((0.0..1.0f64, any::<bool>()), 2..50),
    ) {
        let (p, y): (Vec<f64>, Vec<bool>) = pairs.into_iter().unzip();
        let q: Vec<f64> = p.iter().map(|x| x * x).collect();
        prop_assert_eq!(auroc(&p, &y), auroc(&q, &y));
    }

    #[test]
    fn geometric_never_exceeds_linear_for_the_same_rate(n in 0usize..10, a in 0.0..=1.0f64) {
        prop_assert!(tokens_per_step_geometric(n, a).unwrap()
            <= tokens_per_step_linear(n, a).unwrap() + 1e-12);
    }
}
