//! Property-testing helpers (feature `testing`): the logit-row and parameter strategies and the
//! checks this crate's own tests use, for testing an engine or a device kernel against the
//! sampler.
//!
//! - Rows ([`Row`]: logits, mask, history, parameters, position): [`row`] (ordinary rows with
//!   every filter and log-probability option), [`reference_row`] (ties, wide and tiny logits,
//!   top-k, penalties and bias: for comparing with the sort definition), [`edge_row`] (also huge
//!   spreads, signed zeros, extreme temperatures, all-forbidding mask words). [`logit_row`]
//!   draws the logits alone.
//! - Parameters: [`sampling_params`] (temperature, top-k, top-p, repetition penalty,
//!   alternatives, seed).
//! - Verification: [`VerifyCase`] / [`verify_case`] (drafts, draft probabilities, rarely NaN,
//!   masks).
//! - Checks: [`check_matches_reference`] (the sort definition of [`crate::reference`]),
//!   [`check_fused_matches_listing`] and [`check_fused_alternatives`] (both sampling paths),
//!   [`check_verify_paths_agree`], [`check_batch_invariant`] and
//!   [`check_verify_batch_invariant`] (a row's result does not depend on its batch-mates, its
//!   place or the thread count).
//! - Distributions: [`target_distribution`], [`chi_square`] with [`CHI2_9999`] and
//!   [`degrees_of_freedom`], to check that draws (a kernel's, say) follow the filtered target.
//!
//! Checks return `Err(description)`; in a proptest, `.map_err(TestCaseError::fail)?`.

use proptest::prelude::*;

use crate::reference::{sample_sorted, sorted_weights};
use crate::sampler::filtered_weights;
use crate::{
    LogitValue, LogprobSource, SampleOutput, SampleRequest, Sampler, SamplingParams, Verifier,
    VerifyMode, VerifyRequest, mask_words, sample, sample_batch, verify, verify_batch,
};

/// Returns `Err` with the formatted message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {{
        let holds: bool = $cond;
        if !holds {
            return Err(format!($($msg)+));
        }
    }};
}

/// One row to sample, owning what a [`SampleRequest`] borrows.
#[derive(Debug, Clone)]
pub struct Row {
    /// The logits, one per vocabulary entry.
    pub logits: Vec<f32>,
    /// Grammar bitmask (`mask_words(vocab)` words), if any.
    pub mask: Option<Vec<u32>>,
    /// Tokens the penalties count.
    pub history: Vec<u32>,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// Position of the token (selects the random stream).
    pub position: u64,
}

impl Row {
    /// The request for this row's `f32` logits.
    pub fn request(&self) -> SampleRequest<'_, f32> {
        self.request_with(&self.logits)
    }

    /// The request for this row with other logits of the same length (its logits converted to
    /// `bf16`, say: see [`Row::bf16_logits`]).
    pub fn request_with<'a, L>(&'a self, logits: &'a [L]) -> SampleRequest<'a, L> {
        SampleRequest {
            logits,
            mask: self.mask.as_deref(),
            history: &self.history,
            position: self.position,
            params: &self.params,
        }
    }

    /// The logits rounded to `bf16`.
    pub fn bf16_logits(&self) -> Vec<half::bf16> {
        self.logits
            .iter()
            .map(|&v| half::bf16::from_f32(v))
            .collect()
    }
}

/// Logit values of one flavour: 0 few distinct values (many ties), 1 wide (`±20`), 2 tiny
/// (`±1e-3`), 3 huge spreads (`±1e4`: most weights underflow to 0) with signed zeros, else
/// moderate (`±5`) with signed zeros.
fn edge_logit(flavour: u8) -> BoxedStrategy<f32> {
    match flavour {
        // Few distinct values: many ties, also across the top-p edge.
        0 => (-3i32..4).prop_map(|v| v as f32 * 0.5).boxed(),
        1 => (-20.0f32..20.0).boxed(),
        2 => (-1.0f32..1.0).prop_map(|v| v * 1e-3).boxed(),
        // Huge spreads: most weights underflow to 0.
        3 => prop_oneof![(-1e4f32..1e4), Just(0.0f32), Just(-0.0f32)].boxed(),
        _ => prop_oneof![(-5.0f32..5.0), Just(0.0f32), Just(-0.0f32)].boxed(),
    }
}

