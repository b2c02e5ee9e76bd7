//! Scheduler behaviour on hand-made cases.

use deepinfer_sched::testing::*;
use deepinfer_sched::{
    FinishReason, NewRequest, SchedError, Scheduler, SchedulerConfig, SpecMode, StepOutput,
};

fn cfg() -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: 64,
        max_num_seqs: 8,
        max_model_len: 1024,
        max_chunk_tokens: 32,
        ..Default::default()
    }
}

#[test]
fn single_request_chunks_then_decodes() {
    let mut s = scheduler(cfg(), 64, 16);
    s.add_request(req(1, 70, 5)).unwrap();
    let p = s.schedule().unwrap();
    assert_eq!(p.prefill.len(), 1);
    assert_eq!((p.prefill[0].start, p.prefill[0].len), (0, 32));
    assert!(!p.prefill[0].samples);
    let res = s.update(&run(&p, &s)).unwrap();
    assert!(res.finished.is_empty());
    let p = s.schedule().unwrap();
    assert_eq!((p.prefill[0].start, p.prefill[0].len), (32, 32));
    s.update(&run(&p, &s)).unwrap();
    let p = s.schedule().unwrap();
    assert_eq!(
        (p.prefill[0].start, p.prefill[0].len, p.prefill[0].samples),
        (64, 6, true)
    );
    s.update(&run(&p, &s)).unwrap();
    let p = s.schedule().unwrap();
    assert!(p.prefill.is_empty());
    assert_eq!(p.decode.len(), 1);
    assert_eq!(p.decode[0].position, 70);
    s.update(&run(&p, &s)).unwrap();
    let (done, _) = drive_sync(&mut s, 100);
    check_outputs(&done, &[(1, 70, 5)]).unwrap();
}

#[test]
fn bad_requests_are_rejected_and_the_rest_continue() {
    let mut s = scheduler(cfg(), 8, 16);
    let res = s.add_requests(vec![
        req(1, 10, 3),
        req(1, 10, 3),
        NewRequest::new(2, vec![], 3),
        req(3, 2000, 3),
        req(4, 200, 3),
        req(5, 10, 0),
        req(6, 12, 3),
    ]);
    assert!(res[0].is_ok());
    assert_eq!(res[1], Err(SchedError::DuplicateRequest(1)));
    assert_eq!(res[2], Err(SchedError::EmptyPrompt(2)));
    assert!(matches!(
        res[3],
        Err(SchedError::PromptTooLong { id: 3, .. })
    ));
    assert!(matches!(
        res[4],
        Err(SchedError::PromptExceedsPool { id: 4, .. })
    ));
    assert!(res[5].is_err());
    assert!(res[6].is_ok());
    let (done, _) = drive_sync(&mut s, 100);
    check_outputs(&done, &[(1, 10, 3), (6, 12, 3)]).unwrap();
}

#[test]
fn zero_budgets_are_errors() {
    for f in [
        |c: &mut SchedulerConfig| c.max_num_batched_tokens = 0,
        |c: &mut SchedulerConfig| c.max_num_seqs = 0,
        |c: &mut SchedulerConfig| c.max_model_len = 0,
        |c: &mut SchedulerConfig| c.max_chunk_tokens = 0,
        |c: &mut SchedulerConfig| c.step_time_budget = Some(0.0),
    ] {
        let mut c = cfg();
        f(&mut c);
        assert!(matches!(
            Scheduler::new(c, kv(8, 16)),
            Err(SchedError::ZeroBudget(_))
        ));
    }
}

#[test]
fn abort_at_any_moment() {
    let mut s = scheduler(cfg(), 64, 16);
    for id in 1..=3 {
        s.add_request(req(id, 40, 10)).unwrap();
    }
    // Abort a waiting request.
    let f = s.abort(3).unwrap();
    assert_eq!(
        (f.id, f.reason, f.output().len()),
        (3, FinishReason::Aborted, 0)
    );
    let p = s.schedule().unwrap();
    assert_eq!(p.aborted, vec![3]);
    // Abort a request in flight: its output is ignored.
    s.abort(1).unwrap();
    let res = s.update(&run(&p, &s)).unwrap();
    assert!(res.finished.is_empty());
    assert_eq!(s.abort(1), Err(SchedError::UnknownRequest(1)));
    let (done, _) = drive_sync(&mut s, 100);
    check_outputs(&done, &[(2, 40, 10)]).unwrap();
    assert_eq!(s.kv().usage().used, 0);
}

