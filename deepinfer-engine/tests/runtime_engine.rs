//! End-to-end tests of the step loop on the `v41-tiny-dev` fixture (token level, no
//! tokenizer): reproducibility across batch composition and order, prefix-cache hits,
//! preemption under memory pressure, stop tokens, abort, per-request errors.
#![cfg(feature = "runtime")]

mod common;
use common::prompt;
use deepinfer_engine::Model;
use deepinfer_engine::runtime::{
    Engine, EngineConfig, FinishReason, GenParams, Output, Request, SpecBudget, StreamEvent,
};
use deepinfer_kernels::CpuBackend;
use deepinfer_sample::SamplingParams;
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/v41-tiny-dev")
}

fn engine(cfg: EngineConfig) -> Engine<CpuBackend> {
    let model = Model::load(&fixture(), CpuBackend::batch_invariant()).expect("fixture loads");
    Engine::new(model, cfg).expect("engine")
}

fn sampled(seed: u64, max_tokens: usize) -> GenParams {
    GenParams {
        sampling: SamplingParams {
            temperature: 0.9,
            top_k: 50,
            top_p: 0.95,
            seed,
            top_logprobs: 2,
            ..SamplingParams::default()
        },
        max_tokens,
        logprobs: true,
        ..GenParams::default()
    }
}

fn by_id(outs: &[Output], id: u64) -> &Output {
    outs.iter().find(|o| o.id == id).expect("output present")
}

#[test]
fn request_alone_in_a_batch_of_64_and_shuffled_gives_identical_tokens_and_logprobs() {
    let target = Request::new(1000, prompt(1, 23), sampled(42, 12));
    let others: Vec<Request> = (0..64u64)
        .map(|i| {
            Request::new(
                i,
                prompt(100 + i, 3 + (i as usize * 7) % 41),
                sampled(i, 4 + (i as usize % 9)),
            )
        })
        .collect();
    let cfg = EngineConfig {
        max_num_batched_tokens: 512,
        ..EngineConfig::default()
    };
    let alone = engine(cfg.clone()).generate(vec![target.clone()]).unwrap();
    let mut batch = others.clone();
    batch.insert(17, target.clone());
    let in_batch = engine(cfg.clone()).generate(batch.clone()).unwrap();
    batch.reverse();
    batch.rotate_left(5);
    let shuffled = engine(cfg).generate(batch).unwrap();
    let a = by_id(&alone, 1000);
    assert_eq!(a.token_ids.len(), 12);
    assert!(a.logprobs.as_ref().is_some_and(|l| l.len() == 12));
    for o in [by_id(&in_batch, 1000), by_id(&shuffled, 1000)] {
        assert_eq!(o.token_ids, a.token_ids);
        assert_eq!(
            o.logprobs, a.logprobs,
            "log-probabilities must be bit-identical"
        );
    }
    // Every batch-mate is also order-independent.
    for i in 0..64 {
        assert_eq!(
            by_id(&in_batch, i).token_ids,
            by_id(&shuffled, i).token_ids,
            "request {i}"
        );
    }
}

/// The hit rule's slack is its own setting: without it a hit reuses up to the last window.
#[test]
fn spec_slack_sets_how_much_of_a_hit_is_recomputed() {
    let p = prompt(7, 61);
    for (slack, want) in [(0, 48), (6, 40), (20, 32)] {
        let mut e = engine(EngineConfig {
            block_size: 8,
            spec_slack: slack,
            ..EngineConfig::default()
        });
        e.generate(vec![Request::new(1, p.clone(), GenParams::greedy(2))])
            .unwrap();
        let hot = e
            .generate(vec![Request::new(2, p.clone(), GenParams::greedy(2))])
            .unwrap()
            .remove(0);
        // 61 - 8 - slack, rounded down to whole blocks of 8.
        assert_eq!(hot.usage.cached_tokens, want, "slack {slack}");
    }
}

