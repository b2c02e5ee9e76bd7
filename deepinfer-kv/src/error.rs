//! Typed errors of the crate. Bad input returns one of these; nothing here panics on user input.

use std::path::PathBuf;

use crate::pool::BlockId;

/// Everything that can go wrong in `deepinfer-kv`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// `block_size` was zero.
    #[error("block size must be at least one token")]
    ZeroBlockSize,
    /// The pool would have no block, or more blocks than a `u32` id can name.
    #[error("invalid number of blocks {0} (must be 1..=4_294_967_294)")]
    InvalidBlockCount(usize),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// No sequence with this id is known to the manager.
    #[error("unknown sequence {0}")]
    UnknownSequence(u64),
    /// A sequence with this id already holds blocks.
    #[error("sequence {0} already exists")]
    SequenceExists(u64),
    /// Not enough free blocks (free or evictable) for the request.
    #[error("out of blocks: needed {needed}, available {available}")]
    OutOfBlocks {
        /// Blocks the operation needed.
        needed: usize,
        /// Blocks that were free or evictable.
        available: usize,
    },
    /// The sequence's token ids are kept by the caller (see `AllocateOptions::caller_keeps_tokens`).
    #[error("sequence {0} does not keep its token ids (its caller does)")]
    TokensNotKept(u64),
    /// A rollback asked to remove more tokens than the sequence holds.
    #[error("cannot roll back {requested} tokens: sequence holds {len}")]
    RollbackPastStart {
        /// Tokens the caller asked to remove.
        requested: usize,
        /// Tokens the sequence holds.
        len: usize,
    },
    /// Committed tokens were appended while draft tokens are still pending.
    #[error("sequence {0} has pending draft tokens: accept or roll them back first")]
    DraftsPending(u64),
    /// `commit_drafts` was given more accepted tokens than there are pending drafts.
    #[error("cannot commit {accepted} drafts: sequence holds {drafts}")]
    TooManyAccepted {
        /// Accepted tokens passed.
        accepted: usize,
        /// Draft tokens pending.
        drafts: usize,
    },
    /// `mark_computed` was given more tokens than the sequence holds.
    #[error("cannot mark {requested} tokens computed: sequence holds {len}")]
    ComputedPastEnd {
        /// Tokens the caller claimed were computed.
        requested: usize,
        /// Tokens the sequence holds.
        len: usize,
    },
    /// A block id outside the pool, or a block that is not in use, was released or retained.
    #[error("block {0} is not allocated (double free or bad id)")]
    BlockNotAllocated(BlockId),
    /// A memory budget cannot hold the fixed per-sequence state plus one block.
    #[error("budget of {budget} bytes cannot hold {needed} bytes of fixed state and one block")]
    BudgetTooSmall {
        /// The budget given.
        budget: u64,
        /// Bytes needed at minimum.
        needed: u64,
    },
    /// An entry larger than a store's whole capacity.
    #[error("entry of {size} bytes exceeds store capacity of {capacity} bytes")]
    EntryTooLarge {
        /// Entry size in bytes.
        size: u64,
        /// Store capacity in bytes.
        capacity: u64,
    },
    /// The persistent store's directory cannot be created or written.
    #[error("store directory {path:?} is not writable: {reason}")]
    UnwritableDirectory {
        /// The directory.
        path: PathBuf,
        /// The operating system's message.
        reason: String,
    },
    /// Any other I/O failure of the persistent store.
    #[error("store I/O error on {path:?}: {reason}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The operating system's message.
        reason: String,
    },
}

/// Result alias used across the crate.
pub type Result<T> = std::result::Result<T, KvError>;
