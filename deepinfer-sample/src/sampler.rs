//! One row: logits → filtered fixed-point distribution → token and
//! log-probabilities.

use crate::error::SampleError;
use crate::filter::{Cand, best, gather, rank, top_k, top_p_filter, top_p_need, weigh};
use crate::fixed_point::{WEIGHT_ONE, det_exp, pick};
use crate::fused::{FusedScratch, draw_full, pick_full, top_survivors, weigh_full};
use crate::logits::{Adjust, LogitValue, Row, build_adjustments, check_shape};
use crate::params::{LogprobSource, SamplingParams};
use crate::rng::{DrawKind, PhiloxStream};

/// `(l - l_max) / t` below `-ZERO_WEIGHT_SPAN` gives weight 0 (`det_exp(-22.2) = 2^-32`).
const ZERO_WEIGHT_SPAN: f32 = 24.0;

/// Everything needed to sample one row.
#[derive(Clone, Copy, Debug)]
pub struct SampleRequest<'a, L> {
    /// The row's logits (one per vocabulary entry).
    pub logits: &'a [L],
    /// Grammar bitmask, `ceil(V / 32)` words; bit set = token allowed.
    pub mask: Option<&'a [u32]>,
    /// Tokens the penalties count (usually the generated ones).
    pub history: &'a [u32],
    /// Position of the token being sampled (selects the random stream).
    pub position: u64,
    /// Sampling parameters (including the seed).
    pub params: &'a SamplingParams,
}

/// A sampled token and its log-probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleOutput {
    /// The chosen token.
    pub token: u32,
    /// Its log-probability (see [`LogprobSource`]).
    pub logprob: f32,
    /// The best `top_logprobs` alternatives, best first, ties by token id.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// The filtered distribution of a row: survivors sorted by id in
/// [`Scratch::cands`], with weights.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DistInfo {
    /// Total weight of the survivors.
    pub total: u64,
    /// The best-ranked allowed token (the greedy choice).
    pub top: Cand,
    /// Clamped temperature.
    pub temperature: f32,
}

/// Reusable buffers; results never depend on what they held before.
#[derive(Debug, Default)]
pub struct Scratch {
    pub(crate) cands: Vec<Cand>,
    pub(crate) adjust: Vec<Adjust>,
    pub(crate) alts: Vec<Cand>,
    pub(crate) fused: FusedScratch,
}

/// Default of [`Sampler::with_fused_above`]: rows with more candidates than
/// this (tokens within reach of a non-zero weight) take the fused
/// full-vocabulary path. Listing costs about 80 instructions per candidate,
/// the fused path about 15 per vocabulary entry, so listing wins below
/// roughly a fifth of the vocabulary; 8192 suits vocabularies from 32k to
/// 256k.
pub const FUSED_ABOVE: usize = 8192;

impl Scratch {
    /// Empty buffers.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Compute the filtered distribution of one row into `s.cands` (sorted by
/// id). With `alts > 0` and [`LogprobSource::Processed`], also the `alts`
/// best allowed tokens into `s.alts` (best first). With `prune`, tokens of
/// weight 0 may be left out of `s.cands` (draws and log-probabilities are the
/// same; only a full listing of the distribution needs them).
pub(crate) fn distribution<L: LogitValue>(
    logits: &[L],
    mask: Option<&[u32]>,
    history: &[u32],
    params: &SamplingParams,
    alts: usize,
    prune: bool,
    s: &mut Scratch,
) -> Result<DistInfo, SampleError> {
    // An unbounded listing never overflows, so the row is always listed.
    let _ = gather_row(logits, mask, history, params, alts, prune, usize::MAX, s)?;
    Ok(filter_listed(params, alts, s))
}

/// The first half of [`distribution`]: check the row and list its
/// candidates into `s.cands`. With top-k off, a row with more than `limit`
/// candidates stops listing them and gives `Some(l_max)` for [`draw_full`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_row<L: LogitValue>(
    logits: &[L],
    mask: Option<&[u32]>,
    history: &[u32],
    params: &SamplingParams,
    alts: usize,
    prune: bool,
    limit: usize,
    s: &mut Scratch,
) -> Result<Option<f32>, SampleError> {
    params.validate()?;
    let vocab = logits.len();
    check_shape(vocab, mask)?;
    build_adjustments(params, history, vocab, &mut s.adjust)?;
    let row = Row {
        logits,
        mask,
        adjust: &s.adjust,
        params,
    };
    let want_alts = alts > 0 && params.logprob_source == LogprobSource::Processed;
    let k = params.top_k as usize;
    let keep = if k > 0 {
        Some(if want_alts { k.max(alts) } else { k })
    } else {
        None
    };
    // Tokens whose weight is surely 0 (`det_exp` of less than -24 is below 2^-32, the
    // smallest weight, with margin for rounding) need not be collected: with no alternatives
    // to report, leaving them out changes nothing downstream. Greedy rows (temperature
    // clamped to 1e-5) then collect only the ties of the maximum instead of the vocabulary.
    let cutoff = (prune && params.top_logprobs == 0)
        .then(|| ZERO_WEIGHT_SPAN * params.effective_temperature());
    let gathered = gather(&row, keep, cutoff, limit, &mut s.cands)?;
    if gathered.allowed == 0 {
        return Err(SampleError::MaskForbidsAll);
    }
    Ok(gathered.overflow)
}

