//! Property tests of the scheduler core against the deterministic fake engine.

mod common;
use common::*;
use deepinfer_sched::{FinishReason, Finished, RequestId, Scheduler, SchedulerConfig, SpecMode};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Workload {
    /// (arrival step, prompt len, max new tokens, priority)
    reqs: Vec<(usize, usize, usize, i32)>,
    /// (step, request index) aborts
    aborts: Vec<(usize, usize)>,
    batched: usize,
    seqs: usize,
    chunk: usize,
    blocks: usize,
    block_size: usize,
    drafts: usize,
}

fn workload(with_aborts: bool, priorities: bool) -> impl Strategy<Value = Workload> {
    (
        prop::collection::vec(
            (
                0usize..30,
                1usize..120,
                1usize..30,
                if priorities { 0i32..3 } else { 0i32..1 },
            ),
            1..20,
        ),
        prop::collection::vec((0usize..60, 0usize..20), 0..if with_aborts { 5 } else { 1 }),
        8usize..96,
        1usize..8,
        1usize..64,
        prop::sample::select(vec![4usize, 8, 16]),
        0usize..4,
    )
        .prop_flat_map(move |(reqs, aborts, batched, seqs, chunk, bs, drafts)| {
            // Memory pressure: a pool from "one long request" up to "everyone".
            let need = reqs.iter().map(|r| r.1 + r.2 + 8).max().unwrap_or(8);
            let min_blocks = need.div_ceil(bs) + 1;
            let aborts = if with_aborts { aborts } else { Vec::new() };
            (min_blocks..min_blocks * 3).prop_map(move |blocks| Workload {
                reqs: reqs.clone(),
                aborts: aborts.clone(),
                batched,
                seqs,
                chunk,
                blocks,
                block_size: bs,
                drafts,
            })
        })
}

fn config(w: &Workload) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: w.batched,
        max_num_seqs: w.seqs,
        max_model_len: 4096,
        max_chunk_tokens: w.chunk,
        spec: if w.drafts > 0 {
            SpecMode::Fixed(w.drafts)
        } else {
            SpecMode::Off
        },
        ..Default::default()
    }
}

/// Run a workload; returns finished requests and, per request, the step it was first scheduled.
fn simulate(w: &Workload, overlapped: bool) -> (Vec<Finished>, Vec<Option<usize>>, Scheduler) {
    simulate_with(w, usize::from(overlapped), false)
}

/// `depth`: plans scheduled ahead of the step the engine runs (0 synchronous,
/// 1 overlapped, 2 two-step overlap); `dense`: the fake engine answers decode
/// rows in the dense form.
fn simulate_with(
    w: &Workload,
    depth: usize,
    dense: bool,
) -> (Vec<Finished>, Vec<Option<usize>>, Scheduler) {
    let cfg = config(w);
    let mut s = scheduler(cfg.clone(), w.blocks, w.block_size);
    let mut done = Vec::new();
    let mut first = vec![None; w.reqs.len()];
    let mut queue: std::collections::VecDeque<deepinfer_sched::StepPlan> = Default::default();
    let last_arrival = w.reqs.iter().map(|r| r.0).max().unwrap_or(0);
    for step in 0..5000 {
        for (i, r) in w.reqs.iter().enumerate() {
            if r.0 == step {
                let mut q = req(i as RequestId, r.1, r.2);
                q.priority = r.3;
                s.add_request(q).unwrap();
            }
        }
        for &(at, i) in &w.aborts {
            if at == step
                && i < w.reqs.len()
                && let Ok(f) = s.abort(i as RequestId)
            {
                done.push(f);
            }
        }
        if step > last_arrival && s.is_idle() && queue.is_empty() {
            break;
        }
        let plan = match queue.pop_front() {
            Some(p) => p,
            None => s.schedule().unwrap(),
        };
        // Budget invariants of every plan the engine sees.
        assert!(plan.num_tokens <= cfg.max_num_batched_tokens, "{plan:?}");
        assert!(plan.num_groups() <= cfg.max_num_seqs, "{plan:?}");
        let rows: usize = plan.prefill.iter().map(|c| c.len).sum::<usize>()
            + plan.decode.iter().map(|d| 1 + d.drafts).sum::<usize>();
        assert_eq!(rows, plan.num_tokens);
        assert!(
            plan.prefill
                .iter()
                .all(|c| c.len <= cfg.max_chunk_tokens && c.len > 0)
        );
        for id in plan.requests() {
            let f = &mut first[id as usize];
            if f.is_none() {
                *f = Some(step);
            }
        }
        let out = if dense {
            run_dense(&plan, &s)
        } else {
            run(&plan, &s)
        };
        // Plan ahead while this step runs.
        while queue.len() < depth {
            queue.push_back(s.schedule().unwrap());
        }
        let res = s.update(&out).unwrap();
        // The block manager counts no more tokens than each history holds (it
        // keeps none itself: the history is the token list).
        for i in 0..w.reqs.len() as RequestId {
            if let (Some(h), Ok(c)) = (s.tokens(i), s.kv().num_committed(i)) {
                assert!(c <= h.len(), "request {i}");
            }
        }
        done.extend(res.finished.iter().cloned());
        if let Some(p) = queue.get_mut(0) {
            res.apply_to(p);
        }
        if let Some(p) = queue.get_mut(1) {
            res.apply_later_to(p);
        }
    }
    assert!(s.is_idle(), "requests left after 5000 steps");
    (done, first, s)
}

