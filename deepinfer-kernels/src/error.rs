//! The crate's error type: bad input is reported, never a panic.

/// Everything a kernel call can report.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    /// Tensor shapes that do not fit the operation.
    #[error("shape mismatch in {op}: {detail}")]
    Shape {
        /// The operation that was called.
        op: &'static str,
        /// What did not fit.
        detail: String,
    },
    /// A dtype the operation does not accept.
    #[error("{op} does not accept dtype {dtype:?}")]
    DType {
        /// The operation that was called.
        op: &'static str,
        /// The rejected dtype.
        dtype: crate::DType,
    },
    /// Any other invalid argument (out-of-range index, bad parameter).
    #[error("invalid argument to {op}: {detail}")]
    Invalid {
        /// The operation that was called.
        op: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The device (driver, compiler, memory) failed.
    #[error("device error: {0}")]
    Device(String),
}

/// Shorthand for results of this crate.
pub type Result<T, E = KernelError> = std::result::Result<T, E>;

pub(crate) fn shape_err(op: &'static str, detail: impl Into<String>) -> KernelError {
    KernelError::Shape {
        op,
        detail: detail.into(),
    }
}

pub(crate) fn invalid(op: &'static str, detail: impl Into<String>) -> KernelError {
    KernelError::Invalid {
        op,
        detail: detail.into(),
    }
}