/// The second half of [`distribution`]: filter the listed candidates and
/// weigh them.
pub(crate) fn filter_listed(params: &SamplingParams, alts: usize, s: &mut Scratch) -> DistInfo {
    let want_alts = alts > 0 && params.logprob_source == LogprobSource::Processed;
    let k = params.top_k as usize;
    s.alts.clear();
    if want_alts {
        s.alts.extend_from_slice(&s.cands);
        top_k(&mut s.alts, alts);
        s.alts.sort_unstable_by(rank);
    }
    top_k(&mut s.cands, k);
    let top = best(&s.cands);
    let temperature = params.effective_temperature();
    weigh(&mut s.cands, top.l, temperature);
    if params.top_p < 1.0 {
        let z: u64 = s.cands.iter().map(|c| c.w).sum();
        top_p_filter(&mut s.cands, top_p_need(z, params.top_p_fixed()));
    }
    if params.min_p > 0.0 {
        let floor = params.min_p_weight();
        s.cands.retain(|c| c.w >= floor);
    }
    s.cands.sort_unstable_by_key(|c| c.id);
    let total = s.cands.iter().map(|c| c.w).sum();
    let top = Cand {
        w: WEIGHT_ONE,
        ..top
    };
    DistInfo {
        total,
        top,
        temperature,
    }
}

/// Draw a survivor of `cands` (sorted by id) with the fixed-point CDF.
pub(crate) fn draw(cands: &[Cand], total: u64, stream: &mut PhiloxStream) -> Cand {
    let t = stream.below(total);
    let mut acc = 0u64;
    for c in cands {
        acc += c.w;
        if acc > t {
            return *c;
        }
    }
    // Unreachable: t < total = sum of weights.
    cands[cands.len() - 1]
}

/// `ln(w / total)` in `f64`, rounded to `f32`.
pub(crate) fn fixed_logprob(w: u64, total: u64) -> f32 {
    ((w as f64).ln() - (total as f64).ln()) as f32
}

/// Log-probabilities of `chosen` and the alternatives (with `fused`, the
/// [`LogprobSource::Sampled`] alternatives are already in `s.alts`).
fn logprobs<L: LogitValue>(
    logits: &[L],
    mask: Option<&[u32]>,
    params: &SamplingParams,
    info: &DistInfo,
    chosen: Cand,
    fused: bool,
    s: &mut Scratch,
) -> Result<(f32, Vec<(u32, f32)>), SampleError> {
    match params.logprob_source {
        LogprobSource::Sampled => {
            let lp = fixed_logprob(chosen.w, info.total);
            if fused {
                // The fused path selected them already.
                let alts = s
                    .alts
                    .iter()
                    .map(|c| (c.id, fixed_logprob(c.w, info.total)))
                    .collect();
                return Ok((lp, alts));
            }
            let n = params.top_logprobs.min(s.cands.len());
            let mut alts = Vec::with_capacity(n);
            if n > 0 {
                s.alts.clear();
                s.alts.extend_from_slice(&s.cands);
                let by_weight = |a: &Cand, b: &Cand| b.w.cmp(&a.w).then(a.id.cmp(&b.id));
                if n < s.alts.len() {
                    s.alts.select_nth_unstable_by(n - 1, by_weight);
                    s.alts.truncate(n);
                }
                s.alts.sort_unstable_by(by_weight);
                alts.extend(
                    s.alts
                        .iter()
                        .map(|c| (c.id, fixed_logprob(c.w, info.total))),
                );
            }
            Ok((lp, alts))
        }
        LogprobSource::Processed => {
            let row = Row {
                logits,
                mask,
                adjust: &s.adjust,
                params,
            };
            let (l_max, t) = (info.top.l, info.temperature);
            let mut sum = 0f64;
            let mut th = f32::NEG_INFINITY;
            row.scan(&mut th, |_, l, _| {
                sum += f64::from(det_exp((l - l_max) / t))
            })?;
            let ln_sum = sum.ln();
            let lp = |l: f32| (f64::from((l - l_max) / t) - ln_sum) as f32;
            let alts = s.alts.iter().map(|c| (c.id, lp(c.l))).collect();
            Ok((lp(chosen.l), alts))
        }
    }
}

