//! Speculative verification of a draft prefix against target logits.
//!
//! For drafts `d_0..d_{n-1}` at positions `position..position+n-1` with draft
//! probabilities `q` and filtered target distributions `p` (the same pipeline
//! as [`crate::sample`]):
//! * stochastic: draft `i` is accepted when the coin `u` (stream
//!   [`DrawKind::Coin`] at `position + i`, [`PhiloxStream::uniform_f64`])
//!   satisfies `u * q(d_i) < p(d_i)`, with `p(d_i) = w(d_i) / W` in `f64`
//!   (the division-free form of `u < p/q`). At the first rejection the token
//!   is redrawn ([`DrawKind::Resample`]) from the residual
//!   `max(p - q * exp(-5e-5), 0)` in fixed point (see [`residual_weight`]).
//!   When all drafts are accepted a bonus token is drawn from the target
//!   distribution of `position + n` ([`DrawKind::Sample`]).
//! * greedy: draft `i` is accepted when it equals the best-ranked token of
//!   `p_i`; the first mismatch emits that token; all accepted adds the best
//!   token of position `position + n`.
//! * match (drafts that are a function of the context, such as a drafter's
//!   argmax chain): position `position + i` draws its token exactly as
//!   [`crate::sample`] would (same stream, same history with the accepted
//!   drafts appended), and draft `i` is accepted iff it equals that token.
//!   The tokens are the ones sampling without drafts gives, token for token,
//!   so the output distribution is the target's at every temperature
//!   (greedy included: temperature 0 takes the sampler's clamped path, ties
//!   too). A draft `d` is accepted with probability `p(d)`: what rejection
//!   sampling against the point mass `q = δ_d` gives.
//!
//! The guard `exp(-5e-5)` scales `q` down by 0.005 %, so the residual
//! `p - q * c` keeps positive mass even when `q` was rounded to sum slightly
//! above 1 (its integer weights sum to more than `W * (1 - c)` whenever
//! `sum q <= 1 / c`). It moves the output distribution by a negligible but
//! non-zero amount: after a rejection, tokens with `p ≈ q` keep a residual
//! weight of about `5e-5 * q` instead of zero. If the residual still comes out
//! empty (`q` summing above `1 / c` on the survivors) the token is redrawn
//! from `p` itself.
//!
//! Positions without top-k whose distribution spans more than
//! [`crate::sampler::FUSED_ABOVE`] tokens are weighed by the fused
//! full-vocabulary path (block sums, then per-block residual sums for the
//! resample; greedy: the first token with the maximum logit) instead of being
//! listed: the same decisions, tokens and
//! log-probabilities bit for bit ([`Verifier::with_fused_above`]).

use crate::error::SampleError;
use crate::filter::Cand;
use crate::fixed_point::WEIGHT_ONE;
use crate::fused::{first_max, pick_full, pick_residual, residual_full, weigh_full, weight_full};
use crate::logits::{LogitValue, Row, mask_words};
use crate::params::SamplingParams;
use crate::rng::{DrawKind, PhiloxStream};
use crate::sampler::{
    DistInfo, FUSED_ABOVE, SampleRequest, Sampler, Scratch, distribution, draw, filter_listed,
    fixed_logprob, gather_row,
};

/// `exp(-5e-5)` as the `f64` with bits `0x3FEF_FF97_2520_1F4A`: the factor
/// that scales draft probabilities in the residual.
pub const RESIDUAL_GUARD: f64 = 0.999_950_001_249_979_1;

/// How drafts are judged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum VerifyMode {
    /// Accept a draft iff it is the target's best token.
    Greedy,
    /// Rejection sampling: the output follows the target distribution
    /// whatever the draft distribution, provided the drafts were drawn from
    /// the `draft_probs` given.
    #[default]
    Stochastic,
    /// Drafts that are a deterministic function of the context (argmax
    /// drafts): each position samples as [`crate::sample`] does and a draft
    /// is accepted iff it equals the sampled token, so the tokens equal
    /// those of sampling without drafts. `draft_probs` is not read.
    Match,
}

/// One row to verify.
#[derive(Clone, Copy, Debug)]
pub struct VerifyRequest<'a, L> {
    /// Target logits for positions `position..=position + n`, row-major,
    /// `(n + 1) * vocab` values.
    pub target_logits: &'a [L],
    /// Vocabulary size (row length).
    pub vocab: usize,
    /// The `n` draft tokens.
    pub draft_tokens: &'a [u32],
    /// Draft probabilities, `n * vocab` values (required in stochastic mode).
    pub draft_probs: Option<&'a [f32]>,
    /// Grammar masks for the `n + 1` positions, `(n + 1) * ceil(vocab / 32)`
    /// words (mask `i` assumes drafts before `i` were accepted).
    pub masks: Option<&'a [u32]>,
    /// Tokens the penalties count before the first draft; drafts before
    /// position `i` are appended for position `i`.
    pub history: &'a [u32],
    /// Position of the first draft token.
    pub position: u64,
    /// Target sampling parameters (seed included).
    pub params: &'a SamplingParams,
    /// Greedy or stochastic.
    pub mode: VerifyMode,
}