#[test]
fn prefix_cache_hit_gives_the_cold_output_and_shows_in_metrics() {
    let cfg = EngineConfig {
        block_size: 8,
        ..EngineConfig::default()
    };
    let p = prompt(7, 61);
    let req = |id| Request::new(id, p.clone(), sampled(5, 10));
    let mut cold_engine = engine(EngineConfig {
        prefix_caching: false,
        ..cfg.clone()
    });
    let cold = cold_engine.generate(vec![req(1)]).unwrap().remove(0);
    assert_eq!(cold.usage.cached_tokens, 0);

    let mut e = engine(cfg);
    let first = e.generate(vec![req(1)]).unwrap().remove(0);
    assert_eq!(first.usage.cached_tokens, 0);
    let hot = e.generate(vec![req(2)]).unwrap().remove(0);
    // 61 tokens, window 8, slack 6: at most 61 - 14 = 47 → 40 tokens (5 blocks) from the cache.
    assert_eq!(hot.usage.cached_tokens, 40);
    let m = e.metrics();
    assert_eq!(m.cached_prompt_tokens, 40);
    assert!(m.state_snapshot_hits >= 1, "{m:?}");
    assert_eq!(m.replayed_tokens, 0, "the snapshot sits exactly at the hit");
    assert_eq!(hot.token_ids, cold.token_ids);
    assert_eq!(hot.logprobs, cold.logprobs);
    assert_eq!(first.token_ids, cold.token_ids);

    // A prompt sharing only a prefix resumes from a shorter hit by replaying from the
    // nearest snapshot (or the start); the output is still exact.
    let mut q = p[..40].to_vec();
    q.extend(prompt(9, 30));
    let cold_q = cold_engine
        .generate(vec![Request::new(3, q.clone(), sampled(6, 8))])
        .unwrap()
        .remove(0);
    let hot_q = e
        .generate(vec![Request::new(3, q, sampled(6, 8))])
        .unwrap()
        .remove(0);
    assert!(hot_q.usage.cached_tokens > 0);
    assert_eq!(hot_q.token_ids, cold_q.token_ids);
    assert_eq!(hot_q.logprobs, cold_q.logprobs);
}

#[test]
fn memory_pressure_preempts_and_every_request_completes_with_the_same_output() {
    let reqs: Vec<Request> = (0..8u64)
        .map(|i| Request::new(i, prompt(300 + i, 20 + i as usize), sampled(i, 30)))
        .collect();
    let ample = engine(EngineConfig {
        block_size: 8,
        ..EngineConfig::default()
    })
    .generate(reqs.clone())
    .unwrap();
    // Each request needs 7-8 blocks of 8 tokens at the end; 8 requests cannot all fit 24.
    let mut tight = engine(EngineConfig {
        block_size: 8,
        num_blocks: 24,
        ..EngineConfig::default()
    });
    let squeezed = tight.generate(reqs).unwrap();
    assert!(
        tight.metrics().preemptions > 0,
        "the pool was meant to be too small"
    );
    for (a, b) in ample.iter().zip(&squeezed) {
        assert_eq!(a.id, b.id);
        assert_eq!(b.token_ids.len(), 30);
        assert_eq!(a.token_ids, b.token_ids, "request {}", a.id);
        assert_eq!(a.logprobs, b.logprobs, "request {}", a.id);
    }
}

#[test]
fn stop_tokens_end_the_request_and_are_kept() {
    let mut e = engine(EngineConfig::default());
    let p = prompt(11, 9);
    let free = e
        .generate(vec![Request::new(1, p.clone(), GenParams::greedy(16))])
        .unwrap()
        .remove(0);
    assert_eq!(free.finish_reason, FinishReason::Length);
    let stop = free.token_ids[4];
    let first = free.token_ids.iter().position(|&t| t == stop).unwrap();
    let mut params = GenParams::greedy(16);
    params.stop_token_ids = vec![stop];
    let stopped = e
        .generate(vec![Request::new(2, p, params)])
        .unwrap()
        .remove(0);
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.token_ids, free.token_ids[..=first].to_vec());
}

