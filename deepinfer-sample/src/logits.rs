//! A logits row as the sampler sees it: values of either precision, the
//! grammar bitmask, and the sparse bias/penalty adjustments.

use crate::error::SampleError;
use crate::params::SamplingParams;

/// A logit element type the sampler reads (`f32` or `half::bf16`).
pub trait LogitValue: Copy + Send + Sync + 'static {
    /// The value as `f32` (exact for both supported types).
    fn to_f32(self) -> f32;
}

impl LogitValue for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl LogitValue for half::bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
}

/// Words of a packed bitmask for `vocab` tokens: `ceil(vocab / 32)`.
/// Bit `t % 32` of word `t / 32` set means token `t` is allowed.
pub fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

/// Whether `token` is allowed by `mask` (no mask allows everything).
#[inline]
pub fn allowed(mask: Option<&[u32]>, token: u32) -> bool {
    match mask {
        None => true,
        Some(m) => m[(token / 32) as usize] >> (token % 32) & 1 == 1,
    }
}

/// A sparse change of one token's logit: bias plus history count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Adjust {
    pub id: u32,
    pub bias: f32,
    pub count: u32,
}

/// Adjusted logit: `l + bias`, then (if the token is in the history) the
/// repetition penalty (`/p` when positive, `*p` otherwise), then
/// `- frequency * count`, then `- presence`. All in `f32`, in that order.
#[inline]
pub(crate) fn adjusted(l: f32, a: &Adjust, p: &SamplingParams) -> f32 {
    let mut v = l + a.bias;
    if a.count > 0 {
        let rp = p.repetition_penalty;
        v = if v > 0.0 { v / rp } else { v * rp };
        v -= p.frequency_penalty * a.count as f32;
        v -= p.presence_penalty;
    }
    v
}

/// Sorted, de-duplicated adjustments of a row (into `out`).
pub(crate) fn build_adjustments(
    params: &SamplingParams,
    history: &[u32],
    vocab: usize,
    out: &mut Vec<Adjust>,
) -> Result<(), SampleError> {
    out.clear();
    let check = |t: u32| {
        if (t as usize) < vocab {
            Ok(())
        } else {
            Err(SampleError::TokenOutOfRange { token: t, vocab })
        }
    };
    for &(t, b) in &params.logit_bias {
        check(t)?;
        out.push(Adjust {
            id: t,
            bias: b,
            count: 0,
        });
    }
    if params.has_penalties() {
        for &t in history {
            check(t)?;
            out.push(Adjust {
                id: t,
                bias: 0.0,
                count: 1,
            });
        }
    }
    // Stable sort keeps the biases of one token in the order given, so their
    // f32 sum is deterministic.
    out.sort_by_key(|a| a.id);
    let mut w = 0usize;
    for r in 0..out.len() {
        if w > 0 && out[w - 1].id == out[r].id {
            out[w - 1].bias += out[r].bias;
            out[w - 1].count += out[r].count;
        } else {
            out[w] = out[r];
            w += 1;
        }
    }
    out.truncate(w);
    Ok(())
}

/// One row: logits, optional mask, adjustments and parameters.
pub(crate) struct Row<'a, L> {
    pub logits: &'a [L],
    pub mask: Option<&'a [u32]>,
    pub adjust: &'a [Adjust],
    pub params: &'a SamplingParams,
}

/// Validate the shape of a row before any pass over it.
pub(crate) fn check_shape(vocab: usize, mask: Option<&[u32]>) -> Result<(), SampleError> {
    if vocab == 0 || vocab > u32::MAX as usize {
        return Err(SampleError::BadVocab(vocab));
    }
    if let Some(m) = mask {
        let expected = mask_words(vocab);
        if m.len() != expected {
            return Err(SampleError::MaskSizeMismatch {
                expected,
                got: m.len(),
                vocab,
            });
        }
    }
    Ok(())
}

