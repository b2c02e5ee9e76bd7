//! Random sequences of allocate / append / draft / accept / commit / compute / rollback / fork / free /
//! match / evict / import / reset against a shadow model of every block's contents.
//!
//! The shadow records which token each slot of each block holds, as the engine would write it.
//! After every operation it checks: ref counts equal the number of block tables using each block;
//! free + used = total; no block is both free and in a table; every block table covers exactly
//! its sequence's tokens; a prefix hit or match returns only blocks whose contents equal the
//! query's tokens; no write lands in a block that is shared or cached; a failed operation changes
//! nothing.

use std::collections::HashMap;

use deepinfer_kv::testing::{self, BLOCK_SIZE as BS, Effect, NUM_BLOCKS, Op, Snapshot};
use deepinfer_kv::{BlockId, BlockManager, BlockManagerConfig, HitRule, KvError, Slot};
use proptest::prelude::*;

/// For every block, the token context its KV was computed in: all tokens from the start of the
/// sequence that wrote it through the block's last written slot. KV depends on the whole prefix,
/// so a block may serve a prompt only if this context starts with the prompt's tokens up to the
/// block's end.
struct Shadow {
    content: HashMap<BlockId, Vec<u32>>,
    seqs: HashMap<u64, Vec<u32>>,
}

impl Shadow {
    /// The engine writes the token at the end of `prefix` into `slot`.
    fn write(&mut self, m: &BlockManager, slot: Slot, prefix: &[u32]) -> Result<(), TestCaseError> {
        // A write must never land in a block another table or the prefix cache relies on.
        testing::check_writable(m, slot).map_err(TestCaseError::fail)?;
        prop_assert_eq!((prefix.len() - 1) % BS, slot.offset as usize);
        self.content.insert(slot.block, prefix.to_vec());
        Ok(())
    }

    fn copy(&mut self, src: BlockId, dst: BlockId) {
        let c = self.content.get(&src).cloned().unwrap_or_default();
        self.content.insert(dst, c);
    }

    /// Whether block `b`, used as the `i`-th block of a table, holds KV valid for the tokens
    /// `upto` (a sequence prefix ending inside or at the end of this block): the block was
    /// written at position `i` of a context that starts with `upto`.
    fn block_holds(&self, b: BlockId, i: usize, upto: &[u32]) -> bool {
        self.content.get(&b).is_some_and(|c| {
            c.len() > i * BS
                && c.len() <= (i + 1) * BS
                && c.len() >= upto.len()
                && c[..upto.len()] == *upto
        })
    }
}

/// The manager's own invariants, then the shadow's: every token of every sequence sits in its
/// slot of a block written in that context.
fn check_invariants(m: &BlockManager, sh: &Shadow) -> Result<(), TestCaseError> {
    testing::check_invariants(m).map_err(TestCaseError::fail)?;
    for s in m.sequence_ids() {
        let table = m.block_table(s).unwrap();
        let toks = m.tokens(s).unwrap();
        prop_assert_eq!(toks, &sh.seqs[&s][..]);
        for (i, &b) in table.iter().enumerate() {
            let upto = &toks[..toks.len().min((i + 1) * BS)];
            prop_assert!(sh.block_holds(b, i, upto), "seq {} block {} content", s, b);
        }
    }
    Ok(())
}

