//! The result of planning: draft rows per request, expected tokens, predicted time.

/// Which drafts one step verifies, and what the planner expects from it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Draft rows per request, in input order. Request `i` verifies its first
    /// `draft_rows[i]` drafts (always a prefix) on top of its one ordinary row.
    pub draft_rows: Vec<usize>,
    /// Total rows in the step: one ordinary row per request plus every draft row.
    pub total_rows: usize,
    /// Expected tokens the step yields: one per request plus the running product of every
    /// verified draft (a draft counts only if all before it are accepted).
    pub expected_tokens: f64,
    /// The step-time model's prediction for `total_rows` rows, in milliseconds.
    pub predicted_ms: f64,
}

impl Plan {
    /// Expected tokens per millisecond, the quantity the planner maximises.
    pub fn tokens_per_ms(&self) -> f64 {
        self.expected_tokens / self.predicted_ms
    }

    /// Number of draft rows across the batch (the budget `K` of overlapped mode).
    pub fn total_drafts(&self) -> usize {
        self.total_rows - self.draft_rows.len()
    }
}

/// One point of the curve the planner scanned: the best `rows − requests` drafts admitted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CurvePoint {
    /// Total rows (ordinary + draft).
    pub rows: usize,
    /// Expected tokens with the best drafts for this many rows.
    pub expected_tokens: f64,
    /// Predicted step time in milliseconds.
    pub ms: f64,
}

impl CurvePoint {
    /// Expected tokens per millisecond at this point.
    pub fn tokens_per_ms(&self) -> f64 {
        self.expected_tokens / self.ms
    }
}