#[test]
fn streaming_abort_finishes_one_request_early_and_the_others_complete() {
    let mut e = engine(EngineConfig::default());
    let reqs: Vec<Request> = (0..4u64)
        .map(|i| Request::new(i, prompt(i, 10), sampled(i, 12)))
        .collect();
    let mut finished = Vec::new();
    let mut tokens_of_2 = 0;
    e.generate_stream(reqs, |ev| {
        match ev {
            StreamEvent::Token { id: 2, .. } => {
                tokens_of_2 += 1;
                return tokens_of_2 < 3;
            }
            StreamEvent::Finished(o) => finished.push((**o).clone()),
            _ => {}
        }
        true
    })
    .unwrap();
    assert_eq!(finished.len(), 4);
    for o in &finished {
        if o.id == 2 {
            assert_eq!(o.finish_reason, FinishReason::Aborted);
            assert_eq!(o.token_ids.len(), 3);
        } else {
            assert_eq!(o.finish_reason, FinishReason::Length);
            assert_eq!(o.token_ids.len(), 12);
        }
    }
}

#[test]
fn invalid_requests_fail_alone() {
    let mut e = engine(EngineConfig::default());
    let reqs = vec![
        Request::new(1, prompt(1, 5), GenParams::greedy(3)),
        Request::new(2, vec![1, 2, 9999], GenParams::greedy(3)),
        Request::new(3, vec![], GenParams::greedy(3)),
        Request::new(4, prompt(4, 5), GenParams::greedy(0)),
        Request::new(5, prompt(5, 5), GenParams::greedy(3)),
    ];
    let res = e.generate_each(reqs).unwrap();
    assert!(res[0].is_ok() && res[4].is_ok());
    for (i, r) in res.iter().enumerate().skip(1).take(3) {
        let msg = r.as_ref().unwrap_err().to_string();
        assert!(msg.starts_with(&format!("request {}", i + 1)), "{msg}");
    }
    assert!(
        res[1]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("outside the vocabulary")
    );
}

#[test]
fn greedy_with_dspark_drafts_equals_greedy_without() {
    let reqs: Vec<Request> = (0..6u64)
        .map(|i| {
            Request::new(
                i,
                prompt(500 + i, 5 + 9 * i as usize),
                GenParams::greedy(20),
            )
        })
        .collect();
    let plain = engine(EngineConfig::default())
        .generate(reqs.clone())
        .unwrap();
    for k in [1, 3, 5] {
        let mut e = engine(EngineConfig {
            spec_drafts: k,
            ..EngineConfig::default()
        });
        let spec = e.generate(reqs.clone()).unwrap();
        let m = e.metrics();
        assert!(m.spec_rows > 0 && m.draft_tokens > 0, "{m:?}");
        for (a, b) in plain.iter().zip(&spec) {
            assert_eq!(a.token_ids, b.token_ids, "request {} with {k} drafts", a.id);
        }
    }
}

#[test]
fn sampled_speculation_is_order_independent_and_respects_limits() {
    let reqs: Vec<Request> = (0..6u64)
        .map(|i| Request::new(i, prompt(700 + i, 6 + 5 * i as usize), sampled(i, 15)))
        .collect();
    let cfg = EngineConfig {
        spec_drafts: 3,
        ..EngineConfig::default()
    };
    let a = engine(cfg.clone()).generate(reqs.clone()).unwrap();
    let mut rev = reqs;
    rev.reverse();
    let b = engine(cfg).generate(rev).unwrap();
    for o in &a {
        assert_eq!(o.token_ids.len(), 15);
        assert_eq!(o.logprobs.as_ref().map(Vec::len), Some(15));
        assert_eq!(o.token_ids, by_id(&b, o.id).token_ids);
    }
}

/// Seeded sampling with DSpark drafts gives exactly the tokens and log-probabilities of
/// seeded sampling without them, for 1, 3 and 5 fixed drafts and budgeted drafts: the output
/// distribution is the target's (drafts judged against `q = softmax(draft logits)` although
/// they were the drafter's argmax chain gave other tokens, biased towards the drafts).
#[test]
fn sampled_speculation_gives_the_tokens_of_sampling_without_drafts() {
    let reqs: Vec<Request> = (0..8u64)
        .map(|i| {
            let mut p = sampled(31 + i, 16);
            p.sampling.temperature = [1.0, 0.7, 0.3, 1.3][i as usize % 4];
            p.sampling.top_k = if i % 2 == 0 { 0 } else { 20 };
            Request::new(i, prompt(1300 + i, 5 + 4 * i as usize), p)
        })
        .collect();
    let plain = engine(EngineConfig::default())
        .generate(reqs.clone())
        .unwrap();
    let runs = [
        (1, SpecBudget::Fixed),
        (3, SpecBudget::Fixed),
        (5, SpecBudget::Fixed),
        (5, SpecBudget::Budgeted),
    ];
    for (k, budget) in runs {
        let mut e = engine(EngineConfig {
            spec_drafts: k,
            spec_budget: budget,
            ..EngineConfig::default()
        });
        let spec = e.generate(reqs.clone()).unwrap();
        let m = e.metrics();
        // The budgeted planner may give every row 0 drafts when its measured step times say
        // drafting does not pay (a loaded machine); fixed-length verification always drafts.
        if budget == SpecBudget::Fixed {
            assert!(m.spec_rows > 0 && m.draft_tokens > 0, "{m:?}");
        }
        for (a, b) in plain.iter().zip(&spec) {
            assert_eq!(
                (&a.token_ids, &a.logprobs),
                (&b.token_ids, &b.logprobs),
                "request {} with {k} drafts ({budget:?})",
                a.id
            );
        }
    }
}

