//! Batched entry points: rows are split across rayon worker threads; every
//! row's result depends only on that row's request, so the output is the
//! same for any thread count, batch order or batch composition.

use std::cell::RefCell;

use rayon::prelude::*;

use crate::error::SampleError;
use crate::logits::LogitValue;
use crate::sampler::{SampleOutput, SampleRequest, Sampler};
use crate::verify::{Verifier, VerifyOutput, VerifyRequest};

thread_local! {
    /// One sampler per worker thread, kept across calls: its buffers (up to
    /// about 10 bytes per vocabulary entry) are allocated once per thread
    /// instead of once per rayon job. Results never depend on them.
    static SAMPLER: RefCell<Sampler> = RefCell::new(Sampler::new());
}

/// Sample every row on the current rayon pool; results in row order.
pub fn sample_batch<L: LogitValue>(
    rows: &[SampleRequest<'_, L>],
) -> Vec<Result<SampleOutput, SampleError>> {
    rows.par_iter()
        .map(|r| {
            // `sample` never re-enters `sample_batch`, so the borrow is free;
            // should it ever be taken, a fresh sampler gives the same result.
            SAMPLER.with(|cell| match cell.try_borrow_mut() {
                Ok(mut s) => s.sample(r),
                Err(_) => Sampler::new().sample(r),
            })
        })
        .collect()
}

/// Verify every row on the current rayon pool; results in row order.
pub fn verify_batch<L: LogitValue>(
    rows: &[VerifyRequest<'_, L>],
) -> Vec<Result<VerifyOutput, SampleError>> {
    rows.par_iter()
        .map_init(Verifier::new, |s, r| s.verify(r))
        .collect()
}