/// Result of verifying one row.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyOutput {
    /// How many drafts were accepted.
    pub accepted: usize,
    /// The accepted drafts followed by the correction or bonus token
    /// (`accepted + 1` tokens).
    pub tokens: Vec<u32>,
    /// Log-probability of each token under the filtered target distribution
    /// of its position (fixed point, `ln(w / W)`).
    pub logprobs: Vec<f32>,
    /// Each token's best alternatives as [`crate::SampleOutput::top_logprobs`]
    /// reports them ([`SamplingParams::top_logprobs`] of them), in
    /// [`VerifyMode::Match`]; empty lists in the other modes.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
}

/// Residual weight of a survivor: `w - min(w, floor((q * RESIDUAL_GUARD) * W))`
/// with `q` and `W` as `f64` and the products rounded in that order.
pub fn residual_weight(w: u64, q: f32, total: u64) -> u64 {
    let scaled = (f64::from(q) * RESIDUAL_GUARD) * total as f64;
    w - w.min(scaled as u64)
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), SampleError> {
    if expected == got {
        Ok(())
    } else {
        Err(SampleError::DraftLengthMismatch {
            what,
            expected,
            got,
        })
    }
}

/// A draft probability the verifier accepts: finite, in `[0, 1]`.
#[inline(always)]
fn valid_q(value: f32) -> bool {
    value.is_finite() && (0.0..=1.0).contains(&value)
}

fn check_q(draft: usize, token: u32, value: f32) -> Result<f32, SampleError> {
    if valid_q(value) {
        Ok(value)
    } else {
        Err(SampleError::InvalidDraftProbability {
            draft,
            token,
            value,
        })
    }
}

fn weight_of_token(cands: &[Cand], token: u32) -> u64 {
    cands
        .binary_search_by_key(&token, |c| c.id)
        .map_or(0, |i| cands[i].w)
}

/// Verifies rows, reusing its buffers between calls.
#[derive(Debug)]
pub struct Verifier {
    scratch: Scratch,
    history: Vec<u32>,
    residual: Vec<Cand>,
    fused_above: usize,
    /// The sampler of [`VerifyMode::Match`] (same fused threshold).
    sampler: Sampler,
}

impl Default for Verifier {
    fn default() -> Self {
        Self::with_fused_above(FUSED_ABOVE)
    }
}

/// What one position gives: a token, its log-probability, and whether it
/// was an accepted draft.
struct Step {
    token: u32,
    logprob: f32,
    accepted: bool,
}

impl Step {
    fn new(c: Cand, total: u64, accepted: bool) -> Self {
        Self {
            token: c.id,
            logprob: fixed_logprob(c.w, total),
            accepted,
        }
    }
}

impl Verifier {
    /// A verifier with empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// A verifier whose positions without top-k take the fused
    /// full-vocabulary path (as [`crate::Sampler::with_fused_above`]) once
    /// more than `candidates` tokens are within reach of a non-zero weight.
    /// A tuning knob only: every accepted length, token and log-probability
    /// is the same for any value (`usize::MAX` keeps the listing path).
    pub fn with_fused_above(candidates: usize) -> Self {
        Self {
            scratch: Scratch::default(),
            history: Vec::new(),
            residual: Vec::new(),
            fused_above: candidates,
            sampler: Sampler::with_fused_above(candidates),
        }
    }

    /// Verify one row. The result depends only on the request.
    pub fn verify<L: LogitValue>(
        &mut self,
        req: &VerifyRequest<'_, L>,
    ) -> Result<VerifyOutput, SampleError> {
        let n = req.draft_tokens.len();
        let v = req.vocab;
        if v == 0 || v > u32::MAX as usize {
            return Err(SampleError::BadVocab(v));
        }
        check_len("target logits", (n + 1) * v, req.target_logits.len())?;
        if let Some(m) = req.masks {
            check_len("masks", (n + 1) * mask_words(v), m.len())?;
        }
        if req.mode == VerifyMode::Match {
            for &t in req.draft_tokens {
                if t as usize >= v {
                    return Err(SampleError::TokenOutOfRange { token: t, vocab: v });
                }
            }
            return self.verify_match(req);
        }
        let q = match (req.mode, req.draft_probs) {
            (VerifyMode::Stochastic, None) => {
                return Err(SampleError::DraftLengthMismatch {
                    what: "draft probabilities",
                    expected: n * v,
                    got: 0,
                });
            }
            (_, Some(q)) => {
                check_len("draft probabilities", n * v, q.len())?;
                Some(q)
            }
            (_, None) => None,
        };
        for &t in req.draft_tokens {
            if t as usize >= v {
                return Err(SampleError::TokenOutOfRange { token: t, vocab: v });
            }
        }
        let mut out = VerifyOutput {
            accepted: 0,
            tokens: Vec::with_capacity(n + 1),
            logprobs: Vec::with_capacity(n + 1),
            top_logprobs: Vec::with_capacity(n + 1),
        };
        for i in 0..=n {
            let step = self.step(req, q, i)?;
            out.tokens.push(step.token);
            out.logprobs.push(step.logprob);
            out.top_logprobs.push(Vec::new());
            if !step.accepted {
                break;
            }
            out.accepted += 1;
        }
        Ok(out)
    }