impl<L: LogitValue> Row<'_, L> {
    /// One streaming pass in token order over every allowed token, calling
    /// `visit(token, adjusted_logit)` for each token whose adjusted logit is
    /// above `*threshold` (which `visit` may raise). Errors on the first
    /// non-finite allowed logit. Returns how many tokens are allowed.
    pub fn scan<F>(&self, threshold: &mut f32, visit: F) -> Result<usize, SampleError>
    where
        F: FnMut(u32, f32, &mut f32),
    {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { self.scan_avx2(threshold, visit) };
        }
        self.scan_body(threshold, visit)
    }

    /// [`Self::scan`] compiled for AVX2: comparisons and maxima only, so the
    /// same results as the baseline build.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn scan_avx2<F>(&self, threshold: &mut f32, visit: F) -> Result<usize, SampleError>
    where
        F: FnMut(u32, f32, &mut f32),
    {
        self.scan_body(threshold, visit)
    }

    #[inline(always)]
    fn scan_body<F>(&self, threshold: &mut f32, mut visit: F) -> Result<usize, SampleError>
    where
        F: FnMut(u32, f32, &mut f32),
    {
        let vocab = self.logits.len();
        let mut next_adj = 0usize;
        let mut allowed_count = 0usize;
        for (w, chunk) in self.logits.chunks(32).enumerate() {
            let base = w * 32;
            let full: u32 = if chunk.len() == 32 {
                u32::MAX
            } else {
                (1u32 << chunk.len()) - 1
            };
            let bits = self.mask.map_or(full, |m| m[w] & full);
            let end = base + chunk.len();
            let adj_here =
                next_adj < self.adjust.len() && (self.adjust[next_adj].id as usize) < end;
            if bits == u32::MAX && !adj_here {
                // Fast path: 32 allowed, unadjusted tokens. Lane-wise max and
                // a finiteness probe (`v * 0` is NaN exactly for NaN/inf).
                let mut mx = [f32::NEG_INFINITY; 8];
                let mut probe = [0f32; 8];
                for lane in chunk.chunks_exact(8) {
                    for j in 0..8 {
                        let v = lane[j].to_f32();
                        probe[j] += v * 0.0;
                        mx[j] = if v > mx[j] { v } else { mx[j] };
                    }
                }
                if probe.iter().any(|p| *p != 0.0) {
                    let j = chunk
                        .iter()
                        .position(|v| !v.to_f32().is_finite())
                        .unwrap_or(0);
                    return Err(SampleError::NonFiniteLogit {
                        token: (base + j) as u32,
                        value: chunk[j].to_f32(),
                    });
                }
                allowed_count += 32;
                let m4 = [
                    if mx[0] > mx[4] { mx[0] } else { mx[4] },
                    if mx[1] > mx[5] { mx[1] } else { mx[5] },
                    if mx[2] > mx[6] { mx[2] } else { mx[6] },
                    if mx[3] > mx[7] { mx[3] } else { mx[7] },
                ];
                let m2 = [
                    if m4[0] > m4[2] { m4[0] } else { m4[2] },
                    if m4[1] > m4[3] { m4[1] } else { m4[3] },
                ];
                let m = if m2[0] > m2[1] { m2[0] } else { m2[1] };
                if m > *threshold {
                    for (j, s) in chunk.iter().enumerate() {
                        let v = s.to_f32();
                        if v > *threshold {
                            visit((base + j) as u32, v, threshold);
                        }
                    }
                }
                continue;
            }
            for (j, s) in chunk.iter().enumerate() {
                if bits >> j & 1 == 0 {
                    while next_adj < self.adjust.len()
                        && (self.adjust[next_adj].id as usize) <= base + j
                    {
                        next_adj += 1;
                    }
                    continue;
                }
                let token = (base + j) as u32;
                let mut v = s.to_f32();
                if next_adj < self.adjust.len() && self.adjust[next_adj].id == token {
                    v = adjusted(v, &self.adjust[next_adj], self.params);
                    next_adj += 1;
                }
                if !v.is_finite() {
                    return Err(SampleError::NonFiniteLogit { token, value: v });
                }
                allowed_count += 1;
                if v > *threshold {
                    visit(token, v, threshold);
                }
            }
        }
        debug_assert!(vocab == 0 || allowed_count <= vocab);
        Ok(allowed_count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_conversion_is_exact() {
        for v in [0.0f32, -1.5, 3.25, 1e30, -7.0e-3] {
            let b = half::bf16::from_f32(v);
            assert_eq!(b.to_f32(), LogitValue::to_f32(b));
        }
    }

    #[test]
    fn adjustments_merge_duplicates() {
        let p = SamplingParams {
            frequency_penalty: 0.5,
            logit_bias: vec![(3, 1.0), (1, 2.0), (3, 0.5)],
            ..SamplingParams::default()
        };
        let mut out = Vec::new();
        build_adjustments(&p, &[3, 3, 0], 5, &mut out).unwrap();
        assert_eq!(
            out,
            vec![
                Adjust {
                    id: 0,
                    bias: 0.0,
                    count: 1
                },
                Adjust {
                    id: 1,
                    bias: 2.0,
                    count: 0
                },
                Adjust {
                    id: 3,
                    bias: 1.5,
                    count: 2
                },
            ]
        );
        assert_eq!(adjusted(1.0, &out[2], &p), 1.0 + 1.5 - 1.0);
        assert!(build_adjustments(&p, &[9], 5, &mut out).is_err());
    }
}
