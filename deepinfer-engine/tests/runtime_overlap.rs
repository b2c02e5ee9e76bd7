//! Overlapped scheduling against the in-order loop on the `v41-tiny-dev` fixture: the same
//! outputs (tokens, log-probabilities, finish reasons) with greedy and seeded sampling,
//! DSpark drafts, preemption under memory pressure, requests that stop early while the next
//! step is already planned, and aborts; the launch-phase check never trips in the overlapped
//! loop and trips on a deliberate device read; a pool small enough to preempt gives the
//! tokens of an ample one and one too small for a prompt is an error.
#![cfg(feature = "runtime")]

mod common;
use common::prompt;
use deepinfer_engine::model::sync::LaunchPhase;
use deepinfer_engine::runtime::{
    Engine, EngineConfig, FinishReason, GenParams, Output, Request, StreamEvent,
};
use deepinfer_engine::{BatchItem, Logits, Model, ModelError};
use deepinfer_kernels::CpuBackend;
use deepinfer_sample::SamplingParams;
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/v41-tiny-dev")
}

fn model() -> Model<CpuBackend> {
    Model::load(&fixture(), CpuBackend::batch_invariant()).expect("fixture loads")
}

fn engine(cfg: EngineConfig) -> Engine<CpuBackend> {
    Engine::new(model(), cfg).expect("engine")
}

fn params(i: u64, max_tokens: usize) -> GenParams {
    let greedy = i.is_multiple_of(3);
    GenParams {
        sampling: SamplingParams {
            temperature: if greedy { 0.0 } else { 0.8 },
            top_k: if greedy { 0 } else { 40 },
            seed: 1000 + i,
            top_logprobs: 1,
            ..SamplingParams::default()
        },
        max_tokens,
        logprobs: true,
        ..GenParams::default()
    }
}

/// A mixed batch: greedy and sampled, varied prompt and output lengths; a few requests stop
/// at a token they are likely to produce early (so they finish while a step is planned).
fn batch(n: u64) -> Vec<Request> {
    (0..n)
        .map(|i| {
            let mut p = params(i, 3 + (i as usize * 5) % 14);
            if i % 4 == 1 {
                // Every id of the top half of the vocabulary stops: ends within a few tokens.
                p.stop_token_ids = (256..512).collect();
            }
            Request::new(i, prompt(i + 1, 2 + (i as usize * 11) % 37), p)
        })
        .collect()
}

fn run(cfg: EngineConfig, reqs: Vec<Request>) -> (Vec<Output>, Engine<CpuBackend>) {
    let mut e = engine(cfg);
    let outs = e.generate(reqs).expect("generate");
    (outs, e)
}

fn assert_same(a: &[Output], b: &[Output]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.id, y.id);
        assert_eq!(x.token_ids, y.token_ids, "request {}", x.id);
        assert_eq!(x.logprobs, y.logprobs, "request {}", x.id);
        assert_eq!(x.finish_reason, y.finish_reason, "request {}", x.id);
        assert_eq!(x.usage, y.usage, "request {}", x.id);
    }
}

fn both(cfg: EngineConfig, reqs: Vec<Request>) -> (Vec<Output>, Engine<CpuBackend>) {
    let (serial, _) = run(
        EngineConfig {
            overlap: false,
            ..cfg.clone()
        },
        reqs.clone(),
    );
    let (over, e) = run(
        EngineConfig {
            overlap: true,
            sync_check: true,
            ..cfg
        },
        reqs,
    );
    assert_same(&serial, &over);
    (over, e)
}

#[test]
fn overlap_equals_in_order_greedy_and_sampled_with_early_stops() {
    let cfg = EngineConfig {
        block_size: 8,
        max_num_batched_tokens: 96,
        max_num_seqs: 12,
        ..EngineConfig::default()
    };
    let (outs, e) = both(cfg, batch(24));
    // Some requests stopped early on a stop token, others ran to their limit.
    assert!(outs.iter().any(|o| o.finish_reason == FinishReason::Stop));
    assert!(outs.iter().any(|o| o.finish_reason == FinishReason::Length));
    let m = e.metrics();
    assert!(m.hidden_ms > 0.0, "host work overlapped the device: {m:?}");
    assert!(m.steps > 0 && m.generated_tokens > 0);
}

#[test]
fn overlap_equals_in_order_with_drafts_and_under_preemption() {
    // Fixed-length verification: sampled paths do not depend on batch-mates or timing.
    let drafts = EngineConfig {
        spec_drafts: 3,
        max_num_batched_tokens: 128,
        ..EngineConfig::default()
    };
    let (outs, e) = both(drafts, batch(10));
    assert!(e.metrics().spec_rows > 0);
    assert!(outs.iter().all(|o| !o.token_ids.is_empty()));

    // A KV pool of 9 blocks of 4 tokens for 8 requests: preemption in both modes, and the
    // outputs of the ample pool.
    let reqs: Vec<Request> = (0..8u64)
        .map(|i| Request::new(i, prompt(50 + i, 9), params(i, 10)))
        .collect();
    let (ample, _) = run(
        EngineConfig {
            overlap: false,
            ..EngineConfig::default()
        },
        reqs.clone(),
    );
    let tight = EngineConfig {
        num_blocks: 9,
        block_size: 4,
        ..EngineConfig::default()
    };
    let (outs, e) = both(tight, reqs);
    assert!(e.metrics().preemptions > 0, "{:?}", e.metrics());
    assert_same(&ample, &outs);
}