#[test]
fn stop_token_and_engine_stop_finish() {
    let mut s = scheduler(cfg(), 64, 16);
    let mut r = req(1, 10, 50);
    r.stop_tokens = vec![token(1, 13)];
    s.add_request(r).unwrap();
    s.add_request(req(2, 10, 50)).unwrap();
    let mut done = Vec::new();
    for _ in 0..20 {
        if s.is_idle() {
            break;
        }
        let p = s.schedule().unwrap();
        let mut out = run(&p, &s);
        // The engine reports a stop string for request 2 at its 3rd token.
        for (row, id) in out.rows.iter_mut().zip(p.requests()) {
            if id == 2 && s.tokens(2).unwrap().len() == 12 {
                row.stop = true;
            }
        }
        done.extend(s.update(&out).unwrap().finished);
    }
    let f1 = done.iter().find(|f| f.id == 1).unwrap();
    assert_eq!(f1.reason, FinishReason::Stop);
    assert_eq!(f1.output(), expected_output(1, 10, 4));
    let f2 = done.iter().find(|f| f.id == 2).unwrap();
    assert_eq!(f2.reason, FinishReason::Stop);
    assert_eq!(f2.output().len(), 3);
    // The history is handed over whole: the prompt, then the output.
    assert_eq!(f1.prompt_len, 10);
    assert_eq!(f1.tokens[..10], prompt(1, 10)[..]);
    assert_eq!(f1.clone().into_output(), f1.output());
}

#[test]
fn finished_output_views_never_panic() {
    let f = deepinfer_sched::Finished {
        id: 1,
        reason: FinishReason::Length,
        tokens: vec![1, 2, 3],
        prompt_len: 5,
    };
    assert!(f.output().is_empty());
    assert!(f.into_output().is_empty());
}

#[test]
fn output_mismatch_is_rejected_whole() {
    let mut s = scheduler(cfg(), 64, 16);
    s.add_request(req(1, 10, 3)).unwrap();
    let p = s.schedule().unwrap();
    let mut out = StepOutput::new(p.step);
    out.push(99, &[1], false);
    assert!(matches!(s.update(&out), Err(SchedError::OutputMismatch(_))));
    // The correct output still applies afterwards.
    s.update(&run(&p, &s)).unwrap();
    assert_eq!(s.update(&run(&p, &s)), Err(SchedError::NoStepInFlight));
}

#[test]
fn prefix_hit_skips_cached_blocks() {
    let mut s = scheduler(cfg(), 64, 16);
    s.add_request(NewRequest::new(1, shared_prompt(1, 48, 60), 2))
        .unwrap();
    drive_sync(&mut s, 100);
    s.add_request(NewRequest::new(2, shared_prompt(2, 48, 60), 2))
        .unwrap();
    let p = s.schedule().unwrap();
    assert_eq!(p.prefill[0].start, 48, "{p:?}");
    assert_eq!(s.stats().cached_tokens, 48);
}

#[test]
fn fixed_speculation_rolls_back_rejected_drafts() {
    let mut c = cfg();
    c.spec = SpecMode::Fixed(3);
    let mut s = scheduler(c, 64, 16);
    s.add_request(req(1, 20, 30)).unwrap();
    s.add_request(req(2, 5, 17)).unwrap();
    let (done, plans) = drive_sync(&mut s, 200);
    check_outputs(&done, &[(1, 20, 30), (2, 5, 17)]).unwrap();
    assert!(plans.iter().any(|p| p.decode.iter().any(|d| d.drafts == 3)));
    assert_eq!(s.kv().usage().used, 0);
}

#[test]
fn accepted_drafts_are_cached_under_their_real_ids() {
    // Drafts enter the KV manager as placeholders; `update` commits the
    // accepted ones under the engine's ids, so a later request whose prompt is
    // the whole history hits every full block, generated ones included.
    let mut c = cfg();
    c.spec = SpecMode::Fixed(3);
    let mut s = scheduler(c, 64, 16);
    s.add_request(req(1, 20, 30)).unwrap();
    let (done, plans) = drive_sync(&mut s, 200);
    assert!(plans.iter().any(|p| p.decode.iter().any(|d| d.drafts > 0)));
    let mut history = prompt(1, 20);
    history.extend_from_slice(done[0].output());
    assert_eq!(history.len(), 50);
    // Some drafts were accepted (fewer decode rows than generated tokens).
    let decode_rows: usize = plans.iter().map(|p| p.decode.len()).sum();
    assert!(decode_rows < 29, "{decode_rows} decode rows");
    s.add_request(NewRequest::new(2, history, 1)).unwrap();
    let p = s.schedule().unwrap();
    // 48 = the three full blocks (the hit rule leaves the last token to compute).
    assert_eq!(p.prefill[0].start, 48, "{p:?}");
}

