//! Property-testing helpers (feature `testing`): the operation sequences, the driver and the
//! invariant checks this crate's own property tests use, for testing an engine built on
//! [`BlockManager`].
//!
//! - [`ops`] / [`op`] draw random [`Op`] sequences (allocate with shared prefixes, append, drafts,
//!   commit, rollback, fork, free, match, evict, import, cache reset), sized for
//!   [`small_config`] so pools run out of blocks and prefixes hit often;
//!   [`spec_steps`] / [`spec_step`] draw speculative decode steps.
//! - [`apply`] runs one [`Op`] and returns what the engine must act on ([`Effect`]).
//! - [`check_invariants`] checks a manager's bookkeeping: every block is free or held, ref counts
//!   equal the block tables holding each block, no block leaks, the free queues and the prefix
//!   index agree, every table covers exactly its sequence's tokens. [`check_writable`] checks a
//!   slot handed out for writing; [`is_refusal`] and [`Snapshot`] check that a refused operation
//!   changed nothing.
//!
//! Checks return `Err(description)`; in a proptest, `.map_err(TestCaseError::fail)?`.

use std::collections::HashMap;
use std::ops::Range;

use proptest::prelude::*;

use crate::{
    Allocation, BlockHash, BlockId, BlockManager, BlockManagerConfig, CopyOp, ExtraKeys, KvError,
    PoolUsage, PrefixMatch, Slot,
};

/// Tokens per block of [`small_config`].
pub const BLOCK_SIZE: usize = 4;
/// Blocks in the pool of [`small_config`].
pub const NUM_BLOCKS: usize = 24;
/// Length of each [`prompt`].
pub const PROMPT_LEN: usize = 40;

/// The configuration [`op`] is sized for: [`NUM_BLOCKS`] blocks of [`BLOCK_SIZE`] tokens, no
/// watermark (prefix caching and token verification on, as by default).
pub fn small_config() -> BlockManagerConfig {
    let mut cfg = BlockManagerConfig::new(NUM_BLOCKS, BLOCK_SIZE);
    cfg.watermark = 0.0;
    cfg
}

/// One of three base prompts of [`PROMPT_LEN`] tokens (`base` 0, 1 or more); 0 and 1 share their
/// first 6 tokens, so prefixes of them hit each other's first block.
pub fn prompt(base: usize) -> Vec<u32> {
    (0..PROMPT_LEN as u32)
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

/// One operation on a [`BlockManager`], as [`apply`] runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `allocate(seq, prompt(base)[..prefix] ++ suffix)` (a single token 1 if that is empty).
    Allocate {
        /// Sequence id.
        seq: u64,
        /// Which [`prompt`].
        base: usize,
        /// Tokens of it to take.
        prefix: usize,
        /// Tokens after them.
        suffix: Vec<u32>,
    },
    /// `append` committed tokens.
    Append {
        /// Sequence id.
        seq: u64,
        /// The tokens.
        tokens: Vec<u32>,
    },
    /// `append_draft` speculative tokens.
    Draft {
        /// Sequence id.
        seq: u64,
        /// The drafts.
        tokens: Vec<u32>,
    },
    /// `accept_drafts`.
    Accept {
        /// Sequence id.
        seq: u64,
    },
    /// `commit_drafts` with the first `n` pending drafts' own ids (the rest rolled back); more
    /// than the pending drafts is refused and changes nothing.
    Commit {
        /// Sequence id.
        seq: u64,
        /// Drafts accepted.
        n: usize,
    },
    /// `mark_computed` of every token held.
    Compute {
        /// Sequence id.
        seq: u64,
    },
    /// `rollback` of the last `n` tokens.
    Rollback {
        /// Sequence id.
        seq: u64,
        /// Tokens removed.
        n: usize,
    },
    /// `fork(parent, child)`.
    Fork {
        /// Parent sequence id.
        parent: u64,
        /// Child sequence id.
        child: u64,
    },
    /// `free`.
    Free {
        /// Sequence id.
        seq: u64,
    },
    /// `match_prefix(prompt(base)[..len])`.
    Match {
        /// Which [`prompt`].
        base: usize,
        /// Tokens of it.
        len: usize,
    },
    /// `evict_cached(n)`.
    Evict {
        /// Blocks to evict at most.
        n: usize,
    },
    /// `import_blocks` of every full block of `prompt(base)[..len]` (as loaded from a slower
    /// tier).
    Import {
        /// Which [`prompt`].
        base: usize,
        /// Tokens of it.
        len: usize,
    },
    /// `reset_prefix_cache`.
    Reset,
}

