//! Typed errors for every fallible entry point of the crate.

/// Everything that can go wrong when planning, splitting or calibrating.
///
/// Bad input is always reported with one of these variants; nothing in the crate panics on
/// user data.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The batch holds no request (planning needs at least one ordinary row).
    #[error("empty batch: at least one request is required")]
    EmptyBatch,
    /// A draft confidence is NaN or outside `[0, 1]`.
    #[error(
        "confidence {value} of request {request} at draft position {position} is not in [0, 1]"
    )]
    InvalidConfidence {
        /// Index of the request in the input slice.
        request: usize,
        /// Zero-based draft position within the request.
        position: usize,
        /// The offending value.
        value: f64,
    },
    /// The step-time table has no point.
    #[error("step-time table is empty")]
    EmptyTable,
    /// A step time (profiled or measured) is not a positive finite number of milliseconds.
    #[error("step time {ms} ms at {rows} rows is not a positive finite number")]
    InvalidStepTime {
        /// Row count the time belongs to.
        rows: usize,
        /// The offending time in milliseconds.
        ms: f64,
    },
    /// Table row counts must be positive and strictly increasing.
    #[error(
        "step-time table rows must be positive and strictly increasing: {rows} follows {previous}"
    )]
    UnsortedTable {
        /// Row count of the previous point (0 for the first point).
        previous: usize,
        /// The offending row count.
        rows: usize,
    },
    /// A row count outside what the step-time table covers (0, or above its last point).
    #[error("{rows} rows is outside the step-time table (1..={max})")]
    RowsOutOfRange {
        /// The requested row count.
        rows: usize,
        /// The largest row count the table covers.
        max: usize,
    },
    /// The batch's ordinary rows alone exceed the row limit (table end or configured cap).
    #[error("{requests} requests need {requests} ordinary rows but at most {max} rows fit")]
    BatchTooLarge {
        /// Number of requests (one ordinary row each).
        requests: usize,
        /// The row limit in force.
        max: usize,
    },
    /// A configuration value is out of its domain.
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// Calibration / statistics input has no sample.
    #[error("no samples: calibration and statistics need at least one")]
    NoSamples,
    /// A sample's accepted length exceeds its number of drafts.
    #[error("sample {sample}: accepted length {accepted} exceeds its {drafts} drafts")]
    AcceptedTooLong {
        /// Index of the sample.
        sample: usize,
        /// Reported accepted length.
        accepted: usize,
        /// Number of drafts the sample holds.
        drafts: usize,
    },
    /// A probability argument (acceptance rate) is NaN or outside `[0, 1]`.
    #[error("probability {0} is not in [0, 1]")]
    InvalidProbability(f64),
}