#[test]
fn fork_copies_the_partial_block() {
    let mut s = scheduler(cfg(), 64, 16);
    s.add_request(req(1, 20, 30)).unwrap();
    let p = s.schedule().unwrap();
    s.update(&run(&p, &s)).unwrap();
    s.fork(1, 2).unwrap();
    assert_eq!(s.fork(1, 2), Err(SchedError::DuplicateRequest(2)));
    let p = s.schedule().unwrap();
    assert_eq!(p.block_copies.len(), 1);
    assert_eq!(p.decode.len(), 2);
    s.update(&run(&p, &s)).unwrap();
    let (done, _) = drive_sync(&mut s, 200);
    assert_eq!(done.len(), 2);
}

#[test]
fn overlapped_matches_sync_on_a_simple_batch() {
    let mk = || {
        let mut s = scheduler(cfg(), 64, 16);
        for id in 1..=5 {
            s.add_request(req(id, 10 + 7 * id as usize, 3 + id as usize))
                .unwrap();
        }
        s
    };
    let (a, _) = drive_sync(&mut mk(), 500);
    let (b, _) = drive_async(&mut mk(), 500);
    let reqs: Vec<_> = (1..=5)
        .map(|id| (id, 10 + 7 * id as usize, 3 + id as usize))
        .collect();
    check_outputs(&a, &reqs).unwrap();
    check_outputs(&b, &reqs).unwrap();
}

#[test]
fn memory_pressure_preempts_and_recomputes_from_cache() {
    let mut c = cfg();
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 128;
    c.max_chunk_tokens = 128;
    // 22 blocks of 16: six requests need 24 at full length.
    let mut s = scheduler(c, 22, 16);
    let reqs: Vec<_> = (1..=6).map(|id| (id, 30, 30)).collect();
    for &(id, len, n) in &reqs {
        s.add_request(req(id, len, n)).unwrap();
    }
    let (done, plans) = drive_sync(&mut s, 1000);
    check_outputs(&done, &reqs).unwrap();
    assert!(s.stats().preemptions > 0);
    assert!(plans.iter().any(|p| !p.preempted.is_empty()));
    // Re-admissions hit the blocks the preempted requests left in the cache.
    assert!(s.stats().cached_tokens > 0);
    assert_eq!(s.kv().usage().used, 0);
}

#[test]
fn priorities_run_first_and_preempt_lower() {
    let mut c = cfg();
    c.max_num_seqs = 1;
    let mut s = scheduler(c, 64, 16);
    s.add_request(req(1, 10, 5)).unwrap();
    let mut hi = req(2, 10, 5);
    hi.priority = 5;
    s.add_request(hi).unwrap();
    let p = s.schedule().unwrap();
    assert_eq!(p.prefill[0].request, 2);
    s.update(&run(&p, &s)).unwrap();
    let (done, _) = drive_sync(&mut s, 100);
    assert_eq!(done[0].id, 2);
    check_outputs(&done, &[(1, 10, 5), (2, 10, 5)]).unwrap();
}