#[test]
fn greedy_with_budgeted_drafts_equals_greedy_without() {
    let reqs: Vec<Request> = (0..8u64)
        .map(|i| {
            Request::new(
                i,
                prompt(900 + i, 4 + 7 * i as usize),
                GenParams::greedy(24),
            )
        })
        .collect();
    let plain = engine(EngineConfig::default())
        .generate(reqs.clone())
        .unwrap();
    let mut e = engine(EngineConfig {
        spec_drafts: 4,
        spec_budget: SpecBudget::Budgeted,
        ..EngineConfig::default()
    });
    let spec = e.generate(reqs.clone()).unwrap();
    let m = e.metrics();
    // The drafter ran ahead for the planner's confidences; how many rows the planner gave
    // drafts depends on measured step times (none on a loaded machine), at most 4 each.
    assert!(m.draft_ms > 0.0, "{m:?}");
    assert!(m.draft_tokens <= 4 * m.spec_rows, "{m:?}");
    assert!(m.accepted_drafts <= m.draft_tokens);
    for (a, b) in plain.iter().zip(&spec) {
        assert_eq!(a.token_ids, b.token_ids, "request {}", a.id);
    }
    // Sampled requests complete with their token counts under the budget too.
    let sampled_reqs: Vec<Request> = (0..4u64)
        .map(|i| Request::new(i, prompt(950 + i, 9), sampled(i, 10)))
        .collect();
    for o in e.generate(sampled_reqs).unwrap() {
        assert_eq!(o.token_ids.len(), 10);
    }
}

/// Time-budgeted chunked prefill changes how a long prompt is cut into steps, never the
/// tokens: with a budget far below one step's time the prompt goes through in
/// `min_chunk_tokens` pieces (many more steps), and every output equals the unbudgeted one.
#[test]
fn time_budgeted_prefill_cuts_chunks_but_not_tokens() {
    let mut reqs: Vec<Request> = (0..4u64)
        .map(|i| Request::new(i, prompt(40 + i, 8), GenParams::greedy(12)))
        .collect();
    reqs.push(Request::new(9, prompt(99, 700), GenParams::greedy(6)));
    let mut plain = engine(EngineConfig::default());
    let a = plain.generate(reqs.clone()).unwrap();
    let mut budgeted = engine(EngineConfig {
        step_time_budget_ms: Some(1e-3),
        ..EngineConfig::default()
    });
    let b = budgeted.generate(reqs).unwrap();
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.token_ids, y.token_ids, "request {}", x.id);
    }
    let (s0, s1) = (plain.metrics().steps, budgeted.metrics().steps);
    assert!(
        s1 >= s0 + 700 / 64 - 2,
        "steps {s0} without the budget, {s1} with"
    );
}

#[test]
fn an_impossible_step_time_budget_is_a_configuration_error() {
    let model = Model::load(&fixture(), CpuBackend::batch_invariant()).unwrap();
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = Engine::new(
            Model::load(&fixture(), CpuBackend::batch_invariant()).unwrap(),
            EngineConfig {
                step_time_budget_ms: Some(bad),
                ..EngineConfig::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("step_time_budget_ms"), "{e}");
    }
    drop(model);
}

