//! Batched entry points: rows are split across rayon worker threads; every
//! row's result depends only on that row's request, so the output is the
//! same for any thread count, batch order or batch composition.

use rayon::prelude::*;

use crate::error::SampleError;
use crate::logits::LogitValue;
use crate::sampler::{SampleOutput, SampleRequest, Sampler};
use crate::verify::{Verifier, VerifyOutput, VerifyRequest};

/// Sample every row on the current rayon pool; results in row order.
pub fn sample_batch<L: LogitValue>(
    rows: &[SampleRequest<'_, L>],
) -> Vec<Result<SampleOutput, SampleError>> {
    rows.par_iter()
        .map_init(Sampler::new, |s, r| s.sample(r))
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