fn check_all_accounted(w: &Workload, done: &[Finished], s: &Scheduler) {
    for i in 0..w.reqs.len() {
        let f: Vec<&Finished> = done.iter().filter(|f| f.id == i as RequestId).collect();
        assert_eq!(f.len(), 1, "request {i} ended {} times", f.len());
        let (_, len, max_new, _) = w.reqs[i];
        match f[0].reason {
            FinishReason::Aborted => {
                assert!(w.aborts.iter().any(|a| a.1 == i));
                // Whatever it produced before the abort is a prefix of the true stream.
                let exp = expected_output(i as RequestId, len, max_new);
                assert!(exp.starts_with(f[0].output()));
            }
            r => {
                assert_eq!(r, FinishReason::Length);
                assert_eq!(
                    f[0].output(),
                    expected_output(i as RequestId, len, max_new),
                    "request {i}"
                );
            }
        }
    }
    assert_eq!(s.kv().usage().used, 0, "blocks leaked");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Budgets hold and, whatever the memory pressure, every request ends
    /// finished (with exactly its true tokens) or explicitly aborted.
    #[test]
    fn preemption_never_loses_a_request(w in workload(true, true)) {
        let (done, _, s) = simulate(&w, false);
        check_all_accounted(&w, &done, &s);
    }

    /// The same with overlapped scheduling.
    #[test]
    fn overlapped_never_loses_a_request(w in workload(true, true)) {
        let (done, _, s) = simulate(&w, true);
        check_all_accounted(&w, &done, &s);
    }

    /// Overlapped schedule + update gives the same outputs as synchronous scheduling.
    #[test]
    fn overlapped_equals_synchronous(w in workload(false, true)) {
        let (mut a, _, _) = simulate(&w, false);
        let (mut b, _, _) = simulate(&w, true);
        a.sort_by_key(|f| f.id);
        b.sort_by_key(|f| f.id);
        prop_assert_eq!(a, b);
    }

    /// Decode rows answered in the dense form (one token per row): nothing is
    /// lost, synchronous or overlapped, and both give the same outputs.
    #[test]
    fn dense_output_never_loses_a_request(w in workload(true, true)) {
        let (done, _, s) = simulate_with(&w, 0, true);
        check_all_accounted(&w, &done, &s);
        let (done, _, s) = simulate_with(&w, 1, true);
        check_all_accounted(&w, &done, &s);
    }

    /// Two-step overlap (the plan for step N+2 made while N and N+1 are both
    /// unconfirmed): nothing is lost under memory pressure and aborts, with
    /// either output form.
    #[test]
    fn two_step_overlap_never_loses_a_request(w in workload(true, true)) {
        let (done, _, s) = simulate_with(&w, 2, false);
        check_all_accounted(&w, &done, &s);
        let (done, _, s) = simulate_with(&w, 2, true);
        check_all_accounted(&w, &done, &s);
    }

    /// Two-step overlap gives the same outputs as synchronous scheduling.
    #[test]
    fn two_step_overlap_equals_synchronous(w in workload(false, true)) {
        let (mut a, _, _) = simulate(&w, false);
        let (mut b, _, _) = simulate_with(&w, 2, false);
        a.sort_by_key(|f| f.id);
        b.sort_by_key(|f| f.id);
        prop_assert_eq!(a, b);
    }

    /// FCFS: with one priority, requests start in arrival order and all finish.
    #[test]
    fn fcfs_admits_in_order_and_never_starves(w in workload(false, false)) {
        let (done, first, s) = simulate(&w, false);
        check_all_accounted(&w, &done, &s);
        // Arrival order: by arrival step, then submission index.
        let mut order: Vec<usize> = (0..w.reqs.len()).collect();
        order.sort_by_key(|&i| (w.reqs[i].0, i));
        let starts: Vec<usize> = order.iter().map(|&i| first[i].unwrap()).collect();
        prop_assert!(starts.windows(2).all(|p| p[0] <= p[1]), "starts {:?}", starts);
    }
}