/// Samples rows, reusing its buffers between calls.
#[derive(Debug)]
pub struct Sampler {
    scratch: Scratch,
    fused_above: usize,
}

impl Default for Sampler {
    fn default() -> Self {
        Self::with_fused_above(FUSED_ABOVE)
    }
}

impl Sampler {
    /// A sampler with empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// A sampler whose rows without top-k switch to the fused
    /// full-vocabulary path once more than `candidates` tokens are within
    /// reach of a non-zero weight (rows asking for alternatives: allowed at
    /// all) (default [`FUSED_ABOVE`]). A tuning
    /// knob only: every token and log-probability is the same for any value
    /// (`usize::MAX` keeps the listing path, 0 fuses every such row).
    pub fn with_fused_above(candidates: usize) -> Self {
        Self {
            scratch: Scratch::default(),
            fused_above: candidates,
        }
    }

    /// Sample one row. The result depends only on the request.
    pub fn sample<L: LogitValue>(
        &mut self,
        req: &SampleRequest<'_, L>,
    ) -> Result<SampleOutput, SampleError> {
        let s = &mut self.scratch;
        let p = req.params;
        // Top-k rows list at most ~2k tokens.
        let fusable = p.top_k == 0;
        let limit = if fusable {
            self.fused_above
        } else {
            usize::MAX
        };
        let overflow = gather_row(
            req.logits,
            req.mask,
            req.history,
            p,
            p.top_logprobs,
            true,
            limit,
            s,
        )?;
        let mut stream = PhiloxStream::for_draw(p.seed, req.position, DrawKind::Sample);
        let fused = overflow.is_some();
        let (info, chosen) = match overflow {
            None => {
                let info = filter_listed(p, p.top_logprobs, s);
                let chosen = draw(&s.cands, info.total, &mut stream);
                (info, chosen)
            }
            Some(l_max) => {
                let row = Row {
                    logits: req.logits,
                    mask: req.mask,
                    adjust: &s.adjust,
                    params: p,
                };
                s.cands.clear();
                s.alts.clear();
                let (chosen, total) = if p.top_logprobs == 0 {
                    draw_full(&row, l_max, p, &mut stream, &mut s.fused)
                } else {
                    let d = weigh_full(&row, l_max, p, &mut s.fused);
                    let chosen = pick_full(&row, &d, stream.below(d.total), &s.fused);
                    match p.logprob_source {
                        LogprobSource::Sampled => {
                            top_survivors(&row, &d, p.top_logprobs, &s.fused, &mut s.alts);
                        }
                        LogprobSource::Processed => {
                            // The best allowed tokens by adjusted logit, as
                            // the listing's selection over all of them.
                            gather(&row, Some(p.top_logprobs), None, usize::MAX, &mut s.alts)?;
                            s.alts.sort_unstable_by(rank);
                        }
                    }
                    (chosen, d.total)
                };
                let info = DistInfo {
                    total,
                    // Only the maximum logit of `top` is read past this point.
                    top: Cand {
                        id: chosen.id,
                        l: l_max,
                        w: WEIGHT_ONE,
                    },
                    temperature: p.effective_temperature(),
                };
                (info, chosen)
            }
        };
        let (logprob, top_logprobs) = logprobs(req.logits, req.mask, p, &info, chosen, fused, s)?;
        Ok(SampleOutput {
            token: chosen.id,
            logprob,
            top_logprobs,
        })
    }
}

/// Sample one row with fresh buffers (see [`Sampler`] to reuse them).
pub fn sample<L: LogitValue>(req: &SampleRequest<'_, L>) -> Result<SampleOutput, SampleError> {
    Sampler::new().sample(req)
}

/// The filtered distribution as `(token, weight)` pairs sorted by token id,
/// plus the total weight: what [`sample`] draws from. For tests, other
/// engines and kernels that want to check their own filtering.
pub fn filtered_weights<L: LogitValue>(
    logits: &[L],
    mask: Option<&[u32]>,
    history: &[u32],
    params: &SamplingParams,
) -> Result<(Vec<(u32, u64)>, u64), SampleError> {
    let mut s = Scratch::new();
    let info = distribution(logits, mask, history, params, 0, false, &mut s)?;
    Ok((s.cands.iter().map(|c| (c.id, c.w)).collect(), info.total))
}

/// Index into `weights` drawn by the fixed-point CDF for `(seed, position,
/// kind)`: the shared core a GPU kernel reproduces. `None` if all are zero.
pub fn draw_index(weights: &[u64], seed: u64, position: u64, kind: DrawKind) -> Option<usize> {
    let total: u64 = weights.iter().sum();
    if total == 0 {
        return None;
    }
    let mut stream = PhiloxStream::for_draw(seed, position, kind);
    pick(weights, stream.below(total))
}
