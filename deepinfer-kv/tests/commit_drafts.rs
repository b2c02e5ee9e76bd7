//! `commit_drafts` (placeholder drafts committed under their real ids) and handle-based appends,
//! against a reference manager that appends the same real tokens plainly.

use deepinfer_kv::testing;
use deepinfer_kv::{BlockManager, BlockManagerConfig, ExtraKeys, KvError, Slot};
use proptest::prelude::*;

const BS: usize = 4;
const NUM_BLOCKS: usize = 64;
const PLACEHOLDER: u32 = u32::MAX;

fn manager() -> BlockManager {
    let mut cfg = BlockManagerConfig::new(NUM_BLOCKS, BS);
    cfg.watermark = 0.0;
    BlockManager::new(cfg).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn commit_drafts_equals_plain_append(
        prompt in prop::collection::vec(0u32..50, 1..12),
        steps in testing::spec_steps(1..16),
        fork_at in 0usize..16,
    ) {
        let mut m = manager();
        let mut r = manager();
        m.allocate(1, &prompt, Default::default()).unwrap();
        r.allocate(1, &prompt, Default::default()).unwrap();
        m.mark_computed(1, prompt.len()).unwrap();
        r.mark_computed(1, prompt.len()).unwrap();
        let mut forked = false;
        for (k, st) in steps.iter().enumerate() {
            if k == fork_at && !forked {
                // A forked child shares the full blocks: ref counts must stay consistent.
                m.fork(1, 2).unwrap();
                forked = true;
            }
            let h = m.handle(1).unwrap();
            let input_slot = m.append_token(h, st.input).unwrap();
            let mut slots = Vec::new();
            m.append_draft_by_handle(h, &vec![PLACEHOLDER; st.drafts], &mut slots).unwrap();
            let len = m.tokens(1).unwrap().len();
            // The engine computed the input row and every draft row.
            m.mark_computed(1, len).unwrap();
            r.append_slots(1, &[st.input]).unwrap();
            let accepted = &st.real[..st.accepted.min(6)];
            if accepted.len() > st.drafts {
                let before = (m.tokens(1).unwrap().to_vec(), m.block_table(1).unwrap().to_vec(), m.usage());
                prop_assert_eq!(
                    m.commit_drafts(1, accepted),
                    Err(KvError::TooManyAccepted { accepted: accepted.len(), drafts: st.drafts })
                );
                let after = (m.tokens(1).unwrap().to_vec(), m.block_table(1).unwrap().to_vec(), m.usage());
                prop_assert_eq!(before, after);
                // Reject them all instead.
                m.commit_drafts(1, &[]).unwrap();
            } else {
                let copy = m.commit_drafts(1, accepted).unwrap();
                prop_assert!(copy.is_none(), "no block of a private tail is shared");
                // Accepted drafts keep their slots.
                let table = m.block_table(1).unwrap();
                let base = len - st.drafts;
                for (j, s) in slots.iter().take(accepted.len()).enumerate() {
                    let p = base + j;
                    prop_assert_eq!(*s, Slot { block: table[p / BS], offset: (p % BS) as u32 });
                }
                r.append_slots(1, accepted).unwrap();
            }
            let rl = r.tokens(1).unwrap().len();
            r.mark_computed(1, rl).unwrap();
            prop_assert_eq!(m.tokens(1).unwrap(), r.tokens(1).unwrap());
            prop_assert_eq!(m.num_committed(1).unwrap(), rl);
            prop_assert_eq!(m.block_table(1).unwrap().len(), rl.div_ceil(BS));
            prop_assert!(input_slot.offset < BS as u32);
            // Full committed, computed blocks are cached under the hashes of the real ids.
            let chain = m.prefix_hashes(r.tokens(1).unwrap(), &ExtraKeys::none());
            let mt = m.block_table(1).unwrap();
            let rt = r.block_table(1).unwrap();
            for (i, &hsh) in chain.iter().enumerate() {
                prop_assert_eq!(m.pool().hash_of(mt[i]), Some(hsh), "block {}", i);
                prop_assert_eq!(r.pool().hash_of(rt[i]), Some(hsh));
            }
            // Ref counts: every block of the tables is counted once per table.
            let mut used: Vec<u32> = m.block_table(1).unwrap().to_vec();
            if forked {
                used.extend_from_slice(m.block_table(2).unwrap());
            }
            used.sort_unstable();
            used.dedup();
            prop_assert_eq!(m.usage().used, used.len());
            for &b in &used {
                let expect = u32::from(m.block_table(1).unwrap().contains(&b))
                    + u32::from(forked && m.block_table(2).unwrap().contains(&b));
                prop_assert_eq!(m.pool().ref_count(b).unwrap(), expect);
            }
            testing::check_invariants(&m).map_err(TestCaseError::fail)?;
            testing::check_invariants(&r).map_err(TestCaseError::fail)?;
        }
        // A new request with the whole history hits every full block, generated ones included.
        let history = r.tokens(1).unwrap().to_vec();
        let a = m.allocate(3, &history, Default::default()).unwrap();
        // (The hit rule always leaves the last token to compute.)
        prop_assert_eq!(a.plan.reused_tokens, (history.len() - 1) / BS * BS);
        // No leaked block.
        for s in [1, 2, 3] {
            let _ = m.free(s);
        }
        prop_assert_eq!(m.usage().free(), NUM_BLOCKS);
        prop_assert_eq!(m.usage().used, 0);
        testing::check_invariants(&m).map_err(TestCaseError::fail)?;
    }
}