    /// [`VerifyMode::Match`]: sample each position as [`crate::sample`]
    /// does until a draft differs from its position's token.
    fn verify_match<L: LogitValue>(
        &mut self,
        req: &VerifyRequest<'_, L>,
    ) -> Result<VerifyOutput, SampleError> {
        let n = req.draft_tokens.len();
        let v = req.vocab;
        let words = mask_words(v);
        let mut out = VerifyOutput {
            accepted: 0,
            tokens: Vec::with_capacity(n + 1),
            logprobs: Vec::with_capacity(n + 1),
            top_logprobs: Vec::with_capacity(n + 1),
        };
        self.history.clear();
        self.history.extend_from_slice(req.history);
        for i in 0..=n {
            let s = self.sampler.sample(&SampleRequest {
                logits: &req.target_logits[i * v..(i + 1) * v],
                mask: req.masks.map(|m| &m[i * words..(i + 1) * words]),
                history: &self.history,
                position: req.position.wrapping_add(i as u64),
                params: req.params,
            })?;
            let accepted = i < n && s.token == req.draft_tokens[i];
            out.tokens.push(s.token);
            out.logprobs.push(s.logprob);
            out.top_logprobs.push(s.top_logprobs);
            if !accepted {
                break;
            }
            self.history.push(req.draft_tokens[i]);
            out.accepted += 1;
        }
        Ok(out)
    }

