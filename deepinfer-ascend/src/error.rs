//! The crate's error type.

use thiserror::Error;

/// Everything that can go wrong in planning, emulation, linting or talking to the NPU runtime.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum AscendError {
    /// A shape or argument the kernel cannot take (empty, mis-sized, not a multiple of the format block).
    #[error("invalid shape: {0}")]
    Shape(String),
    /// No tile choice fits the chip's on-chip buffers.
    #[error("no tiling fits {buffer} ({need} bytes needed, {have} available): {what}")]
    Budget {
        /// Which buffer overflowed (UB, L1, L0A, L0B, L0C).
        buffer: &'static str,
        /// Bytes the smallest legal tile needs.
        need: usize,
        /// Bytes the chip has.
        have: usize,
        /// The kernel or shape being planned.
        what: String,
    },
    /// The emulator caught a rule the device would break silently (overflow, misalignment, double write).
    #[error("emulator rule broken in {kernel}: {detail}")]
    Emulator {
        /// Kernel being emulated.
        kernel: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// A shared library (libascendcl, aclrtc) could not be loaded or lacks a symbol.
    #[error("cannot load {library}: {detail}")]
    Library {
        /// Library or symbol name.
        library: String,
        /// Loader message.
        detail: String,
    },
    /// An AscendCL / aclrtc call returned a non-zero status.
    #[error("{call} failed with status {code}{log}")]
    Acl {
        /// The API function.
        call: &'static str,
        /// Its return code.
        code: i32,
        /// Compiler log or extra context (empty when none).
        log: String,
    },
    /// Binary-cache I/O failed.
    #[error("kernel cache: {0}")]
    Cache(String),
    /// The operation is not available in the backend's mode.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// Shorthand result type.
pub type Result<T> = std::result::Result<T, AscendError>;

/// Build a [`AscendError::Shape`] error.
pub(crate) fn shape_err<T>(msg: impl Into<String>) -> Result<T> {
    Err(AscendError::Shape(msg.into()))
}