#[test]
fn reserve_changes_nothing_visible() {
    let mut m = manager();
    m.allocate(1, &[1, 2, 3], Default::default()).unwrap();
    let before = (
        m.tokens(1).unwrap().to_vec(),
        m.block_table(1).unwrap().to_vec(),
        m.usage(),
    );
    m.reserve(1, 1000).unwrap();
    let after = (
        m.tokens(1).unwrap().to_vec(),
        m.block_table(1).unwrap().to_vec(),
        m.usage(),
    );
    assert_eq!(before, after);
    assert_eq!(m.reserve(2, 1), Err(KvError::UnknownSequence(2)));
}

#[test]
fn stale_handle_is_rejected() {
    let mut m = manager();
    m.allocate(5, &[1, 2, 3], Default::default()).unwrap();
    let h = m.handle(5).unwrap();
    assert_eq!(h.id(), 5);
    m.free(5).unwrap();
    // Another sequence now occupies the same table entry.
    m.allocate(6, &[1, 2, 3], Default::default()).unwrap();
    assert_eq!(m.append_token(h, 9), Err(KvError::UnknownSequence(5)));
    assert_eq!(m.tokens(6).unwrap(), &[1, 2, 3]);
    assert_eq!(m.handle(7), Err(KvError::UnknownSequence(7)));
}

#[test]
fn append_token_refuses_pending_drafts_and_reports_its_slot() {
    let mut m = manager();
    m.allocate(1, &[1, 2, 3], Default::default()).unwrap();
    let h = m.handle(1).unwrap();
    assert_eq!(
        m.append_token(h, 4).unwrap(),
        Slot {
            block: m.block_table(1).unwrap()[0],
            offset: 3
        }
    );
    let s = m.append_token(h, 5).unwrap();
    assert_eq!((s.block, s.offset), (m.block_table(1).unwrap()[1], 0));
    // push_token is append_token without the slot.
    m.push_token(h, 8).unwrap();
    let t = m.block_table(1).unwrap().to_vec();
    assert_eq!(t.len(), 2);
    for _ in 0..3 {
        m.push_token(h, 8).unwrap();
    }
    assert_eq!(m.block_table(1).unwrap().len(), 3);
    assert_eq!(&m.block_table(1).unwrap()[..2], &t[..]);
    assert_eq!(m.tokens(1).unwrap(), &[1, 2, 3, 4, 5, 8, 8, 8, 8]);
    m.append_draft(1, &[7], &mut Vec::new()).unwrap();
    assert_eq!(m.append_token(h, 6), Err(KvError::DraftsPending(1)));
    assert_eq!(m.push_token(h, 6), Err(KvError::DraftsPending(1)));
    assert_eq!(m.commit_drafts(9, &[]), Err(KvError::UnknownSequence(9)));
}

