//! Overlapped mode: the total draft budget `K` is fixed from stale confidences; fresh
//! confidences then decide which `K` drafts run.

use crate::candidates;
use crate::error::SpecError;

/// Reusable buffers for [`split_into`].
#[derive(Debug, Clone, Default)]
pub struct SplitScratch {
    keys: Vec<u128>,
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
    candidates::build(fresh, usize::MAX, &mut scratch.keys)?;
    out.clear();
    out.resize(fresh.len(), 0);
    let keys = &mut scratch.keys;
    let take = k.min(keys.len());
    if take == 0 {
        return Ok(());
    }
    if take < keys.len() {
        // Keys are unique, so the `take` smallest are exactly the `take` best drafts.
        keys.select_nth_unstable(take);
    }
    for &key in &keys[..take] {
        out[candidates::request(key)] += 1;
    }
    Ok(())
}