/// `vocab` logits of one randomly chosen flavour: many ties, wide, tiny, huge spreads (most
/// weights underflow) or moderate, signed zeros included.
pub fn logit_row(vocab: usize) -> impl Strategy<Value = Vec<f32>> {
    (0u8..5).prop_flat_map(move |f| prop::collection::vec(edge_logit(f), vocab))
}

/// An ordinary row of `vocab` logits in `[-8, 8)`: optional random mask, a short history, top-k,
/// top-p, min-p, temperature (0 often), presence penalty, alternatives and either
/// log-probability source.
pub fn row(vocab: usize) -> impl Strategy<Value = Row> {
    (
        prop::collection::vec(-8.0f32..8.0, vocab),
        prop::option::of(prop::collection::vec(any::<u32>(), mask_words(vocab))),
        prop::collection::vec(0..vocab as u32, 0..6),
        (
            0u32..40,
            prop_oneof![Just(1.0f32), 0.05f32..1.0],
            0.0f32..0.3,
        ),
        (
            prop_oneof![Just(0.0f32), 0.3f32..2.0],
            any::<u64>(),
            0u64..10_000,
        ),
        (0usize..5, any::<bool>(), 0.0f32..0.5),
    )
        .prop_map(
            |(
                logits,
                mask,
                history,
                (top_k, top_p, min_p),
                (t, seed, position),
                (n, processed, pres),
            )| Row {
                logits,
                mask,
                history,
                params: SamplingParams {
                    temperature: t,
                    top_k,
                    top_p,
                    min_p,
                    presence_penalty: pres,
                    seed,
                    top_logprobs: n,
                    logprob_source: if processed {
                        LogprobSource::Processed
                    } else {
                        LogprobSource::Sampled
                    },
                    ..SamplingParams::default()
                },
                position,
            },
        )
}

/// A row of 1 to `max_vocab - 1` logits (ties, wide, tiny or moderate with signed zeros) with
/// every filter (top-k included), penalties and logit bias, sampled-distribution
/// log-probabilities: what [`check_matches_reference`] compares with the sort definition.
pub fn reference_row(max_vocab: usize) -> impl Strategy<Value = Row> {
    (1usize..max_vocab, any::<u64>(), 0u8..4).prop_flat_map(|(vocab, seed, flavour)| {
        // Flavour 3 is the moderate one (no huge spreads).
        let logit = edge_logit(if flavour == 3 { 4 } else { flavour });
        (
            prop::collection::vec(logit, vocab),
            prop::option::of(prop::collection::vec(
                prop_oneof![Just(u32::MAX), any::<u32>()],
                mask_words(vocab),
            )),
            prop::collection::vec(0..vocab as u32, 0..8),
            prop_oneof![Just(0u32), 1u32..60],
            prop_oneof![Just(1.0f32), 0.01f32..1.0],
            prop_oneof![Just(0.0f32), 0.0f32..0.5],
            prop_oneof![Just(0.0f32), Just(0.7f32), Just(1.0f32), Just(2.5f32)],
            prop_oneof![Just(1.0f32), 0.5f32..2.0],
            (-1.0f32..1.0, -1.0f32..1.0),
            prop::collection::vec((0..vocab as u32, -3.0f32..3.0), 0..4),
            0u64..1_000_000,
        )
            .prop_map(
                move |(
                    logits,
                    mask,
                    history,
                    top_k,
                    top_p,
                    min_p,
                    t,
                    rep,
                    (pres, freq),
                    bias,
                    position,
                )| {
                    Row {
                        logits,
                        mask,
                        history,
                        params: SamplingParams {
                            temperature: t,
                            top_k,
                            top_p,
                            min_p,
                            repetition_penalty: rep,
                            presence_penalty: pres,
                            frequency_penalty: freq,
                            logit_bias: bias,
                            seed,
                            ..SamplingParams::default()
                        },
                        position,
                    }
                },
            )
    })
}