    /// Position `i`: the accept test of draft `i`, or the bonus token when
    /// `i` is the number of drafts.
    fn step<L: LogitValue>(
        &mut self,
        req: &VerifyRequest<'_, L>,
        q: Option<&[f32]>,
        i: usize,
    ) -> Result<Step, SampleError> {
        let v = req.vocab;
        let words = mask_words(v);
        let logits = &req.target_logits[i * v..(i + 1) * v];
        let mask = req.masks.map(|m| &m[i * words..(i + 1) * words]);
        let params = req.params;
        self.history.clear();
        self.history.extend_from_slice(req.history);
        self.history.extend_from_slice(&req.draft_tokens[..i]);
        // Top-k rows list at most k tokens anyway.
        let limit = if params.top_k == 0 {
            self.fused_above
        } else {
            usize::MAX
        };
        let overflow = gather_row(
            logits,
            mask,
            &self.history,
            params,
            0,
            true,
            limit,
            &mut self.scratch,
        )?;
        let pos = req.position.wrapping_add(i as u64);
        let n = req.draft_tokens.len();
        if let Some(l_max) = overflow {
            let Scratch { adjust, fused, .. } = &mut self.scratch;
            let row = Row {
                logits,
                mask,
                adjust,
                params,
            };
            let d = weigh_full(&row, l_max, params, fused);
            let Some(q) = q.filter(|_| req.mode == VerifyMode::Stochastic) else {
                // Greedy: the best-ranked token is the first with the maximum.
                let top = Cand {
                    id: first_max(&row, l_max),
                    l: l_max,
                    w: WEIGHT_ONE,
                };
                if i < n && req.draft_tokens[i] == top.id {
                    let w = weight_full(&row, &d, top.id, fused);
                    return Ok(Step::new(Cand { w, ..top }, d.total, true));
                }
                return Ok(Step::new(top, d.total, false));
            };
            let d = weigh_full(&row, l_max, params, fused);
            if i == n {
                let mut st = PhiloxStream::for_draw(params.seed, pos, DrawKind::Sample);
                let c = pick_full(&row, &d, st.below(d.total), fused);
                return Ok(Step::new(c, d.total, false));
            }
            let dt = req.draft_tokens[i];
            let wd = weight_full(&row, &d, dt, fused);
            let qd = check_q(i, dt, q[i * v + dt as usize])?;
            if coin_accepts(params.seed, pos, wd, d.total, qd) {
                return Ok(Step::new(
                    Cand {
                        id: dt,
                        l: 0.0,
                        w: wd,
                    },
                    d.total,
                    true,
                ));
            }
            let q_row = &q[i * v..(i + 1) * v];
            // No early exit, so the check vectorises.
            if q_row.iter().fold(true, |ok, &x| ok & valid_q(x)) {
                let rtotal = residual_full(&row, &d, q_row, fused);
                let mut st = PhiloxStream::for_draw(params.seed, pos, DrawKind::Resample);
                let c = if rtotal > 0 {
                    pick_residual(&row, &d, q_row, st.below(rtotal), fused)
                } else {
                    pick_full(&row, &d, st.below(d.total), fused)
                };
                return Ok(Step::new(c, d.total, false));
            }
            // An invalid draft probability somewhere in the row: the listing
            // decides whether a survivor carries it (an error) or not.
            let info = distribution(
                logits,
                mask,
                &self.history,
                params,
                0,
                true,
                &mut self.scratch,
            )?;
            let fix = self.listed_residual(q_row, i, pos, params.seed, &info)?;
            return Ok(Step::new(fix, info.total, false));
        }
        let info = filter_listed(params, 0, &mut self.scratch);
        let cands = &self.scratch.cands;
        if i == n {
            let bonus = match req.mode {
                VerifyMode::Greedy => info.top,
                VerifyMode::Stochastic | VerifyMode::Match => {
                    let mut st = PhiloxStream::for_draw(params.seed, pos, DrawKind::Sample);
                    draw(cands, info.total, &mut st)
                }
            };
            return Ok(Step::new(bonus, info.total, false));
        }
        let d = req.draft_tokens[i];
        let wd = weight_of_token(cands, d);
        let accept = match (req.mode, q) {
            (VerifyMode::Stochastic, Some(q)) => {
                let qd = check_q(i, d, q[i * v + d as usize])?;
                coin_accepts(params.seed, pos, wd, info.total, qd)
            }
            _ => d == info.top.id,
        };
        if accept {
            return Ok(Step::new(
                Cand {
                    id: d,
                    l: 0.0,
                    w: wd,
                },
                info.total,
                true,
            ));
        }
        let fix = match (req.mode, q) {
            (VerifyMode::Stochastic, Some(q)) => {
                self.listed_residual(&q[i * v..(i + 1) * v], i, pos, params.seed, &info)?
            }
            _ => info.top,
        };
        Ok(Step::new(fix, info.total, false))
    }

    /// The correction token after a rejection, drawn from the residual of
    /// the listed distribution in `self.scratch.cands`.
    fn listed_residual(
        &mut self,
        q_row: &[f32],
        i: usize,
        pos: u64,
        seed: u64,
        info: &DistInfo,
    ) -> Result<Cand, SampleError> {
        let cands = &self.scratch.cands;
        self.residual.clear();
        for c in cands {
            let qx = check_q(i, c.id, q_row[c.id as usize])?;
            self.residual.push(Cand {
                w: residual_weight(c.w, qx, info.total),
                ..*c
            });
        }
        let rtotal: u64 = self.residual.iter().map(|c| c.w).sum();
        let mut st = PhiloxStream::for_draw(seed, pos, DrawKind::Resample);
        let pick = if rtotal > 0 {
            draw(&self.residual, rtotal, &mut st)
        } else {
            draw(cands, info.total, &mut st)
        };
        Ok(Cand {
            w: weight_of_token(cands, pick.id),
            ..pick
        })
    }
}

/// The accept test `u * q(d) < p(d)`, `p(d) = w(d) / W` in `f64`, with the
/// coin of `(seed, pos)`.
fn coin_accepts(seed: u64, pos: u64, wd: u64, total: u64, qd: f32) -> bool {
    let pd = wd as f64 / total as f64;
    let u = PhiloxStream::for_draw(seed, pos, DrawKind::Coin).uniform_f64();
    u * f64::from(qd) < pd
}

/// Verify one row with fresh buffers (see [`Verifier`] to reuse them).
pub fn verify<L: LogitValue>(req: &VerifyRequest<'_, L>) -> Result<VerifyOutput, SampleError> {
    Verifier::new().verify(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_constant_is_exp() {
        let e = (-5e-5f64).exp();
        assert!((e - RESIDUAL_GUARD).abs() <= f64::EPSILON);
        assert_eq!(RESIDUAL_GUARD.to_bits(), 0x3FEF_FF97_2520_1F4A);
    }

    #[test]
    fn residual_saturates() {
        assert_eq!(residual_weight(10, 1.0, 10), 1);
        assert_eq!(residual_weight(0, 0.5, 10), 0);
        assert_eq!(residual_weight(10, 0.0, 10), 10);
    }
}