/// A random [`Op`] on sequence ids `0..6`, token ids `0..8` and prefixes of the three
/// [`prompt`]s, weighted towards allocations, appends and progress reports.
pub fn op() -> impl Strategy<Value = Op> {
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
        2 => (0usize..3, 0usize..PROMPT_LEN).prop_map(|(base, len)| Op::Match { base, len }),
        1 => (0usize..5).prop_map(|n| Op::Evict { n }),
        1 => (0usize..3, 0usize..PROMPT_LEN).prop_map(|(base, len)| Op::Import { base, len }),
        1 => Just(Op::Reset),
    ]
}

/// A sequence of [`op`]s whose length is drawn from `len`.
pub fn ops(len: Range<usize>) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), len)
}

/// What [`apply`] did that the engine must act on (or a test may check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// [`Op::Allocate`]: the prompt allocated and the allocation (its table is the sequence's).
    Allocated {
        /// The prompt.
        prompt: Vec<u32>,
        /// What `allocate` returned.
        allocation: Allocation,
    },
    /// [`Op::Append`] and [`Op::Draft`]: the slot of each new token, to write its KV into.
    Slots(Vec<Slot>),
    /// [`Op::Commit`]: the tokens the sequence holds now, and the block copy to perform.
    Committed {
        /// Tokens held after the commit.
        len: usize,
        /// The copy-on-write of the rollback, if any.
        copy: Option<CopyOp>,
    },
    /// [`Op::Rollback`] and [`Op::Fork`]: the block copy to perform, if any.
    Copy(Option<CopyOp>),
    /// [`Op::Match`]: the query and its match.
    Matched {
        /// The query tokens.
        query: Vec<u32>,
        /// What `match_prefix` returned.
        matched: PrefixMatch,
    },
    /// [`Op::Import`]: the query, its hash chain and the blocks to load (`(block, hash)`).
    Imported {
        /// The query tokens.
        query: Vec<u32>,
        /// Hashes of its full blocks.
        chain: Vec<BlockHash>,
        /// What `import_blocks` returned.
        blocks: Vec<(BlockId, BlockHash)>,
    },
    /// [`Op::Evict`]: blocks evicted.
    Evicted(usize),
    /// Nothing to act on.
    Done,
}