/// A hard row of 1 to `max_vocab - 1` logits (any [`logit_row`] flavour: ties, huge spreads,
/// signed zeros), masks with all-forbidding words, top-p and min-p at their edges, temperatures
/// from greedy to 100, penalties, bias and either log-probability source; no top-k (so both
/// sampling paths of [`check_fused_matches_listing`] apply).
pub fn edge_row(max_vocab: usize) -> impl Strategy<Value = Row> {
    (1usize..max_vocab, any::<u64>(), 0u8..5).prop_flat_map(|(vocab, seed, flavour)| {
        let logit = edge_logit(flavour);
        (
            prop::collection::vec(logit, vocab),
            prop::option::of(prop::collection::vec(
                prop_oneof![Just(u32::MAX), any::<u32>(), Just(0u32)],
                mask_words(vocab),
            )),
            prop::collection::vec(0..vocab as u32, 0..8),
            prop_oneof![Just(1.0f32), 0.01f32..1.0, Just(0.999_999f32)],
            prop_oneof![Just(0.0f32), 0.0f32..0.5, Just(1.0f32)],
            prop_oneof![
                Just(1.0f32),
                Just(0.0f32),
                0.05f32..4.0,
                Just(1e-4f32),
                Just(100.0f32)
            ],
            prop_oneof![Just(1.0f32), 0.5f32..2.0],
            (-1.0f32..1.0, -1.0f32..1.0),
            prop::collection::vec((0..vocab as u32, -3.0f32..3.0), 0..4),
            (0u64..1_000_000, any::<bool>()),
        )
            .prop_map(
                move |(
                    logits,
                    mask,
                    history,
                    top_p,
                    min_p,
                    temperature,
                    repetition_penalty,
                    (presence_penalty, frequency_penalty),
                    logit_bias,
                    (position, processed),
                )| Row {
                    logits,
                    mask,
                    history,
                    params: SamplingParams {
                        temperature,
                        top_p,
                        min_p,
                        repetition_penalty,
                        presence_penalty,
                        frequency_penalty,
                        logit_bias,
                        seed,
                        logprob_source: if processed {
                            LogprobSource::Processed
                        } else {
                            LogprobSource::Sampled
                        },
                        ..SamplingParams::default()
                    },
                    position,
                },
            )
    })
}

/// Sampling parameters: temperature (0 often, else `[0.05, 2)`), top-k (0 often, else `1..8`),
/// top-p, repetition penalty, 0 to 2 alternatives and any seed.
pub fn sampling_params() -> impl Strategy<Value = SamplingParams> {
    (
        prop_oneof![Just(0.0f32), 0.05f32..2.0],
        prop_oneof![Just(0u32), 1u32..8],
        prop_oneof![Just(1.0f32), 0.3f32..1.0],
        prop_oneof![Just(1.0f32), 1.05f32..1.6],
        0usize..3,
        any::<u64>(),
    )
        .prop_map(
            |(temperature, top_k, top_p, rep, top_logprobs, seed)| SamplingParams {
                temperature,
                top_k,
                top_p,
                repetition_penalty: rep,
                top_logprobs,
                seed,
                ..SamplingParams::default()
            },
        )
}

/// A verification case: `n` drafts over a vocabulary, owning what a [`VerifyRequest`] borrows.
#[derive(Debug, Clone)]
pub struct VerifyCase {
    /// Vocabulary size.
    pub vocab: usize,
    /// Target logits, `(n + 1) * vocab`.
    pub target: Vec<f32>,
    /// The `n` drafts.
    pub drafts: Vec<u32>,
    /// Draft probabilities, `n * vocab` (rarely NaN, some rows sum far above 1).
    pub q: Vec<f32>,
    /// Masks for the `n + 1` positions, if any.
    pub masks: Option<Vec<u32>>,
    /// Tokens the penalties count.
    pub history: Vec<u32>,
    /// Target sampling parameters.
    pub params: SamplingParams,
    /// Position of the first draft.
    pub position: u64,
}

impl VerifyCase {
    /// The request for `target` (this case's target logits, or the same converted) in `mode`,
    /// with the case's draft probabilities or none.
    pub fn request<'a, L>(
        &'a self,
        target: &'a [L],
        mode: VerifyMode,
        with_q: bool,
    ) -> VerifyRequest<'a, L> {
        VerifyRequest {
            target_logits: target,
            vocab: self.vocab,
            draft_tokens: &self.drafts,
            draft_probs: with_q.then_some(&self.q[..]),
            masks: self.masks.as_deref(),
            history: &self.history,
            position: self.position,
            params: &self.params,
            mode,
        }
    }
}

