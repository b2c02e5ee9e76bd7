//! The block manager keeps no copy of a request's tokens (the scheduler's
//! history is the token list: `AllocateOptions::caller_keeps_tokens`), and the
//! scheduler tells it of decode inputs one block at a time (a steady decode row
//! only counts its input). These tests check what that must not change: every
//! full computed block of a live request is cached under the hash of its real
//! tokens (a lookup of the history finds them all), blocks filled while
//! decoding hit for a later prompt equal to the history, and the cache still
//! serves a request preempted mid-decode when it is re-admitted.

use deepinfer_kv::{ExtraKeys, KvError};
use deepinfer_sched::testing::*;
use deepinfer_sched::{NewRequest, RequestId, Scheduler, SchedulerConfig, SpecMode, StepPlan};
use proptest::prelude::*;

/// For every live request: the manager counts no more tokens than the history
/// holds and keeps none itself; with `lookup`, every full block whose KV is
/// computed is found in the prefix cache by the hashes of the history (so it
/// was registered under the real tokens).
fn check_kv_matches_history(s: &mut Scheduler, ids: impl Iterator<Item = RequestId>, lookup: bool) {
    // The block manager's own invariants, and no token copy of its own.
    if let Err(e) = check_invariants(s) {
        panic!("{e}");
    }
    let bs = s.kv().block_size();
    for id in ids {
        let Some(h) = s.tokens(id).map(<[u32]>::to_vec) else {
            continue;
        };
        let (Ok(c), Ok(done)) = (s.kv().num_committed(id), s.kv().num_computed(id)) else {
            continue;
        };
        assert!(
            c <= h.len(),
            "request {id}: {c} committed, history {}",
            h.len()
        );
        assert_eq!(s.kv().tokens(id), Err(KvError::TokensNotKept(id)));
        if lookup {
            let m = s.kv_mut().match_prefix(&h, &ExtraKeys::default());
            let full = done.min(c) / bs;
            assert!(
                m.blocks.len() >= full,
                "request {id}: {} of {full} computed blocks found",
                m.blocks.len()
            );
        }
    }
}

/// How the fake engine answers and how far the scheduler plans ahead.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Rows,
    Dense,
    Overlapped,
    TwoStep,
}

/// Drives `s` until idle in `mode`, checking the manager's tokens after every update.
fn drive(s: &mut Scheduler, mode: Mode, ids: std::ops::Range<RequestId>, lookup: bool) {
    let depth = match mode {
        Mode::Rows | Mode::Dense => 0,
        Mode::Overlapped => 1,
        Mode::TwoStep => 2,
    };
    let mut queue: std::collections::VecDeque<StepPlan> = Default::default();
    for _ in 0..2000 {
        if s.is_idle() && queue.is_empty() {
            return;
        }
        let plan = match queue.pop_front() {
            Some(p) => p,
            None => s.schedule().unwrap(),
        };
        let out = match mode {
            Mode::Dense => run_dense(&plan, s),
            _ => run(&plan, s),
        };
        while queue.len() < depth && !s.is_idle() {
            queue.push_back(s.schedule().unwrap());
        }
        let res = s.update(&out).unwrap();
        if let Some(p) = queue.get_mut(0) {
            res.apply_to(p);
        }
        if let Some(p) = queue.get_mut(1) {
            res.apply_later_to(p);
        }
        check_kv_matches_history(s, ids.clone(), lookup);
    }
    panic!("not idle after 2000 steps");
}