#[test]
fn prompts_sharing_a_prefix_resume_near_where_they_diverge() {
    let shared = prompt(21, 45);
    let with_tail = |seed| {
        let mut p = shared.clone();
        p.extend(prompt(seed, 20));
        p
    };
    let cfg = EngineConfig {
        block_size: 8,
        prefix_state_interval: 16,
        ..EngineConfig::default()
    };
    let cold = engine(EngineConfig {
        prefix_caching: false,
        ..cfg.clone()
    })
    .generate(vec![Request::new(2, with_tail(2), sampled(3, 6))])
    .unwrap()
    .remove(0);
    for (interval, replay_at_most) in [(16, 40 - 32), (0, 40)] {
        let mut e = engine(EngineConfig {
            prefix_state_interval: interval,
            ..cfg.clone()
        });
        e.generate(vec![Request::new(1, with_tail(1), sampled(3, 6))])
            .unwrap();
        let hot = e
            .generate(vec![Request::new(2, with_tail(2), sampled(3, 6))])
            .unwrap()
            .remove(0);
        // The device pool hits the 5 shared blocks (40 tokens); the nearest state is at 32
        // with states every 16 tokens, and at 0 with none.
        assert_eq!(hot.usage.cached_tokens, 40, "interval {interval}");
        let m = e.metrics();
        assert_eq!(
            m.replayed_tokens, replay_at_most as u64,
            "interval {interval}: {m:?}"
        );
        assert_eq!(hot.token_ids, cold.token_ids);
        assert_eq!(hot.logprobs, cold.logprobs);
    }
}

mod streams {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// One request of a stream: which shared prefix, its own tail, `n`, greedy or seeded,
    /// and (for `n = 1`) the token after which the caller aborts it.
    #[derive(Debug, Clone)]
    struct Spec {
        prefix: usize,
        tail: usize,
        n: usize,
        greedy: bool,
        abort_after: Option<usize>,
    }

    fn spec() -> impl Strategy<Value = Spec> {
        (
            0usize..2,
            1usize..14,
            1usize..3,
            any::<bool>(),
            proptest::option::of(1usize..5),
        )
            .prop_map(|(prefix, tail, n, greedy, abort)| Spec {
                prefix,
                tail,
                n,
                greedy,
                abort_after: abort.filter(|_| n == 1),
            })
    }

    fn requests(specs: &[Spec]) -> Vec<Request> {
        let shared = [prompt(900, 33), prompt(901, 24)];
        specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut p = shared[s.prefix].clone();
                p.extend(prompt(1000 + i as u64, s.tail));
                let mut g = if s.greedy {
                    GenParams::greedy(6)
                } else {
                    sampled(i as u64, 6)
                };
                g.n = s.n;
                Request::new(i as u64, p, g)
            })
            .collect()
    }

    /// Outputs by (id, index) of one run; the engine is checked for leaks afterwards.
    fn run(specs: &[Spec], cfg: EngineConfig) -> BTreeMap<(u64, usize), (Vec<u32>, FinishReason)> {
        let mut e = engine(cfg);
        let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
        let mut outs = BTreeMap::new();
        e.generate_stream(requests(specs), |ev| {
            match ev {
                StreamEvent::Token { id, .. } => {
                    let k = seen.entry(*id).or_default();
                    *k += 1;
                    if let Some(a) = specs[*id as usize].abort_after {
                        return *k < a;
                    }
                }
                StreamEvent::Finished(o) => {
                    outs.insert((o.id, o.index), (o.token_ids.clone(), o.finish_reason));
                }
                _ => {}
            }
            true
        })
        .unwrap();
        assert_eq!(e.kv_blocks_in_use(), 0, "KV blocks leaked");
        // One pool: the model's global entries live at the scheduler's block ids.
        assert_eq!(e.model().global_cache_blocks(), e.kv_pool().num_blocks);
        outs
    }

    /// A case proptest found: three `n = 2` requests in a pool too small to fork them all at
    /// once.
    #[test]
    fn forks_in_a_full_pool_wait_for_memory() {
        let s = |tail, greedy| Spec {
            prefix: 0,
            tail,
            n: 2,
            greedy,
            abort_after: None,
        };
        let specs = [s(1, false), s(1, false), s(10, true)];
        let cfg = EngineConfig {
            block_size: 8,
            num_blocks: 18,
            prefix_state_interval: 16,
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            ..EngineConfig::default()
        };
        let cached = run(&specs, cfg.clone());
        assert_eq!(cached.len(), 6);
        assert_eq!(
            cached,
            run(
                &specs,
                EngineConfig {
                    prefix_caching: false,
                    ..cfg
                }
            )
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

        /// Random streams with shared prefixes, forks (`n > 1`), aborts and a pool small
        /// enough to preempt: no block leaks, and every output equals the one with prefix
        /// caching off.
        #[test]
        fn streams_with_prefixes_forks_aborts_and_preemption_match_no_cache(
            specs in proptest::collection::vec(spec(), 3..7),
            blocks in 12usize..40,
        ) {
            let cfg = EngineConfig {
                block_size: 8,
                num_blocks: blocks,
                prefix_state_interval: 16,
                max_num_seqs: 8,
                max_num_batched_tokens: 64,
                ..EngineConfig::default()
            };
            let cached = run(&specs, cfg.clone());
            let plain = run(&specs, EngineConfig { prefix_caching: false, ..cfg });
            let want: usize = specs.iter().map(|s| s.n).sum();
            prop_assert_eq!(cached.len(), want);
            prop_assert_eq!(cached, plain);
        }
    }
}