/// A [`VerifyCase`] of 0 to 3 drafts over 1 to `max_vocab - 1` tokens: tie-heavy, wide, tiny or
/// moderate target logits; draft probabilities near the target scale, large or zero, rarely NaN;
/// masks that are mostly all-allowing.
pub fn verify_case(max_vocab: usize) -> impl Strategy<Value = VerifyCase> {
    (1usize..max_vocab, 0usize..4, any::<u64>(), 0u8..4).prop_flat_map(
        |(vocab, n, seed, flavour)| {
            let logit = match flavour {
                0 => (-3i32..4).prop_map(|v| v as f32 * 0.5).boxed(),
                1 => (-20.0f32..20.0).boxed(),
                2 => (-1.0f32..1.0).prop_map(|v| v * 1e-3).boxed(),
                _ => prop_oneof![(-5.0f32..5.0), Just(0.0f32)].boxed(),
            };
            // Draft probabilities: near the target scale (1 / vocab), large
            // (sums far above 1, empty residuals) or zero; rarely invalid.
            let scale = 1.0 / vocab as f32;
            let qv = prop_oneof![
                8 => (0.0f32..4.0).prop_map(move |x| x * scale),
                2 => 0.0f32..1.0,
                1 => Just(0.0f32),
                1 => Just(f32::NAN),
            ];
            (
                prop::collection::vec(logit, (n + 1) * vocab),
                prop::collection::vec(0..vocab as u32, n),
                prop::collection::vec(qv, n * vocab),
                prop::option::of(prop::collection::vec(
                    prop_oneof![4 => Just(u32::MAX), 1 => any::<u32>()],
                    (n + 1) * mask_words(vocab),
                )),
                prop::collection::vec(0..vocab as u32, 0..6),
                prop_oneof![Just(1.0f32), 0.05f32..1.0],
                prop_oneof![Just(0.0f32), 0.0f32..0.3],
                prop_oneof![Just(1.0f32), 0.1f32..3.0, Just(1e-4f32)],
                (0u64..1_000_000, any::<bool>(), 0.5f32..1.5),
            )
                .prop_map(
                    move |(
                        target,
                        drafts,
                        mut q,
                        masks,
                        history,
                        top_p,
                        min_p,
                        temperature,
                        (position, clean, repetition_penalty),
                    )| {
                        if clean {
                            // Most rows: no invalid value anywhere.
                            q.iter_mut().filter(|x| x.is_nan()).for_each(|x| *x = 0.0);
                        }
                        VerifyCase {
                            vocab,
                            target,
                            drafts,
                            q,
                            masks,
                            history,
                            params: SamplingParams {
                                temperature,
                                top_p,
                                min_p,
                                repetition_penalty,
                                seed,
                                ..SamplingParams::default()
                            },
                            position,
                        }
                    },
                )
        },
    )
}

/// Checks the sampler against the sort-then-filter definition ([`crate::reference`]): the same
/// filtered weights, and the same token and log-probability (bit for bit) or the same error.
/// For [`LogprobSource::Sampled`] rows.
pub fn check_matches_reference<L: LogitValue>(req: &SampleRequest<'_, L>) -> Result<(), String> {
    let fast = filtered_weights(req.logits, req.mask, req.history, req.params);
    let slow = sorted_weights(req.logits, req.mask, req.history, req.params);
    ensure!(fast == slow, "weights: fast {fast:?}, sorted {slow:?}");
    match (sample(req), sample_sorted(req)) {
        (Ok(a), Ok((token, lp))) => {
            ensure!(a.token == token, "token: fast {}, sorted {token}", a.token);
            ensure!(
                a.logprob.to_bits() == lp.to_bits(),
                "logprob: fast {}, sorted {lp}",
                a.logprob
            );
        }
        (Err(a), Err(b)) => ensure!(a == b, "errors: fast {a:?}, sorted {b:?}"),
        (a, b) => return Err(format!("fast {a:?} vs sorted {b:?}")),
    }
    Ok(())
}

