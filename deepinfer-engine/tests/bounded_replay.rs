//! Bounded replay (`EngineConfig::bounded_replay`): a prefix hit whose window state is not
//! stored resumes from a windowless state and replays only the last window of tokens. The
//! windowless state holds exactly the entries a real one does; the drift against exact mode
//! (which recomputes from position 0 here), max |Δ logit| and greedy agreement, is measured
//! on both fixtures and the embedded model and must stay within what the engine README
//! states.
#![cfg(feature = "runtime")]

mod common;
use common::prompt;
use deepinfer_engine::runtime::{Engine, EngineConfig, GenParams, Output, Request, load_default};
use deepinfer_engine::{BatchItem, Logits, Model};
use deepinfer_kernels::CpuBackend;

/// What the engine README states for the embedded model: greedy tokens agree on at least
/// this fraction of positions (the fixtures' random weights have near-tied logits, so their
/// agreement is reported, not bounded).
const MIN_AGREEMENT_EMBEDDED: f64 = 0.9;
/// And the most any logit after the hit moves, per model (measured, with headroom).
const MAX_LOGIT_SHIFT: [(&str, f32); 3] = [
    ("v41-tiny-dev", 6.0),
    ("v4-tiny-dev", 8.0),
    ("embedded", 4.0),
];

fn fixture(name: &str) -> Model<CpuBackend> {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    Model::load(&dir, CpuBackend::batch_invariant()).expect("fixture loads")
}

#[test]
fn a_windowless_state_holds_the_entries_of_a_real_one() {
    for name in ["v41-tiny-dev", "v4-tiny-dev"] {
        let m = fixture(name);
        let bt = m.global_block_tokens();
        for q in [bt, 2 * bt, 5 * bt] {
            let toks = prompt(3, q);
            let mut real = m.new_state();
            m.forward(
                &mut [BatchItem {
                    state: &mut real,
                    tokens: &toks,
                }],
                Logits::Last,
                None,
            )
            .unwrap();
            let w = m.windowless_state(&toks).unwrap();
            assert_eq!(w.global_entries(), real.global_entries(), "{name} at {q}");
            assert_eq!((w.pos, &w.history), (q, &toks));
            assert!(w.window.iter().all(Option::is_none));
        }
        // A position inside a compressed group has no windowless state.
        assert!(m.windowless_state(&prompt(3, bt + 1)).is_err());
    }
}

/// `pairs` prompts sharing a prefix of `shared` tokens, each after a first prompt with the
/// same prefix and a long tail of its own (its stored state lies past the second one's hit),
/// greedy with log-probabilities. Returns the second prompts' outputs and the engine.
fn second_prompts<F: Fn() -> Model<CpuBackend>>(
    load: &F,
    bounded_replay: bool,
    shared: usize,
    pairs: u64,
) -> (Vec<Output>, Engine<CpuBackend>) {
    let mut e = Engine::new(
        load(),
        EngineConfig {
            bounded_replay,
            prefix_state_interval: 0,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let params = || {
        let mut g = GenParams::greedy(12);
        g.stop_at_eos = false;
        g.logprobs = true;
        g
    };
    let mut outs = Vec::new();
    for i in 0..pairs {
        let head = prompt(100 + i, shared);
        let first = [head.clone(), prompt(200 + i, 96)].concat();
        let second = [head, prompt(300 + i, 20)].concat();
        e.generate(vec![Request::new(2 * i, first, params())])
            .unwrap();
        outs.extend(
            e.generate(vec![Request::new(2 * i + 1, second, params())])
                .unwrap(),
        );
    }
    (outs, e)
}

/// Fraction of greedy positions that agree before each output's first divergence.
fn agreement(exact: &[Output], bounded: &[Output]) -> f64 {
    let (mut agree, mut total) = (0usize, 0usize);
    for (a, b) in exact.iter().zip(bounded) {
        total += a.token_ids.len();
        agree += a
            .token_ids
            .iter()
            .zip(&b.token_ids)
            .take_while(|(x, y)| x == y)
            .count();
    }
    agree as f64 / total as f64
}

/// Max |Δ logit| over the `after` positions following a hit at `hit` tokens: exact forward
/// against a state with the hit's entries but no window state (no window rows, compressor
/// rows or drafter windows), its last window replayed.
fn logit_shift(m: &Model<CpuBackend>, hit: usize, after: usize, seed: u64) -> f32 {
    let toks = prompt(seed, hit + after);
    let mut exact = m.new_state();
    let want = m
        .forward(
            &mut [BatchItem {
                state: &mut exact,
                tokens: &toks,
            }],
            Logits::All,
            None,
        )
        .unwrap()
        .remove(0);
    let mut st = m.new_state();
    m.forward(
        &mut [BatchItem {
            state: &mut st,
            tokens: &toks[..hit],
        }],
        Logits::Last,
        None,
    )
    .unwrap();
    st.drop_window();
    for c in st
        .compressor
        .iter_mut()
        .chain(st.index_compressor.iter_mut())
    {
        *c = Default::default();
    }
    let w = m.cfg.sliding_window.min(hit);
    m.rebuild_window(&mut st, &toks[hit - w..hit]).unwrap();
    let got = m
        .forward(
            &mut [BatchItem {
                state: &mut st,
                tokens: &toks[hit..],
            }],
            Logits::All,
            None,
        )
        .unwrap()
        .remove(0);
    let v = m.cfg.vocab_size;
    got.iter()
        .zip(&want[hit * v..])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

fn measure<F: Fn() -> Model<CpuBackend>>(what: &str, load: F, shared: usize) -> f64 {
    let (exact, ex) = second_prompts(&load, false, shared, 4);
    let (bounded, bo) = second_prompts(&load, true, shared, 4);
    let (me, mb) = (ex.metrics(), bo.metrics());
    assert_eq!(me.bounded_replays, 0);
    assert_eq!(
        mb.bounded_replays, 4,
        "{what}: every second prompt resumed bounded"
    );
    assert!(
        mb.replayed_tokens < me.replayed_tokens,
        "{what}: bounded replayed {} tokens, exact {}",
        mb.replayed_tokens,
        me.replayed_tokens
    );
    let m = load();
    let bt = m.global_block_tokens();
    let shift = (0..3)
        .map(|s| logit_shift(&m, 4 * bt, 16, 40 + s))
        .fold(0.0, f32::max);
    let agree = agreement(&exact, &bounded);
    eprintln!(
        "{what}: bounded replay vs exact: greedy agreement {agree:.3}, max |Δ logit| {shift:.3e} after a {}-token hit; replayed tokens {} vs {}",
        4 * bt,
        mb.replayed_tokens,
        me.replayed_tokens
    );
    let bound = MAX_LOGIT_SHIFT.iter().find(|(n, _)| *n == what).unwrap().1;
    assert!(shift <= bound, "{what}: |Δ logit| {shift} above {bound}");
    agree
}

#[test]
fn bounded_replay_drift_on_the_fixtures_stays_within_the_stated_bound() {
    for name in ["v41-tiny-dev", "v4-tiny-dev"] {
        measure(name, || fixture(name), 120);
    }
}

#[test]
fn bounded_replay_drift_on_the_embedded_model_stays_within_the_stated_bound() {
    let agree = measure(
        "embedded",
        || load_default(CpuBackend::batch_invariant()).unwrap(),
        300,
    );
    assert!(agree >= MIN_AGREEMENT_EMBEDDED, "agreement {agree}");
}