/// Runs `op` on `m`. Errors are the manager's: on valid use only [`is_refusal`] ones, after
/// which nothing has changed.
pub fn apply(m: &mut BlockManager, op: &Op) -> Result<Effect, KvError> {
    match op {
        Op::Allocate {
            seq,
            base,
            prefix,
            suffix,
        } => {
            let mut p = prompt(*base)[..(*prefix).min(PROMPT_LEN)].to_vec();
            p.extend_from_slice(suffix);
            if p.is_empty() {
                p.push(1);
            }
            let allocation = m.allocate(*seq, &p, Default::default())?;
            Ok(Effect::Allocated {
                prompt: p,
                allocation,
            })
        }
        Op::Append { seq, tokens } => {
            let mut slots = Vec::new();
            m.append(*seq, tokens, &mut slots)?;
            Ok(Effect::Slots(slots))
        }
        Op::Draft { seq, tokens } => {
            let mut slots = Vec::new();
            m.append_draft(*seq, tokens, &mut slots)?;
            Ok(Effect::Slots(slots))
        }
        Op::Accept { seq } => m.accept_drafts(*seq).map(|()| Effect::Done),
        Op::Commit { seq, n } => {
            let c = m.num_committed(*seq)?;
            let held = m.sequence_usage(*seq)?.tokens;
            // The drafts' own ids when there are that many (placeholders otherwise: refused).
            let accepted = match m.tokens(*seq) {
                Ok(ids) if c + n <= held => ids[c..c + n].to_vec(),
                _ => vec![0; *n],
            };
            let copy = m.commit_drafts(*seq, &accepted)?;
            Ok(Effect::Committed { len: c + n, copy })
        }
        Op::Compute { seq } => {
            let n = m.sequence_usage(*seq)?.tokens;
            m.mark_computed(*seq, n).map(|()| Effect::Done)
        }
        Op::Rollback { seq, n } => m.rollback(*seq, *n).map(Effect::Copy),
        Op::Fork { parent, child } => m.fork(*parent, *child).map(Effect::Copy),
        Op::Free { seq } => m.free(*seq).map(|()| Effect::Done),
        Op::Match { base, len } => {
            let query = prompt(*base)[..(*len).min(PROMPT_LEN)].to_vec();
            let matched = m.match_prefix(&query, &ExtraKeys::none());
            Ok(Effect::Matched { query, matched })
        }
        Op::Evict { n } => Ok(Effect::Evicted(m.evict_cached(*n))),
        Op::Import { base, len } => {
            let query = prompt(*base)[..(*len).min(PROMPT_LEN)].to_vec();
            let chain = m.prefix_hashes(&query, &ExtraKeys::none());
            let blocks = m.import_blocks(&query, &ExtraKeys::none(), 0, chain.len())?;
            Ok(Effect::Imported {
                query,
                chain,
                blocks,
            })
        }
        Op::Reset => {
            m.reset_prefix_cache();
            Ok(Effect::Done)
        }
    }
}

/// The errors an operation returns on valid use when it is refused (unknown or duplicate id, out
/// of blocks, rollback past the start, drafts pending, more accepted than drafted): it then
/// changed nothing. Any other error is a bug in the caller or in the manager.
pub fn is_refusal(e: &KvError) -> bool {
    matches!(
        e,
        KvError::UnknownSequence(_)
            | KvError::SequenceExists(_)
            | KvError::OutOfBlocks { .. }
            | KvError::RollbackPastStart { .. }
            | KvError::DraftsPending(_)
            | KvError::TooManyAccepted { .. }
    )
}

/// One sequence in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceSnapshot {
    /// Sequence id.
    pub id: u64,
    /// Its block table.
    pub blocks: Vec<BlockId>,
    /// Its tokens (`None` when the caller keeps them).
    pub tokens: Option<Vec<u32>>,
    /// Tokens held, committed and computed.
    pub counts: (usize, usize, usize),
}

/// Everything observable of a manager's sequences and pool counts: equal before and after a
/// refused operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The sequences, by id.
    pub sequences: Vec<SequenceSnapshot>,
    /// Pool counts.
    pub usage: PoolUsage,
}

impl Snapshot {
    /// Takes the snapshot.
    pub fn of(m: &BlockManager) -> Self {
        let mut ids: Vec<u64> = m.sequence_ids().collect();
        ids.sort_unstable();
        let sequences = ids
            .into_iter()
            .filter_map(|id| {
                Some(SequenceSnapshot {
                    id,
                    blocks: m.block_table(id).ok()?.to_vec(),
                    tokens: m.tokens(id).ok().map(<[u32]>::to_vec),
                    counts: (
                        m.sequence_usage(id).ok()?.tokens,
                        m.num_committed(id).ok()?,
                        m.num_computed(id).ok()?,
                    ),
                })
            })
            .collect();
        Snapshot {
            sequences,
            usage: m.usage(),
        }
    }
}