#[test]
fn budgeted_speculation_gives_confident_requests_more_drafts() {
    use deepinfer_spec::{Planner, PlannerConfig, StepTimeModel};
    let mut c = cfg();
    c.spec = SpecMode::Budgeted { max_drafts: 3 };
    let model = StepTimeModel::staircase(&[(4, 10.0), (6, 13.0), (8, 16.0)]).unwrap();
    let planner = Planner::new(model, PlannerConfig::default()).unwrap();
    let mut s = scheduler(c, 64, 16).with_planner(planner);
    s.add_request(req(1, 8, 40)).unwrap();
    s.add_request(req(2, 8, 40)).unwrap();
    let mut saw = None;
    let mut done = Vec::new();
    for _ in 0..200 {
        if s.is_idle() {
            break;
        }
        let p = s.schedule().unwrap();
        if p.decode.len() == 2 && p.decode.iter().any(|d| d.drafts > 0) {
            saw.get_or_insert((p.decode[0].drafts, p.decode[1].drafts));
        }
        let base = run(&p, &s);
        // Same tokens; the drafter reports 0.9 confidences for request 1, 0.5 for 2.
        let mut out = StepOutput::new(p.step);
        let mut at = 0;
        for r in &base.rows {
            let toks = &base.tokens[at..at + r.num_tokens as usize];
            at += r.num_tokens as usize;
            let conf = if r.request == 1 { [0.9; 3] } else { [0.5; 3] };
            out.push_with_confidences(r.request, toks, r.stop, &conf);
        }
        done.extend(s.update(&out).unwrap().finished);
    }
    // The worked example of the spec crate: A verifies three drafts, B one.
    assert_eq!(saw, Some((3, 1)));
    check_outputs(&done, &[(1, 8, 40), (2, 8, 40)]).unwrap();
}

#[test]
fn without_chunking_prompts_run_whole() {
    let mut c = cfg();
    c.chunked_prefill = false;
    c.max_chunk_tokens = 64;
    let mut s = scheduler(c, 64, 16);
    s.add_request(req(1, 40, 3)).unwrap();
    s.add_request(req(2, 30, 3)).unwrap();
    let p = s.schedule().unwrap();
    // 64 tokens of budget: request 1 whole; request 2 (30) would need chunking, so it waits.
    assert_eq!(p.prefill.len(), 1);
    assert_eq!((p.prefill[0].request, p.prefill[0].len), (1, 40));
    s.update(&run(&p, &s)).unwrap();
    let p = s.schedule().unwrap();
    assert_eq!((p.prefill[0].request, p.prefill[0].len), (2, 30));
    s.update(&run(&p, &s)).unwrap();
    let (done, _) = drive_sync(&mut s, 100);
    check_outputs(&done, &[(1, 40, 3), (2, 30, 3)]).unwrap();
}

#[test]
fn push_token_builds_the_same_output_as_push() {
    let mut a = StepOutput::new(3);
    let mut b = StepOutput::new(3);
    a.push(1, &[5], false);
    a.push(2, &[], false);
    a.push(3, &[6], true);
    b.push_token(1, 5, false);
    b.push(2, &[], false);
    b.push_token(3, 6, true);
    assert_eq!(a, b);
}

#[test]
fn dense_decode_output_is_checked_and_applied() {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 64,
        ..Default::default()
    };
    let mut s = scheduler(cfg, 64, 4);
    for id in 0..3 {
        s.add_request(NewRequest::new(id, prompt(id, 5), 4))
            .unwrap();
    }
    let plan = s.schedule().unwrap();
    let out = run(&plan, &s);
    s.update(&out).unwrap();
    let plan = s.schedule().unwrap();
    assert_eq!(plan.decode.len(), 3);
    // Too few dense tokens: rejected whole, nothing changes.
    let mut out = StepOutput::new(plan.step);
    out.push_decode(1);
    assert!(matches!(s.update(&out), Err(SchedError::OutputMismatch(_))));
    // Dense decode tokens mixed with row groups for the same rows: rejected.
    let mut out = run_dense(&plan, &s);
    out.push_token(0, 1, false);
    assert!(matches!(s.update(&out), Err(SchedError::OutputMismatch(_))));
    let out = run_dense(&plan, &s);
    assert!(s.update(&out).unwrap().finished.is_empty());
    for id in 0..3 {
        assert_eq!(s.tokens(id).unwrap()[5..], expected_output(id, 5, 2)[..]);
    }
}