fn run(ops: Vec<Op>, window: usize) -> Result<(), TestCaseError> {
    let cfg = BlockManagerConfig {
        hit_rule: HitRule {
            window,
            spec_slack: 0,
        },
        ..testing::small_config()
    };
    let mut m = BlockManager::new(cfg).unwrap();
    let mut sh = Shadow {
        content: HashMap::new(),
        seqs: HashMap::new(),
    };
    for op in ops {
        let before = Snapshot::of(&m);
        let res: Result<Effect, KvError> = testing::apply(&mut m, &op);
        match (&op, res) {
            (Op::Allocate { seq, .. }, Ok(Effect::Allocated { prompt, allocation })) => {
                let table = m.block_table(*seq).unwrap().to_vec();
                let reused = allocation.plan.reused_tokens / BS;
                for (i, &b) in table.iter().enumerate() {
                    let end = prompt.len().min((i + 1) * BS);
                    if i < reused {
                        // The heart of the prefix cache: a hit holds KV computed for exactly
                        // our prefix.
                        prop_assert!(
                            sh.block_holds(b, i, &prompt[..end]),
                            "hit block {} holds another context",
                            b
                        );
                    } else {
                        for p in i * BS..end {
                            let slot = Slot {
                                block: b,
                                offset: (p % BS) as u32,
                            };
                            sh.write(&m, slot, &prompt[..=p])?;
                        }
                    }
                }
                sh.seqs.insert(*seq, prompt);
            }
            (Op::Append { seq, tokens } | Op::Draft { seq, tokens }, Ok(Effect::Slots(slots))) => {
                let mut all = sh.seqs[seq].clone();
                let start = all.len();
                all.extend_from_slice(tokens);
                for (k, s) in slots.iter().enumerate() {
                    sh.write(&m, *s, &all[..=start + k])?;
                }
                sh.seqs.insert(*seq, all);
            }
            (Op::Commit { seq, .. }, Ok(Effect::Committed { len, copy })) => {
                if let Some(cp) = copy {
                    sh.copy(cp.src, cp.dst);
                }
                sh.seqs.get_mut(seq).unwrap().truncate(len);
            }
            (Op::Rollback { seq, n }, Ok(Effect::Copy(copy))) => {
                if let Some(c) = copy {
                    sh.copy(c.src, c.dst);
                }
                let t = sh.seqs.get_mut(seq).unwrap();
                t.truncate(t.len() - n);
            }
            (Op::Fork { parent, child }, Ok(Effect::Copy(copy))) => {
                if let Some(c) = copy {
                    sh.copy(c.src, c.dst);
                }
                let t = sh.seqs[parent].clone();
                sh.seqs.insert(*child, t);
            }
            (Op::Free { seq }, Ok(Effect::Done)) => {
                sh.seqs.remove(seq);
            }
            (Op::Match { .. }, Ok(Effect::Matched { query, matched })) => {
                for (i, &b) in matched.blocks.iter().enumerate() {
                    prop_assert!(
                        sh.block_holds(b, i, &query[..(i + 1) * BS]),
                        "match {:?}",
                        op
                    );
                }
            }
            (
                Op::Import { .. },
                Ok(Effect::Imported {
                    query,
                    chain,
                    blocks,
                }),
            ) => {
                // Blocks loaded from a slower tier: the engine writes their payload.
                for (b, h) in blocks {
                    let i = chain.iter().position(|&c| c == h).unwrap();
                    sh.content.insert(b, query[..(i + 1) * BS].to_vec());
                }
            }
            (Op::Reset, Ok(Effect::Done)) => prop_assert_eq!(m.usage().cached, 0),
            (Op::Accept { .. } | Op::Compute { .. }, Ok(Effect::Done))
            | (Op::Evict { .. }, Ok(Effect::Evicted(_))) => {}
            (_, Ok(e)) => prop_assert!(false, "{:?} had effect {:?}", op, e),
            (_, Err(e)) => {
                // Only refusals are expected, and they change nothing.
                prop_assert!(
                    testing::is_refusal(&e),
                    "unexpected error {:?} for {:?}",
                    e,
                    op
                );
                prop_assert_eq!(&Snapshot::of(&m), &before, "failed {:?} changed state", op);
            }
        }
        check_invariants(&m, &sh)?;
    }
    // Freeing everything returns every block.
    let ids: Vec<u64> = m.sequence_ids().collect();
    for s in ids {
        m.free(s).unwrap();
    }
    prop_assert_eq!(m.usage().free(), NUM_BLOCKS);
    testing::check_invariants(&m).map_err(TestCaseError::fail)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn block_manager_matches_shadow(ops in testing::ops(1..60)) {
        run(ops, 0)?;
    }

    #[test]
    fn block_manager_matches_shadow_with_window_rule(ops in testing::ops(1..60)) {
        run(ops, 3)?;
    }
}