#[test]
fn expert_parallel_ranks_give_the_tokens_of_one_rank() {
    let reqs: Vec<Request> = (0..6u64)
        .map(|i| Request::new(i, prompt(700 + i, 9 + 5 * i as usize), sampled(i, 8)))
        .collect();
    for (drafts, overlap) in [(0, true), (3, false)] {
        let cfg = |ep| EngineConfig {
            expert_parallel: ep,
            spec_drafts: drafts,
            overlap,
            ..EngineConfig::default()
        };
        let one = engine(cfg(1)).generate(reqs.clone()).unwrap();
        for ep in [2, 3] {
            let got = engine(cfg(ep)).generate(reqs.clone()).unwrap();
            for (a, b) in one.iter().zip(&got) {
                assert_eq!(
                    a.token_ids, b.token_ids,
                    "ep {ep}, drafts {drafts}, request {}",
                    a.id
                );
                assert_eq!(a.logprobs, b.logprobs, "ep {ep}, drafts {drafts}");
            }
        }
    }
    let model = Model::load(&fixture(), CpuBackend::batch_invariant()).unwrap();
    let e = Engine::new(
        model,
        EngineConfig {
            expert_parallel: 9,
            ..EngineConfig::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("routed experts"), "{e}");
}

#[test]
fn eplb_re_places_experts_between_steps_without_changing_tokens() {
    let reqs: Vec<Request> = (0..6u64)
        .map(|i| Request::new(i, prompt(800 + i, 12 + 3 * i as usize), sampled(i, 10)))
        .collect();
    let one = engine(EngineConfig::default())
        .generate(reqs.clone())
        .unwrap();
    let mut e = engine(EngineConfig {
        expert_parallel: 2,
        eplb_interval: Some(2),
        ..EngineConfig::default()
    });
    let got = e.generate(reqs).unwrap();
    for (a, b) in one.iter().zip(&got) {
        assert_eq!(a.token_ids, b.token_ids, "request {}", a.id);
        assert_eq!(a.logprobs, b.logprobs);
    }
    let m = e.metrics();
    assert!(m.eplb_rebalances >= 2, "{m:?}");
    assert!(
        m.moe_lb_placed >= 1.0 && m.moe_lb_placed <= m.moe_lb_contiguous + 1e-9,
        "{m:?}"
    );
    let j = e.metrics_json();
    assert_eq!(j["eplb"]["rebalances"], m.eplb_rebalances);
    // EPLB needs expert parallelism over ranks that split the experts evenly.
    for (ep, k) in [(1, Some(2)), (3, Some(2)), (2, Some(0))] {
        let model = Model::load(&fixture(), CpuBackend::batch_invariant()).unwrap();
        let cfg = EngineConfig {
            expert_parallel: ep,
            eplb_interval: k,
            ..EngineConfig::default()
        };
        assert!(Engine::new(model, cfg).is_err(), "ep {ep}, interval {k:?}");
    }
}
