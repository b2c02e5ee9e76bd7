//! A plain sort-based sampler: the definition the fast path must equal.
//!
//! It adjusts every logit, sorts the whole vocabulary best first, applies
//! top-k, top-p (walking the sorted prefix) and min-p, and draws with the same
//! fixed-point CDF. Slow (a full sort per row); used as the test oracle and
//! as the benchmark baseline.

use crate::error::SampleError;
use crate::filter::{Cand, rank, top_p_need};
use crate::fixed_point::{
    EXP_CUTOFF, EXP_LN2_HI, EXP_LN2_LO, EXP_LOG2E, EXP_POLY, EXP_ROUND_MAGIC, relative_weight,
};
use crate::logits::{LogitValue, adjusted, allowed, build_adjustments, check_shape};
use crate::params::SamplingParams;
use crate::rng::{DrawKind, PhiloxStream};
use crate::sampler::{SampleRequest, fixed_logprob};

/// [`crate::fixed_point::det_exp`] in its straightforward form (early
/// clamps, `2^n` from an integer cast): the form the recipe describes, which
/// the branch-free one must equal bit for bit.
pub fn det_exp(x: f32) -> f32 {
    let below = x.is_nan() || x < EXP_CUTOFF;
    let x = if below { EXP_CUTOFF } else { x.min(0.0) };
    let n = (x * EXP_LOG2E + EXP_ROUND_MAGIC) - EXP_ROUND_MAGIC;
    let f = (x - n * EXP_LN2_HI) - n * EXP_LN2_LO;
    let c = EXP_POLY;
    let p =
        (((((c[0] * f + c[1]) * f + c[2]) * f + c[3]) * f + c[4]) * f + c[5]) * (f * f) + f + 1.0;
    let scale = f32::from_bits((((n as i32) + 127) as u32) << 23);
    let r = p * scale;
    if below { 0.0 } else { r }
}

/// The filtered distribution by the sort definition: `(token, weight)`
/// sorted by token id, and the total weight.
pub fn sorted_weights<L: LogitValue>(
    logits: &[L],
    mask: Option<&[u32]>,
    history: &[u32],
    params: &SamplingParams,
) -> Result<(Vec<(u32, u64)>, u64), SampleError> {
    params.validate()?;
    check_shape(logits.len(), mask)?;
    let mut adj = Vec::new();
    build_adjustments(params, history, logits.len(), &mut adj)?;
    let mut all = Vec::with_capacity(logits.len());
    for (i, x) in logits.iter().enumerate() {
        let id = i as u32;
        if !allowed(mask, id) {
            continue;
        }
        let mut l = x.to_f32();
        if let Ok(j) = adj.binary_search_by_key(&id, |a| a.id) {
            l = adjusted(l, &adj[j], params);
        }
        if !l.is_finite() {
            return Err(SampleError::NonFiniteLogit {
                token: id,
                value: l,
            });
        }
        all.push(Cand { id, l, w: 0 });
    }
    if all.is_empty() {
        return Err(SampleError::MaskForbidsAll);
    }
    all.sort_unstable_by(rank);
    if params.top_k > 0 {
        all.truncate(params.top_k as usize);
    }
    let l_max = all[0].l;
    let t = params.effective_temperature();
    for c in &mut all {
        c.w = relative_weight(c.l - l_max, t);
    }
    if params.top_p < 1.0 {
        let z: u64 = all.iter().map(|c| c.w).sum();
        let need = top_p_need(z, params.top_p_fixed());
        let mut acc = 0u64;
        let mut keep = all.len();
        for (i, c) in all.iter().enumerate() {
            acc += c.w;
            if acc >= need {
                keep = i + 1;
                break;
            }
        }
        all.truncate(keep);
    }
    if params.min_p > 0.0 {
        let floor = params.min_p_weight();
        all.retain(|c| c.w >= floor);
    }
    all.sort_by_key(|c| c.id);
    let total = all.iter().map(|c| c.w).sum();
    Ok((all.into_iter().map(|c| (c.id, c.w)).collect(), total))
}

/// Sample one row by the sort definition; token and `ln(w / W)` (the
/// [`crate::LogprobSource::Sampled`] log-probability), no alternatives.
pub fn sample_sorted<L: LogitValue>(req: &SampleRequest<'_, L>) -> Result<(u32, f32), SampleError> {
    let (ws, total) = sorted_weights(req.logits, req.mask, req.history, req.params)?;
    let mut stream = PhiloxStream::for_draw(req.params.seed, req.position, DrawKind::Sample);
    let t = stream.below(total);
    let mut acc = 0u64;
    for &(id, w) in &ws {
        acc += w;
        if acc > t {
            return Ok((id, fixed_logprob(w, total)));
        }
    }
    Err(SampleError::MaskForbidsAll)
}