/// Checks the manager's bookkeeping, through its public view and its internals:
///
/// - every block id is either free (ref count 0, on exactly one free queue: the cached one iff
///   it holds a hash) or held (ref count > 0); the pool's counts agree;
/// - each block's ref count equals the number of block-table entries naming it, so no block
///   leaks and none is freed while a table uses it;
/// - the prefix index and the blocks' hashes agree both ways, and a held block's hash is the one
///   each sequence holding it computed for that position (once it has);
/// - every table holds exactly `ceil(len / block_size)` blocks; committed and computed counts
///   are within the tokens held; sequence ids and handles name live entries.
pub fn check_invariants(m: &BlockManager) -> Result<(), String> {
    m.pool().check_invariants()?;
    m.check_sequences()?;
    // The same facts through the public API (what a user sees).
    let pool = m.pool();
    let total = pool.num_blocks();
    let bs = m.block_size();
    let mut refs: HashMap<BlockId, u32> = HashMap::new();
    for s in m.sequence_ids() {
        let table = m.block_table(s).map_err(|e| e.to_string())?;
        let u = m.sequence_usage(s).map_err(|e| e.to_string())?;
        if table.len() != u.tokens.div_ceil(bs) {
            return Err(format!(
                "sequence {s}: {} blocks for {} tokens",
                table.len(),
                u.tokens
            ));
        }
        for &b in table {
            if b as usize >= total {
                return Err(format!("sequence {s}: block {b} outside the pool"));
            }
            *refs.entry(b).or_default() += 1;
        }
    }
    let mut used = 0;
    for b in 0..total as BlockId {
        let rc = pool.ref_count(b).map_err(|e| e.to_string())?;
        let holders = refs.get(&b).copied().unwrap_or(0);
        if rc != holders {
            return Err(format!(
                "block {b}: ref count {rc}, held by {holders} block tables"
            ));
        }
        used += usize::from(rc > 0);
        if let Some(h) = pool.hash_of(b)
            && pool.lookup(h) != Some(b)
        {
            return Err(format!("block {b}: its hash finds {:?}", pool.lookup(h)));
        }
    }
    let u = m.usage();
    if u.used != used || u.used + u.free() != total || u.total != total {
        return Err(format!("pool counts {u:?}, {used} blocks held of {total}"));
    }
    Ok(())
}

/// Checks that `slot`, handed out for writing, lies in a block only one table holds and the
/// prefix cache does not (a write there changes no one else's KV).
pub fn check_writable(m: &BlockManager, slot: Slot) -> Result<(), String> {
    let rc = m.pool().ref_count(slot.block).map_err(|e| e.to_string())?;
    if rc != 1 {
        return Err(format!("write to block {} held {rc} times", slot.block));
    }
    if m.pool().hash_of(slot.block).is_some() {
        return Err(format!("write to cached block {}", slot.block));
    }
    if slot.offset as usize >= m.block_size() {
        return Err(format!("slot offset {} past the block", slot.offset));
    }
    Ok(())
}

/// One speculative decode step, as [`spec_step`] draws it: an input token, `drafts` placeholder
/// drafts after it, the real ids the drafter would have produced, and how many the verifier
/// accepts (may exceed `drafts`: then `commit_drafts` must refuse).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecStep {
    /// The step's input token (committed).
    pub input: u32,
    /// Placeholder drafts appended after it, `0..6`.
    pub drafts: usize,
    /// Six real ids; the first `accepted` are committed.
    pub real: Vec<u32>,
    /// Drafts accepted, `0..7`.
    pub accepted: usize,
}

/// A random [`SpecStep`] over token ids `0..50`.
pub fn spec_step() -> impl Strategy<Value = SpecStep> {
    (
        0u32..50,
        0usize..6,
        prop::collection::vec(0u32..50, 6),
        0usize..7,
    )
        .prop_map(|(input, drafts, real, accepted)| SpecStep {
            input,
            drafts,
            real,
            accepted,
        })
}

/// A sequence of [`spec_step`]s whose length is drawn from `len`.
pub fn spec_steps(len: Range<usize>) -> impl Strategy<Value = Vec<SpecStep>> {
    prop::collection::vec(spec_step(), len)
}
