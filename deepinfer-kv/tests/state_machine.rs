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

use deepinfer_kv::{
    AllocateOptions, BlockId, BlockManager, BlockManagerConfig, ExtraKeys, HitRule, KvError, Slot,
};
use proptest::prelude::*;

const BS: usize = 4;
const NUM_BLOCKS: usize = 24;

#[derive(Debug, Clone)]
enum Op {
    Allocate {
        seq: u64,
        base: usize,
        prefix: usize,
        suffix: Vec<u32>,
    },
    Append {
        seq: u64,
        tokens: Vec<u32>,
    },
    Draft {
        seq: u64,
        tokens: Vec<u32>,
    },
    Accept {
        seq: u64,
    },
    /// `commit_drafts` with the first `n` drafts' own ids (rolls back the rest); more than
    /// the pending drafts must fail and change nothing.
    Commit {
        seq: u64,
        n: usize,
    },
    Compute {
        seq: u64,
    },
    Rollback {
        seq: u64,
        n: usize,
    },
    Fork {
        parent: u64,
        child: u64,
    },
    Free {
        seq: u64,
    },
    Match {
        base: usize,
        len: usize,
    },
    Evict {
        n: usize,
    },
    Import {
        base: usize,
        len: usize,
    },
    Reset,
}

fn base_prompt(base: usize) -> Vec<u32> {
    // Three base prompts; 0 and 1 share their first 6 tokens.
    (0..40u32)
        .map(|i| match base {
            0 => i,
            1 => {
                if i < 6 {
                    i
                } else {
                    100 + i
                }
            }
            _ => 200 + i,
        })
        .collect()
}

fn op() -> impl Strategy<Value = Op> {
    let seq = 0u64..6;
    let toks = prop::collection::vec(0u32..8, 1..7);
    prop_oneof![
        3 => (seq.clone(), 0usize..3, 0usize..24, prop::collection::vec(0u32..8, 0..6))
            .prop_map(|(seq, base, prefix, suffix)| Op::Allocate { seq, base, prefix, suffix }),
        3 => (seq.clone(), toks.clone()).prop_map(|(seq, tokens)| Op::Append { seq, tokens }),
        1 => (seq.clone(), toks).prop_map(|(seq, tokens)| Op::Draft { seq, tokens }),
        1 => seq.clone().prop_map(|seq| Op::Accept { seq }),
        1 => (seq.clone(), 0usize..5).prop_map(|(seq, n)| Op::Commit { seq, n }),
        3 => seq.clone().prop_map(|seq| Op::Compute { seq }),
        2 => (seq.clone(), 0usize..10).prop_map(|(seq, n)| Op::Rollback { seq, n }),
        1 => (seq.clone(), seq.clone()).prop_map(|(parent, child)| Op::Fork { parent, child }),
        2 => seq.prop_map(|seq| Op::Free { seq }),
        2 => (0usize..3, 0usize..40).prop_map(|(base, len)| Op::Match { base, len }),
        1 => (0usize..5).prop_map(|n| Op::Evict { n }),
        1 => (0usize..3, 0usize..40).prop_map(|(base, len)| Op::Import { base, len }),
        1 => Just(Op::Reset),
    ]
}

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
        prop_assert_eq!(
            m.pool().ref_count(slot.block).unwrap(),
            1,
            "write to shared block"
        );
        prop_assert!(
            m.pool().hash_of(slot.block).is_none(),
            "write to cached block"
        );
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

/// Every sequence's (id, block table, tokens), and the pool counts.
type Snapshot = (Vec<(u64, Vec<BlockId>, Vec<u32>)>, deepinfer_kv::PoolUsage);

fn snapshot(m: &BlockManager) -> Snapshot {
    let mut ids: Vec<u64> = m.sequence_ids().collect();
    ids.sort();
    let seqs = ids
        .into_iter()
        .map(|s| {
            (
                s,
                m.block_table(s).unwrap().to_vec(),
                m.tokens(s).unwrap().to_vec(),
            )
        })
        .collect();
    (seqs, m.usage())
}

