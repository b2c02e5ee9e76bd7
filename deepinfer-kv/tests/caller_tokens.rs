//! A sequence whose caller keeps the token ids (`AllocateOptions::caller_keeps_tokens`) is
//! cached exactly like one whose tokens the manager keeps: after the same appends, drafts,
//! commits, rollbacks and progress reports (given the caller's tokens), both managers count the
//! same tokens, hold the same blocks and find the same cached chain for any query.

use deepinfer_kv::testing;
use deepinfer_kv::{AllocateOptions, BlockManager, BlockManagerConfig, ExtraKeys, KvError};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// Append committed tokens.
    Append(Vec<u32>),
    /// Report this fraction (per mille) of the committed tokens computed.
    Mark(u16),
    /// Append `k` placeholder drafts, then commit these accepted ids (at most `k`).
    Drafts(usize, Vec<u32>),
    /// Remove up to this many committed tokens (not past the computed ones).
    Rollback(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        prop::collection::vec(0u32..6, 1..12).prop_map(Op::Append),
        (0u16..=1000).prop_map(Op::Mark),
        (1usize..5, prop::collection::vec(0u32..6, 0..5)).prop_map(|(k, a)| Op::Drafts(k, a)),
        (0usize..6).prop_map(Op::Rollback),
    ]
}

fn manager(bs: usize) -> BlockManager {
    BlockManager::new(BlockManagerConfig::new(256, bs)).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn caller_kept_tokens_cache_like_kept_tokens(
        prompt in prop::collection::vec(0u32..6, 1..40),
        bs in prop::sample::select(vec![2usize, 4, 8]),
        ops in prop::collection::vec(op(), 0..40),
        query_cut in 0usize..50,
    ) {
        let mut a = manager(bs);
        let mut b = manager(bs);
        a.allocate(1, &prompt, AllocateOptions::default()).unwrap();
        let opts = AllocateOptions { caller_keeps_tokens: true, ..Default::default() };
        b.allocate(1, &prompt, opts).unwrap();
        let (ha, hb) = (a.handle(1).unwrap(), b.handle(1).unwrap());
        prop_assert_eq!(b.tokens(1), Err(KvError::TokensNotKept(1)));
        // The caller's copy of the committed tokens.
        let mut hist = prompt.clone();
        let mut slots = Vec::new();
        for op in &ops {
            match op {
                Op::Append(t) => {
                    a.extend_by_handle(ha, t).unwrap();
                    b.extend_by_handle(hb, t).unwrap();
                    hist.extend_from_slice(t);
                }
                Op::Mark(f) => {
                    let n = hist.len() * usize::from(*f) / 1000;
                    a.mark_computed_by_handle(ha, n).unwrap();
                    b.mark_computed_with(hb, n, &hist).unwrap();
                }
                Op::Drafts(k, acc) => {
                    let placeholders = vec![u32::MAX; *k];
                    a.append_draft_by_handle(ha, &placeholders, &mut slots).unwrap();
                    b.append_draft_by_handle(hb, &placeholders, &mut slots).unwrap();
                    let acc = &acc[..acc.len().min(*k)];
                    let ca = a.commit_drafts(1, acc).unwrap();
                    let cb = b.commit_drafts(1, acc).unwrap();
                    prop_assert_eq!(ca, cb);
                    hist.extend_from_slice(acc);
                }
                Op::Rollback(n) => {
                    let computed = a.num_computed(1).unwrap();
                    let n = (*n).min(hist.len().saturating_sub(computed.max(1)));
                    let ca = a.rollback(1, n).unwrap();
                    let cb = b.rollback(1, n).unwrap();
                    prop_assert_eq!(ca, cb);
                    hist.truncate(hist.len() - n);
                }
            }
            prop_assert_eq!(a.num_committed(1), b.num_committed(1));
            prop_assert_eq!(a.num_computed(1), b.num_computed(1));
            prop_assert_eq!(a.block_table(1).unwrap(), b.block_table(1).unwrap());
            prop_assert_eq!(a.tokens(1).unwrap(), &hist[..]);
            testing::check_invariants(&a).map_err(TestCaseError::fail)?;
            testing::check_invariants(&b).map_err(TestCaseError::fail)?;
        }
        // Caller-kept blocks are registered when the caller reports progress with its tokens.
        let n = a.num_computed(1).unwrap();
        a.mark_computed_by_handle(ha, n).unwrap();
        b.mark_computed_with(hb, n, &hist).unwrap();
        prop_assert_eq!(a.usage(), b.usage());
        let q = &hist[..query_cut.min(hist.len())];
        let ma = a.match_prefix(q, &ExtraKeys::default());
        let mb = b.match_prefix(q, &ExtraKeys::default());
        prop_assert_eq!(ma, mb);
        // And both serve the same hit to a new request.
        let ra = a.allocate(2, &hist, AllocateOptions::default()).unwrap();
        let rb = b.allocate(2, &hist, AllocateOptions::default()).unwrap();
        prop_assert_eq!(ra, rb);
        testing::check_invariants(&a).map_err(TestCaseError::fail)?;
        testing::check_invariants(&b).map_err(TestCaseError::fail)?;
    }
}

/// Progress reported without the caller's tokens registers nothing until they come.
#[test]
fn registration_waits_for_the_callers_tokens() {
    let mut m = manager(4);
    let prompt: Vec<u32> = (0..8).collect();
    let opts = AllocateOptions {
        caller_keeps_tokens: true,
        ..Default::default()
    };
    m.allocate(1, &prompt, opts).unwrap();
    let h = m.handle(1).unwrap();
    m.mark_computed_by_handle(h, 8).unwrap();
    assert_eq!(m.usage().cached, 0);
    m.mark_computed_with(h, 8, &prompt).unwrap();
    assert_eq!(m.usage().cached, 2);
    // A shorter slice registers only the blocks it covers.
    let mut m = manager(4);
    let opts = AllocateOptions {
        caller_keeps_tokens: true,
        ..Default::default()
    };
    m.allocate(1, &prompt, opts).unwrap();
    let h = m.handle(1).unwrap();
    m.mark_computed_with(h, 8, &prompt[..5]).unwrap();
    assert_eq!(m.usage().cached, 1);
}