#[test]
fn mark_computed_by_handle_matches_mark_computed() {
    // Two managers fed the same tokens; one reports progress by id, the other by handle.
    let (mut a, mut b) = (manager(), manager());
    let prompt: Vec<u32> = (0..10).collect();
    a.allocate(1, &prompt, Default::default()).unwrap();
    b.allocate(1, &prompt, Default::default()).unwrap();
    let h = b.handle(1).unwrap();
    for n in [3, 8, 9, 10] {
        a.mark_computed(1, n).unwrap();
        b.mark_computed_by_handle(h, n).unwrap();
        assert_eq!(a.num_computed(1), b.num_computed(1));
        assert_eq!(a.usage(), b.usage());
    }
    // Full computed blocks are cached the same way: a second prompt hits two blocks in both.
    for m in [&mut a, &mut b] {
        let hit = m.allocate(2, &prompt, Default::default()).unwrap();
        assert_eq!(hit.plan.reused_tokens, 8);
    }
    assert_eq!(
        b.mark_computed_by_handle(h, 11),
        Err(KvError::ComputedPastEnd {
            requested: 11,
            len: 10
        })
    );
    b.free(1).unwrap();
    assert_eq!(
        b.mark_computed_by_handle(h, 1),
        Err(KvError::UnknownSequence(1))
    );
}

#[test]
fn prefetch_changes_nothing_even_with_a_stale_handle() {
    let mut m = manager();
    m.allocate(1, &[1, 2, 3], Default::default()).unwrap();
    let h = m.handle(1).unwrap();
    let before = (m.tokens(1).unwrap().to_vec(), m.usage());
    m.prefetch(h, false);
    m.prefetch(h, true);
    assert_eq!((m.tokens(1).unwrap().to_vec(), m.usage()), before);
    m.free(1).unwrap();
    m.prefetch(h, true);
    assert_eq!(m.handle(1), Err(KvError::UnknownSequence(1)));
}

#[test]
fn mark_computed_batch_matches_one_by_one_and_is_all_or_nothing() {
    let (mut a, mut b) = (manager(), manager());
    for m in [&mut a, &mut b] {
        m.allocate(1, &(0..9).collect::<Vec<u32>>(), Default::default())
            .unwrap();
        m.allocate(2, &(100..106).collect::<Vec<u32>>(), Default::default())
            .unwrap();
    }
    let (h1, h2) = (a.handle(1).unwrap(), a.handle(2).unwrap());
    a.mark_computed_batch(&[(h1, 8), (h2, 4)]).unwrap();
    b.mark_computed(1, 8).unwrap();
    b.mark_computed(2, 4).unwrap();
    for id in [1, 2] {
        assert_eq!(a.num_computed(id), b.num_computed(id));
    }
    assert_eq!(a.usage(), b.usage());
    // The filled blocks are cached the same way.
    let hit = a.allocate(3, &(0..9).collect::<Vec<u32>>(), Default::default());
    assert_eq!(hit.unwrap().plan.reused_tokens, 8);
    // A count past the end anywhere in the batch: an error, nothing marked.
    let before = (a.num_computed(1), a.num_computed(2));
    assert_eq!(
        a.mark_computed_batch(&[(h1, 9), (h2, 7)]),
        Err(KvError::ComputedPastEnd {
            requested: 7,
            len: 6
        })
    );
    assert_eq!((a.num_computed(1), a.num_computed(2)), before);
    a.free(2).unwrap();
    assert_eq!(
        a.mark_computed_batch(&[(h1, 9), (h2, 5)]),
        Err(KvError::UnknownSequence(2))
    );
    assert_eq!(a.num_computed(1), before.0);
}