fn check_invariants(m: &BlockManager, sh: &Shadow) -> Result<(), TestCaseError> {
    let mut refs: HashMap<BlockId, u32> = HashMap::new();
    for s in m.sequence_ids() {
        let table = m.block_table(s).unwrap();
        let toks = m.tokens(s).unwrap();
        prop_assert_eq!(toks, &sh.seqs[&s][..]);
        prop_assert_eq!(table.len(), toks.len().div_ceil(BS));
        for (i, &b) in table.iter().enumerate() {
            *refs.entry(b).or_default() += 1;
            // Every token of the sequence sits in its slot.
            let upto = &toks[..toks.len().min((i + 1) * BS)];
            prop_assert!(sh.block_holds(b, i, upto), "seq {} block {} content", s, b);
        }
    }
    let total = m.pool().num_blocks();
    let mut used = 0;
    for b in 0..total as BlockId {
        let rc = m.pool().ref_count(b).unwrap();
        prop_assert_eq!(
            rc,
            refs.get(&b).copied().unwrap_or(0),
            "ref count of block {}",
            b
        );
        if rc > 0 {
            used += 1;
        }
        // A cached block's hash must find it again.
        if let Some(h) = m.pool().hash_of(b) {
            prop_assert_eq!(m.pool().lookup(h), Some(b));
        }
    }
    let u = m.usage();
    prop_assert_eq!(u.used, used);
    prop_assert_eq!(u.used + u.free(), total);
    Ok(())
}