/// Many requests finishing at scattered steps make the running slab renumber
/// itself (every 16 steps when out of order) while a step is in flight: every
/// request still ends with exactly its true tokens, and no block leaks.
#[test]
fn renumbered_running_slab_keeps_rows_in_flight() {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 256,
        max_num_seqs: 64,
        ..Default::default()
    };
    let mut s = scheduler(cfg, 512, 4);
    let n = 48u64;
    for id in 0..n {
        let max_new = 5 + (id as usize * 7) % 60;
        s.add_request(NewRequest::new(
            id,
            prompt(id, 3 + id as usize % 9),
            max_new,
        ))
        .unwrap();
    }
    let mut done = Vec::new();
    let mut pending: Option<deepinfer_sched::StepPlan> = None;
    for step in 0..2000 {
        if step == 40 {
            done.push(s.abort(7).unwrap());
        }
        if s.is_idle() && pending.is_none() {
            break;
        }
        let plan = match pending.take() {
            Some(p) => p,
            None => s.schedule().unwrap(),
        };
        let out = if step % 2 == 0 {
            run(&plan, &s)
        } else {
            run_dense(&plan, &s)
        };
        let mut next = s.schedule().unwrap();
        let res = s.update(&out).unwrap();
        done.extend(res.finished.iter().cloned());
        res.apply_to(&mut next);
        pending = Some(next);
    }
    assert!(s.is_idle());
    assert_eq!(done.len(), n as usize);
    for f in &done {
        let id = f.id;
        let exp = expected_output(id, 3 + id as usize % 9, 5 + (id as usize * 7) % 60);
        if id == 7 {
            assert!(exp.starts_with(f.output()));
        } else {
            assert_eq!(f.output(), exp, "request {id}");
        }
    }
    assert_eq!(s.kv().usage().used, 0);
}

/// Two-step overlap: the plan for step N+2 is made while N and N+1 are both
/// unconfirmed; its rows sit on the provisional rows of N+1 (one position
/// further), a fourth plan is refused, and the pipeline ends with the true
/// tokens.
#[test]
fn two_step_overlap_plans_rows_on_provisional_rows() {
    let mut s = scheduler(SchedulerConfig::default(), 64, 4);
    s.add_request(NewRequest::new(1, prompt(1, 6), 5)).unwrap();
    let p0 = s.schedule().unwrap();
    let mut p1 = s.schedule().unwrap();
    let mut p2 = s.schedule().unwrap();
    assert_eq!(p0.prefill[0].len, 6);
    assert_eq!((p1.decode[0].position, p1.decode[0].provisional), (6, true));
    assert_eq!((p2.decode[0].position, p2.decode[0].provisional), (7, true));
    assert_eq!(s.schedule(), Err(SchedError::TooManyInFlight));
    let res = s.update(&run(&p0, &s)).unwrap();
    res.apply_to(&mut p1);
    res.apply_later_to(&mut p2);
    assert!(!p1.decode[0].provisional);
    assert!(p2.decode[0].provisional);
    let mut queue = std::collections::VecDeque::from([p1, p2]);
    let mut done = Vec::new();
    while let Some(plan) = queue.pop_front() {
        let out = run(&plan, &s);
        while queue.len() < 2 && !s.is_idle() {
            queue.push_back(s.schedule().unwrap());
        }
        let res = s.update(&out).unwrap();
        done.extend(res.finished.iter().cloned());
        if let Some(p) = queue.get_mut(0) {
            res.apply_to(p);
        }
        if let Some(p) = queue.get_mut(1) {
            res.apply_later_to(p);
        }
    }
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].output(), expected_output(1, 6, 5));
    assert_eq!(s.kv().usage().used, 0);
}

/// A provisional row counts the token still being sampled: near
/// `max_new_tokens` it plans as many drafts as the synchronous loop would.
#[test]
fn provisional_row_drafts_count_the_token_in_flight() {
    let cfg = SchedulerConfig {
        spec: SpecMode::Fixed(3),
        ..Default::default()
    };
    let mut s = scheduler(cfg, 64, 4);
    // Prompt 4, 3 new tokens: the first comes from the prefill, the second from
    // the first decode row, which can use at most 1 draft (one token left).
    s.add_request(NewRequest::new(1, prompt(1, 4), 3)).unwrap();
    let p0 = s.schedule().unwrap();
    let p1 = s.schedule().unwrap();
    assert!(p1.decode[0].provisional);
    assert_eq!(p1.decode[0].drafts, 1);
    // The synchronous loop plans the same.
    let mut t = scheduler(
        SchedulerConfig {
            spec: SpecMode::Fixed(3),
            ..Default::default()
        },
        64,
        4,
    );
    t.add_request(NewRequest::new(1, prompt(1, 4), 3)).unwrap();
    let q0 = t.schedule().unwrap();
    t.update(&run(&q0, &t)).unwrap();
    assert_eq!(t.schedule().unwrap().decode[0].drafts, 1);
    drop(p0);
}
