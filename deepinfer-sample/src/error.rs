//! Typed errors for bad input.

/// Why a row could not be sampled or verified.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SampleError {
    /// A logit of an allowed token is NaN or infinite (after bias and penalties).
    #[error("logit {value} at token {token} is not finite")]
    NonFiniteLogit {
        /// Token id of the offending logit.
        token: u32,
        /// Its value.
        value: f32,
    },
    /// The temperature is negative or NaN.
    #[error("temperature {0} is negative or NaN")]
    InvalidTemperature(f32),
    /// `top_p` is outside `(0, 1]`.
    #[error("top_p {0} is outside (0, 1]")]
    TopPOutOfRange(f32),
    /// `min_p` is outside `[0, 1]`.
    #[error("min_p {0} is outside [0, 1]")]
    MinPOutOfRange(f32),
    /// A penalty is not finite, or the repetition penalty is not positive.
    #[error("{name} penalty {value} is invalid")]
    InvalidPenalty {
        /// Which penalty.
        name: &'static str,
        /// Its value.
        value: f32,
    },
    /// A logit bias is not finite.
    #[error("logit bias {value} for token {token} is not finite")]
    InvalidBias {
        /// Token id.
        token: u32,
        /// Bias value.
        value: f32,
    },
    /// A token id (bias, history, draft) is not below the vocabulary size.
    #[error("token {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The token id.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The vocabulary is empty or has 2^32 tokens or more.
    #[error("vocabulary size {0} is unsupported (must be 1..2^32)")]
    BadVocab(usize),
    /// The grammar bitmask does not have `ceil(vocab / 32)` words per row.
    #[error("mask has {got} words, expected {expected} for a vocabulary of {vocab}")]
    MaskSizeMismatch {
        /// Words expected.
        expected: usize,
        /// Words given.
        got: usize,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The grammar bitmask forbids every token of the row.
    #[error("the mask forbids every token")]
    MaskForbidsAll,
    /// The lengths of the draft inputs do not agree.
    #[error("{what}: expected {expected}, got {got}")]
    DraftLengthMismatch {
        /// Which input.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Length given.
        got: usize,
    },
    /// A draft probability is negative, NaN or infinite.
    #[error("draft probability {value} of token {token} at draft {draft} is invalid")]
    InvalidDraftProbability {
        /// Draft index.
        draft: usize,
        /// Token id.
        token: u32,
        /// The value.
        value: f32,
    },
}