/// Checks that the fused full-vocabulary path, the listing path and the default sampler give the
/// same output (log-probability bit for bit), and for [`LogprobSource::Sampled`] the sort
/// definition's token and log-probability.
pub fn check_fused_matches_listing<L: LogitValue>(
    req: &SampleRequest<'_, L>,
) -> Result<(), String> {
    let fused = Sampler::with_fused_above(0).sample(req);
    let listed = Sampler::with_fused_above(usize::MAX).sample(req);
    let default = Sampler::new().sample(req);
    ensure!(fused == listed, "fused {fused:?}, listed {listed:?}");
    ensure!(default == listed, "default {default:?}, listed {listed:?}");
    if let (Ok(out), Ok(l)) = (&fused, &listed) {
        ensure!(
            out.logprob.to_bits() == l.logprob.to_bits(),
            "logprob bits: fused {}, listed {}",
            out.logprob,
            l.logprob
        );
        if req.params.logprob_source == LogprobSource::Sampled {
            let (token, lp) = sample_sorted(req).map_err(|e| format!("sorted: {e:?}"))?;
            ensure!(
                out.token == token,
                "token: fused {}, sorted {token}",
                out.token
            );
            ensure!(
                out.logprob.to_bits() == lp.to_bits(),
                "logprob: fused {}, sorted {lp}",
                out.logprob
            );
        }
    }
    Ok(())
}

/// Checks that both sampling paths report the same token, log-probability and alternatives, bit
/// for bit (for rows with `top_logprobs > 0`).
pub fn check_fused_alternatives<L: LogitValue>(req: &SampleRequest<'_, L>) -> Result<(), String> {
    let fused = Sampler::with_fused_above(0).sample(req);
    let listed = Sampler::with_fused_above(usize::MAX).sample(req);
    ensure!(
        format!("{fused:?}") == format!("{listed:?}"),
        "fused {fused:?}, listed {listed:?}"
    );
    if let (Ok(f), Ok(l)) = (&fused, &listed) {
        let bits = |o: &SampleOutput| -> Vec<(u32, u32)> {
            std::iter::once((o.token, o.logprob.to_bits()))
                .chain(o.top_logprobs.iter().map(|&(t, lp)| (t, lp.to_bits())))
                .collect()
        };
        ensure!(bits(f) == bits(l), "bits: fused {f:?}, listed {l:?}");
        ensure!(
            f.top_logprobs.len() == l.top_logprobs.len(),
            "alternatives: fused {}, listed {}",
            f.top_logprobs.len(),
            l.top_logprobs.len()
        );
    }
    Ok(())
}

/// Checks that the fused and listing verification paths and the default verifier agree: the same
/// accepted count, tokens and log-probabilities (bit for bit), or the same error.
pub fn check_verify_paths_agree<L: LogitValue>(req: &VerifyRequest<'_, L>) -> Result<(), String> {
    let fused = Verifier::with_fused_above(0).verify(req);
    let listed = Verifier::with_fused_above(usize::MAX).verify(req);
    let default = Verifier::new().verify(req);
    // Errors carry the offending value (possibly NaN): compare them as text.
    ensure!(
        format!("{default:?}") == format!("{listed:?}"),
        "default {default:?}, listed {listed:?}"
    );
    match (&fused, &listed) {
        (Ok(f), Ok(l)) => {
            ensure!(
                f.accepted == l.accepted,
                "accepted: fused {}, listed {}",
                f.accepted,
                l.accepted
            );
            ensure!(
                f.tokens == l.tokens,
                "tokens: fused {:?}, listed {:?}",
                f.tokens,
                l.tokens
            );
            let fb: Vec<u32> = f.logprobs.iter().map(|x| x.to_bits()).collect();
            let lb: Vec<u32> = l.logprobs.iter().map(|x| x.to_bits()).collect();
            ensure!(
                fb == lb,
                "logprobs: fused {:?}, listed {:?}",
                f.logprobs,
                l.logprobs
            );
        }
        _ => ensure!(
            format!("{fused:?}") == format!("{listed:?}"),
            "fused {fused:?}, listed {listed:?}"
        ),
    }
    Ok(())
}