#[test]
fn aborts_keep_what_was_streamed_in_both_modes() {
    let reqs: Vec<Request> = (0..6u64)
        .map(|i| Request::new(i, prompt(i + 9, 12), params(i, 12)))
        .collect();
    let stream = |overlap: bool| {
        let mut e = engine(EngineConfig {
            overlap,
            ..EngineConfig::default()
        });
        let mut finished = Vec::new();
        let mut seen = [0usize; 6];
        e.generate_stream(reqs.clone(), |ev| {
            match ev {
                StreamEvent::Token { id, .. } => {
                    seen[*id as usize] += 1;
                    // Requests 1 and 4 are aborted after their 2nd and 5th token.
                    return !((*id == 1 && seen[1] >= 2) || (*id == 4 && seen[4] >= 5));
                }
                StreamEvent::Finished(o) => finished.push((**o).clone()),
                _ => {}
            }
            true
        })
        .unwrap();
        finished.sort_by_key(|o| o.id);
        (finished, seen)
    };
    let (a, seen_a) = stream(false);
    let (b, seen_b) = stream(true);
    assert_same(&a, &b);
    assert_eq!(seen_a, seen_b, "the same token events");
    assert_eq!(b[1].finish_reason, FinishReason::Aborted);
    assert_eq!(b[1].token_ids.len(), 2);
    assert_eq!(b[4].token_ids.len(), 5);
    assert_eq!(b[0].token_ids.len(), 12);
}

#[test]
fn launch_phase_check_trips_on_a_deliberate_device_read() {
    let m = model();
    let mut st = m.new_state();
    let toks = [5u32, 6, 7];
    {
        let _phase = LaunchPhase::enter();
        let r = m.forward(
            &mut [BatchItem {
                state: &mut st,
                tokens: &toks,
            }],
            Logits::Last,
            None,
        );
        assert!(matches!(r, Err(ModelError::HostSync(_))), "{r:?}");
        assert_eq!(st.pos, 0, "nothing ran");
    }
    // Outside the phase the same read works.
    let r = m.forward(
        &mut [BatchItem {
            state: &mut st,
            tokens: &toks,
        }],
        Logits::Last,
        None,
    );
    assert!(r.is_ok());
    // The overlapped loop never reads device results on its host thread: a generate call
    // made from a thread already in the launch phase, with the check on, completes.
    let _phase = LaunchPhase::enter();
    let mut e = engine(EngineConfig {
        overlap: true,
        sync_check: true,
        ..EngineConfig::default()
    });
    let outs = e
        .generate(vec![Request::new(1, prompt(3, 7), params(0, 4))])
        .unwrap();
    assert_eq!(outs[0].token_ids.len(), 4);
}

#[test]
fn a_small_pool_preempts_and_gives_the_tokens_of_an_ample_one() {
    // One pool holds every sequence's compressed entries at the scheduler's block ids: 4
    // sequences of up to 48 positions need 24 blocks of 8; a pool of 10 preempts them, with
    // speculation's rollback points and the prefix snapshots taken as usual (greedy, so the
    // tokens cannot depend on whether a row verified drafts).
    let reqs: Vec<Request> = (0..4u64)
        .map(|i| Request::new(i, prompt(70 + i, 40), params(0, 8)))
        .collect();
    let base = EngineConfig {
        block_size: 8,
        spec_drafts: 2,
        ..EngineConfig::default()
    };
    let (ample, _) = run(base.clone(), reqs.clone());
    for overlap in [false, true] {
        let mut e = engine(EngineConfig {
            num_blocks: 10,
            overlap,
            ..base.clone()
        });
        assert_eq!(e.model().global_cache_blocks(), 10, "one pool");
        let tight = e.generate(reqs.clone()).unwrap();
        assert!(
            e.metrics().preemptions > 0,
            "overlap {overlap}: no preemption"
        );
        for (a, b) in ample.iter().zip(&tight) {
            assert_eq!(a.token_ids, b.token_ids, "overlap {overlap}");
        }
        assert_eq!(e.kv_blocks_in_use(), 0);
    }
    // A pool that cannot hold one prompt: a typed error, no panic.
    let mut e = engine(EngineConfig {
        num_blocks: 1,
        ..base
    });
    let r = e.generate(reqs);
    assert!(r.is_err(), "{r:?}");
}
