//! Overlapped mode: the total draft budget `K` is fixed from stale confidences; fresh
//! confidences then decide which `K` drafts run.

use crate::candidates::Candidates;
use crate::error::SpecError;

/// Reusable buffers for [`split_into`].
#[derive(Debug, Clone, Default)]
pub struct SplitScratch {
    candidates: Candidates,
}

impl SplitScratch {
    /// Empty buffers (they grow to the batch size on first use).
    pub fn new() -> Self {
        Self::default()
    }
}

/// Splits a budget of `k` draft rows over the batch by fresh running products: the `k` drafts
/// with the largest `c1 × … × ci` win (ties go to the lower request index, then the earlier
/// position), so each request gets a prefix of its drafts. Returns draft rows per request, in
/// input order; their sum is `min(k, total drafts)`.
///
/// A pure function of its inputs, mirroring what a device kernel does in overlapped scheduling,
/// so a CUDA version can be compared with it exactly.
///
/// ```
/// let rows = deepinfer_spec::split(4, &[[0.9, 0.9, 0.9], [0.5, 0.5, 0.5]])?;
/// assert_eq!(rows, [3, 1]);
/// # Ok::<(), deepinfer_spec::SpecError>(())
/// ```
pub fn split<C: AsRef<[f64]>>(k: usize, fresh: &[C]) -> Result<Vec<usize>, SpecError> {
    let mut out = Vec::new();
    split_into(k, fresh, &mut SplitScratch::new(), &mut out)?;
    Ok(out)
}

/// [`split`] with caller-owned buffers (no allocation once they have grown).
pub fn split_into<C: AsRef<[f64]>>(
    k: usize,
    fresh: &[C],
    scratch: &mut SplitScratch,
    out: &mut Vec<usize>,
) -> Result<(), SpecError> {
    let c = &mut scratch.candidates;
    c.build(fresh, usize::MAX)?;
    out.clear();
    out.resize(fresh.len(), 0);
    let take = k.min(c.len());
    if take == 0 {
        return Ok(());
    }
    c.count_top_into(take, out);
    Ok(())
}