fn pool(n: usize) -> Result<rayon::ThreadPool, String> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .map_err(|e| e.to_string())
}

/// Checks that [`sample_batch`] gives each row what [`sample`] gives it alone, on 1, 2 and 3
/// threads, and with the batch reversed then rotated left by `rotate`.
pub fn check_batch_invariant(reqs: &[SampleRequest<'_, f32>], rotate: usize) -> Result<(), String> {
    let base = pool(1)?.install(|| sample_batch(reqs));
    // Each row alone, with fresh buffers.
    for (i, (r, b)) in reqs.iter().zip(&base).enumerate() {
        let alone = sample(r);
        ensure!(&alone == b, "row {i}: alone {alone:?}, in the batch {b:?}");
    }
    // Other thread counts.
    for threads in [2, 3] {
        let out = pool(threads)?.install(|| sample_batch(reqs));
        ensure!(
            out == base,
            "{threads} threads: {out:?}, one thread {base:?}"
        );
    }
    if reqs.is_empty() {
        return Ok(());
    }
    // Reordered batch (reverse, then rotate).
    let mut order: Vec<usize> = (0..reqs.len()).rev().collect();
    let k = rotate % order.len();
    order.rotate_left(k);
    let shuffled: Vec<_> = order.iter().map(|&i| reqs[i]).collect();
    let out = pool(2)?.install(|| sample_batch(&shuffled));
    for (pos, &i) in order.iter().enumerate() {
        ensure!(
            out[pos] == base[i],
            "row {i} at place {pos}: {:?}, in order {:?}",
            out[pos],
            base[i]
        );
    }
    Ok(())
}

/// Checks that [`verify_batch`] gives each row what [`verify()`] gives it alone, on 1 and 3
/// threads, and with the batch reversed.
pub fn check_verify_batch_invariant(reqs: &[VerifyRequest<'_, f32>]) -> Result<(), String> {
    let base = pool(1)?.install(|| verify_batch(reqs));
    for (i, (r, b)) in reqs.iter().zip(&base).enumerate() {
        let alone = verify(r);
        ensure!(&alone == b, "row {i}: alone {alone:?}, in the batch {b:?}");
    }
    let out = pool(3)?.install(|| verify_batch(reqs));
    ensure!(out == base, "3 threads: {out:?}, one thread {base:?}");
    let rev: Vec<_> = reqs.iter().rev().copied().collect();
    let mut out = pool(2)?.install(|| verify_batch(&rev));
    out.reverse();
    ensure!(out == base, "reversed: {out:?}, in order {base:?}");
    Ok(())
}

/// Pearson chi-square of `counts` against probabilities `p`.
///
/// # Panics
///
/// If a cell with probability 0 has a count (a token that cannot be drawn was drawn).
pub fn chi_square(counts: &[u64], p: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    let mut chi = 0.0;
    for (&c, &pi) in counts.iter().zip(p) {
        if pi == 0.0 {
            assert_eq!(c, 0, "a token with probability 0 was drawn");
            continue;
        }
        let e = pi * n as f64;
        chi += (c as f64 - e).powi(2) / e;
    }
    chi
}

/// Chi-square 99.99 % quantiles for 1..=9 degrees of freedom (index 0 unused).
pub const CHI2_9999: [f64; 10] = [
    0.0, 15.14, 18.42, 21.11, 23.51, 25.74, 27.86, 29.88, 31.83, 33.72,
];

/// The filtered target distribution of an unmasked row without history: each token's
/// probability under `params` (0 for filtered-out tokens).
///
/// # Panics
///
/// If the row cannot be sampled (invalid parameters or non-finite logits).
pub fn target_distribution(logits: &[f32], params: &SamplingParams) -> Vec<f64> {
    let (ws, total) = filtered_weights(logits, None, &[], params).expect("a valid row");
    let mut p = vec![0.0; logits.len()];
    for (id, w) in ws {
        p[id as usize] = w as f64 / total as f64;
    }
    p
}

/// Degrees of freedom of a chi-square test against `p`: the non-zero cells minus one.
pub fn degrees_of_freedom(p: &[f64]) -> usize {
    p.iter().filter(|&&x| x > 0.0).count().saturating_sub(1)
}