fn config(chunk: usize, drafts: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: 64,
        max_num_seqs: 8,
        max_model_len: 1024,
        max_chunk_tokens: chunk,
        spec: if drafts > 0 {
            SpecMode::Fixed(drafts)
        } else {
            SpecMode::Off
        },
        ..Default::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// After a request finishes, a prompt equal to its whole history reuses
    /// every full block whose KV was computed (all but the last token), the
    /// blocks filled while decoding included: their hashes come from the same
    /// tokens as a fresh prompt's.
    #[test]
    fn decoded_blocks_hit_under_their_history(
        len in 1usize..60,
        max_new in 1usize..70,
        bs in prop::sample::select(vec![4usize, 8, 16]),
        chunk in 1usize..40,
        mode in prop::sample::select(vec![Mode::Rows, Mode::Dense, Mode::Overlapped, Mode::TwoStep]),
        drafts in 0usize..3,
    ) {
        // Speculation only with answers that can accept drafts.
        let drafts = if matches!(mode, Mode::Rows | Mode::Overlapped) { drafts } else { 0 };
        let mut s = scheduler(config(chunk, drafts), 256, bs);
        s.add_request(req(1, len, max_new)).unwrap();
        drive(&mut s, mode, 1..2, true);
        let mut history = prompt(1, len);
        history.extend((len..len + max_new).map(|p| token(1, p)));
        let h = history.len();
        s.add_request(NewRequest::new(2, history, 1)).unwrap();
        let p = s.schedule().unwrap();
        prop_assert_eq!(p.prefill[0].start, (h - 1) / bs * bs, "{:?}", p);
    }

    /// Many requests under memory pressure, preempted and re-admitted: the
    /// manager's committed tokens stay a prefix of each history throughout, and
    /// every request still ends with its true output.
    #[test]
    fn kv_tokens_follow_the_history_under_pressure(
        reqs in prop::collection::vec((1usize..40, 1usize..40), 1..8),
        bs in prop::sample::select(vec![4usize, 8]),
        chunk in 1usize..40,
        extra in 0usize..12,
        mode in prop::sample::select(vec![Mode::Rows, Mode::Dense, Mode::Overlapped, Mode::TwoStep]),
    ) {
        let need = reqs.iter().map(|r| r.0 + r.1 + 1).max().unwrap_or(1);
        let blocks = need.div_ceil(bs) + 1 + extra;
        let mut s = scheduler(config(chunk, 0), blocks, bs);
        for (i, &(len, n)) in reqs.iter().enumerate() {
            s.add_request(req(i as RequestId, len, n)).unwrap();
        }
        // (No lookups: under pressure a block whose twin holds the hash may
        // see that twin evicted.)
        drive(&mut s, mode, 0..reqs.len() as RequestId, false);
        prop_assert_eq!(s.kv().usage().used, 0);
    }
}

/// A request preempted mid-decode is re-admitted from the cache: its first
/// chunk after re-admission starts at the last full block of the tokens whose
/// KV it had computed, blocks filled while decoding included.
#[test]
fn preempted_request_hits_its_decoded_blocks() {
    let bs = 4;
    let c = SchedulerConfig {
        max_num_batched_tokens: 256,
        max_num_seqs: 8,
        max_model_len: 1024,
        max_chunk_tokens: 256,
        ..Default::default()
    };
    // 14 blocks: A (8-token prompt, 60 new) needs 17 at full length.
    let mut s = scheduler(c, 14, bs);
    s.add_request(req(1, 8, 60)).unwrap();
    // A decodes until its history is 30 tokens (7 full computed blocks).
    let mut steps = 0;
    while s.tokens(1).unwrap().len() < 30 {
        let p = s.schedule().unwrap();
        s.update(&run(&p, &s)).unwrap();
        steps += 1;
        assert!(steps < 100);
    }
    // B, of higher priority, takes the 6 free blocks (and needs no more), so A
    // runs out of room at its next block boundary and is preempted (the lowest
    // priority); its blocks stay cached until it comes back.
    let mut b = req(2, 21, 4);
    b.priority = 1;
    s.add_request(b).unwrap();
    let mut readmitted = None;
    let mut preempted_at = None;
    for _ in 0..400 {
        if s.is_idle() {
            break;
        }
        let p = s.schedule().unwrap();
        if p.preempted.contains(&1) && readmitted.is_none() {
            preempted_at = Some(s.tokens(1).unwrap().len());
        }
        if preempted_at.is_some() && readmitted.is_none() {
            readmitted = p.prefill.iter().find(|c| c.request == 1).copied();
        }
        s.update(&run(&p, &s)).unwrap();
        check_kv_matches_history(&mut s, 1..3, true);
    }
    assert!(s.is_idle());
    let h = preempted_at.expect("A was never preempted");
    let c = readmitted.expect("A was never re-admitted");
    // Everything but its last token was computed; full blocks of those hit.
    assert_eq!(c.start, (h - 1) / bs * bs, "{c:?} after preemption at {h}");
    assert!(c.start > 8, "only the prompt hit: {c:?}");
}