fn run(ops: Vec<Op>, window: usize) -> Result<(), TestCaseError> {
    let mut cfg = BlockManagerConfig::new(NUM_BLOCKS, BS);
    cfg.watermark = 0.0;
    cfg.hit_rule = HitRule {
        window,
        spec_slack: 0,
    };
    let mut m = BlockManager::new(cfg).unwrap();
    let mut sh = Shadow {
        content: HashMap::new(),
        seqs: HashMap::new(),
    };
    for op in ops {
        let before = snapshot(&m);
        let res: Result<(), KvError> = match &op {
            Op::Allocate {
                seq,
                base,
                prefix,
                suffix,
            } => {
                let mut prompt = base_prompt(*base)[..*prefix].to_vec();
                prompt.extend_from_slice(suffix);
                if prompt.is_empty() {
                    prompt.push(1);
                }
                m.allocate(*seq, &prompt, AllocateOptions::default())
                    .map(|a| {
                        let table = m.block_table(*seq).unwrap().to_vec();
                        let reused = a.plan.reused_tokens / BS;
                        for (i, &b) in table.iter().enumerate() {
                            let end = prompt.len().min((i + 1) * BS);
                            if i < reused {
                                // The heart of the prefix cache: a hit holds KV computed for
                                // exactly our prefix.
                                assert!(
                                    sh.block_holds(b, i, &prompt[..end]),
                                    "hit block {b} holds another context"
                                );
                            } else {
                                for p in i * BS..end {
                                    let slot = Slot {
                                        block: b,
                                        offset: (p % BS) as u32,
                                    };
                                    sh.write(&m, slot, &prompt[..=p]).unwrap();
                                }
                            }
                        }
                        sh.seqs.insert(*seq, prompt);
                    })
            }
            Op::Append { seq, tokens } | Op::Draft { seq, tokens } => {
                let mut slots = Vec::new();
                let r = if matches!(op, Op::Append { .. }) {
                    m.append(*seq, tokens, &mut slots)
                } else {
                    m.append_draft(*seq, tokens, &mut slots)
                };
                r.map(|()| {
                    let mut all = sh.seqs[seq].clone();
                    let start = all.len();
                    all.extend_from_slice(tokens);
                    for (k, s) in slots.iter().enumerate() {
                        sh.write(&m, *s, &all[..=start + k]).unwrap();
                    }
                    sh.seqs.insert(*seq, all);
                })
            }
            Op::Accept { seq } => m.accept_drafts(*seq),
            Op::Commit { seq, n } => {
                let ids = m.tokens(*seq).map(<[u32]>::to_vec);
                let committed = m.num_committed(*seq);
                match (ids, committed) {
                    (Ok(ids), Ok(c)) => {
                        let drafts = ids.len() - c;
                        let accepted: Vec<u32> = if *n <= drafts {
                            ids[c..c + n].to_vec()
                        } else {
                            vec![0; *n]
                        };
                        m.commit_drafts(*seq, &accepted).map(|copy| {
                            if let Some(cp) = copy {
                                sh.copy(cp.src, cp.dst);
                            }
                            let t = sh.seqs.get_mut(seq).unwrap();
                            t.truncate(c + n);
                        })
                    }
                    (Err(e), _) | (_, Err(e)) => Err(e),
                }
            }
            Op::Compute { seq } => match m.tokens(*seq).map(<[u32]>::len) {
                Ok(n) => m.mark_computed(*seq, n),
                Err(e) => Err(e),
            },
            Op::Rollback { seq, n } => m.rollback(*seq, *n).map(|copy| {
                if let Some(c) = copy {
                    sh.copy(c.src, c.dst);
                }
                let t = sh.seqs.get_mut(seq).unwrap();
                t.truncate(t.len() - n);
            }),
            Op::Fork { parent, child } => m.fork(*parent, *child).map(|copy| {
                if let Some(c) = copy {
                    sh.copy(c.src, c.dst);
                }
                let t = sh.seqs[parent].clone();
                sh.seqs.insert(*child, t);
            }),
            Op::Free { seq } => m.free(*seq).map(|()| {
                sh.seqs.remove(seq);
            }),
            Op::Match { base, len } => {
                let q = base_prompt(*base)[..*len].to_vec();
                let pm = m.match_prefix(&q, &ExtraKeys::none());
                for (i, &b) in pm.blocks.iter().enumerate() {
                    prop_assert!(sh.block_holds(b, i, &q[..(i + 1) * BS]), "match {:?}", op);
                }
                Ok(())
            }
            Op::Evict { n } => {
                m.evict_cached(*n);
                Ok(())
            }
            Op::Import { base, len } => {
                // Blocks loaded from a slower tier: the engine writes their payload.
                let q = base_prompt(*base)[..*len].to_vec();
                let chain = m.prefix_hashes(&q, &ExtraKeys::none());
                m.import_blocks(&q, &ExtraKeys::none(), 0, chain.len())
                    .map(|imported| {
                        for (b, h) in imported {
                            let i = chain.iter().position(|&c| c == h).unwrap();
                            sh.content.insert(b, q[..(i + 1) * BS].to_vec());
                        }
                    })
            }
            Op::Reset => {
                m.reset_prefix_cache();
                prop_assert_eq!(m.usage().cached, 0);
                Ok(())
            }
        };
        match res {
            Ok(()) => {}
            Err(e) => {
                // Only input errors are expected, and they change nothing.
                prop_assert!(
                    matches!(
                        e,
                        KvError::UnknownSequence(_)
                            | KvError::SequenceExists(_)
                            | KvError::OutOfBlocks { .. }
                            | KvError::RollbackPastStart { .. }
                            | KvError::DraftsPending(_)
                            | KvError::TooManyAccepted { .. }
                    ),
                    "unexpected error {:?} for {:?}",
                    e,
                    op
                );
                prop_assert_eq!(&snapshot(&m), &before, "failed {:?} changed state", op);
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
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn block_manager_matches_shadow(ops in prop::collection::vec(op(), 1..60)) {
        run(ops, 0)?;
    }

    #[test]
    fn block_manager_matches_shadow_with_window_rule(ops in prop::collection::vec(op(), 1..60)) {
        run(ops, 3)?;
    }
}
