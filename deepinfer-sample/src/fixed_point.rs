//! Deterministic probabilities and the fixed-point integer CDF.
//!
//! # The recipe (mirror it bit for bit)
//! 1. Relative probability of a surviving token: `r = det_exp((l - l_max) / t)`
//!    in `f32`, where `l` is the token's adjusted logit, `l_max` the largest
//!    adjusted logit of the row and `t` the clamped temperature. [`det_exp`]
//!    uses only IEEE `f32` add/mul/convert with round-to-nearest-even, no
//!    fused multiply-add and no flush-to-zero (CUDA: `__fadd_rn`/`__fmul_rn`
//!    or `-fmad=false`, no `--ftz`). The top token has `r = 1` exactly.
//! 2. Integer weight: `w = floor(r * 2^32)` ([`weight_of`]); exact, because
//!    scaling an `f32` by a power of two is exact. Tokens with
//!    `r < 2^-32` get weight 0 and can never be drawn.
//! 3. Cumulative weights are `u64` additions in ascending token-id order over
//!    the surviving tokens (integer addition is associative, so any summation
//!    tree gives the same totals; a vocabulary below 2^32 cannot overflow).
//! 4. Target `t = below(W)` from the row's Philox stream (see
//!    [`crate::rng::PhiloxStream::below`]), `W` the total weight.
//! 5. The token is the first survivor (in id order) whose inclusive prefix sum
//!    exceeds `t` ([`pick`]).

use crate::rng::PhiloxStream;

/// Fractional bits of a weight: `w = floor(r * 2^WEIGHT_BITS)`.
pub const WEIGHT_BITS: u32 = 32;
/// The weight of the top token (`r = 1`).
pub const WEIGHT_ONE: u64 = 1 << WEIGHT_BITS;

/// Arguments below this give 0 from [`det_exp`] (the true value is below
/// 2^-125, far under the smallest non-zero weight 2^-32).
pub const EXP_CUTOFF: f32 = -87.0;
/// `log2(e)` as `f32`.
pub const EXP_LOG2E: f32 = std::f32::consts::LOG2_E;
/// High part of `ln 2` (exact in 9 bits, so `n * EXP_LN2_HI` is exact).
pub const EXP_LN2_HI: f32 = 0.693_359_4;
/// Low part of `ln 2`: `ln 2 - EXP_LN2_HI`.
pub const EXP_LN2_LO: f32 = -2.121_944_4e-4;
/// `1.5 * 2^23`: adding then subtracting it rounds to the nearest integer.
pub const EXP_ROUND_MAGIC: f32 = 12_582_912.0;
/// Polynomial for `exp(f)` on `[-ln2/2, ln2/2]`, highest degree first:
/// `exp(f) ~ ((((((c0 f + c1) f + c2) f + c3) f + c4) f + c5) f^2 + f + 1`
/// (the classic Cephes `expf` minimax coefficients).
pub const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// Deterministic `exp(x)` for `x <= 0`, accurate to a few ulp, built only
/// from IEEE `f32` operations so every platform (and a CUDA kernel that
/// follows the same steps) gets the same bits. `det_exp(0) == 1` exactly;
/// arguments below [`EXP_CUTOFF`] (and NaN) give 0.
///
/// Written without branches (selects only, `2^n` from the bits of the
/// rounding sum) so loops over many tokens vectorise; it equals the
/// straightforward form ([`crate::reference::det_exp`]) bit for bit.
#[inline(always)]
pub fn det_exp(x: f32) -> f32 {
    let below = x.is_nan() || x < EXP_CUTOFF;
    let x = if below {
        EXP_CUTOFF
    } else if x < 0.0 {
        x
    } else {
        0.0
    };
    let y = x * EXP_LOG2E + EXP_ROUND_MAGIC;
    let n = y - EXP_ROUND_MAGIC;
    let f = (x - n * EXP_LN2_HI) - n * EXP_LN2_LO;
    let c = EXP_POLY;
    let p =
        (((((c[0] * f + c[1]) * f + c[2]) * f + c[3]) * f + c[4]) * f + c[5]) * (f * f) + f + 1.0;
    // n is an integer in [-126, 0], so y = 1.5 * 2^23 + n lies in the binade of
    // the magic constant (unit spacing): its bits minus the constant's bits are
    // n. 2^n is then a normal f32 built from its exponent bits.
    let n_bits = y.to_bits().wrapping_sub(EXP_ROUND_MAGIC.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    let r = p * scale;
    if below { 0.0 } else { r }
}

/// Integer weight of a relative probability `r` in `[0, 1]`: `floor(r * 2^32)`.
#[inline]
pub fn weight_of(r: f32) -> u64 {
    // The product is in [0, 2^32], so the signed conversion (one instruction
    // on x86-64) truncates exactly like an unsigned one.
    (f64::from(r) * WEIGHT_ONE as f64) as i64 as u64
}

/// [`weight_of`] in two 16-bit halves, with `f32` and `i32` operations only
/// (which vectorise where `f64 -> i64` conversions do not):
/// `weight_of(r) == (hi << 16) + lo`, `hi <= 2^16`, `lo < 2^16`.
///
/// `hi = floor(r * 2^16)`; `a = r * 2^32` and `hi * 2^16` are exact, and so is
/// their difference (both are multiples of the spacing of `a`, and the
/// difference is below `2^16`), so `lo = floor(a - hi * 2^16)`.
#[inline(always)]
pub(crate) fn weight_halves(r: f32) -> (u32, u32) {
    // Clamping to [0, 1] changes nothing for a relative probability but lets
    // the truncations below skip the saturating conversion, which does not
    // vectorise (NaN, which `det_exp` never gives, would map to 0).
    let r = if r > 0.0 { r } else { 0.0 };
    let r = if r < 1.0 { r } else { 1.0 };
    // SAFETY: `r * 2^16` is finite and in [0, 2^16], representable as i32.
    let hi: i32 = unsafe { (r * 65_536.0).to_int_unchecked() };
    let a = r * 4_294_967_296.0;
    // SAFETY: `a - hi * 2^16` is exact and in [0, 2^16) (see above).
    let lo: i32 = unsafe { (a - hi as f32 * 65_536.0).to_int_unchecked() };
    (hi as u32, lo as u32)
}

/// Weight of a token whose adjusted logit trails the row maximum by
/// `delta = l - l_max <= 0` at temperature `t > 0`.
#[inline]
pub fn relative_weight(delta: f32, temperature: f32) -> u64 {
    weight_of(det_exp(delta / temperature))
}

/// Index of the first weight whose inclusive prefix sum exceeds `target`,
/// or `None` when `target` is not below the total.
pub fn pick(weights: &[u64], target: u64) -> Option<usize> {
    let mut acc = 0u64;
    for (i, &w) in weights.iter().enumerate() {
        acc += w;
        if acc > target {
            return Some(i);
        }
    }
    None
}

/// Draw an index with probability `weights[i] / sum(weights)` from `stream`.
/// `None` when every weight is zero.
pub fn sample_index(weights: &[u64], stream: &mut PhiloxStream) -> Option<usize> {
    let total: u64 = weights.iter().sum();
    if total == 0 {
        return None;
    }
    pick(weights, stream.below(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_std_closely() {
        let mut x = 0.0f32;
        while x > -87.0 {
            let a = det_exp(x);
            let b = x.exp();
            assert!(((a - b) / b).abs() < 4e-7, "x={x} {a} {b}");
            x -= 0.0137;
        }
        assert_eq!(det_exp(0.0), 1.0);
        assert_eq!(det_exp(-0.0), 1.0);
        assert_eq!(det_exp(-88.0), 0.0);
        assert_eq!(det_exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(det_exp(f32::NAN), 0.0);
    }

    #[test]
    fn exp_is_monotone() {
        let mut prev = det_exp(0.0);
        let mut x = 0.0f32;
        for _ in 0..200_000 {
            x -= 0.000_43;
            let v = det_exp(x);
            assert!(v <= prev, "x={x}");
            prev = v;
        }
    }

    /// Compare with the straightforward forms over every `stride`-th bit
    /// pattern of `[lo, hi]`.
    fn sweep(lo: u32, hi: u32, stride: usize) {
        for bits in (lo..=hi).step_by(stride) {
            let x = f32::from_bits(bits);
            let a = det_exp(x);
            let b = crate::reference::det_exp(x);
            assert_eq!(a.to_bits(), b.to_bits(), "x = {x:e}");
        }
    }

    #[test]
    fn branch_free_exp_equals_the_straightforward_form() {
        // Negative values down to -inf (and NaN payloads), then positives.
        sweep(0x8000_0000, 0xFFFF_FFFF, 199);
        sweep(0x0000_0000, 0x7FFF_FFFF, 10_007);
        for x in [
            0.0f32,
            -0.0,
            -87.0,
            -87.000_01,
            -86.999_99,
            f32::NAN,
            f32::INFINITY,
        ] {
            assert_eq!(det_exp(x).to_bits(), crate::reference::det_exp(x).to_bits());
        }
    }

    #[test]
    #[ignore = "exhaustive over [-88, 0]: about a minute in release"]
    fn branch_free_exp_equals_the_straightforward_form_exhaustively() {
        sweep(0x8000_0000, 0xC2B0_0000, 1);
    }

    fn halves_sweep(stride: usize) {
        for bits in (0..=1.0f32.to_bits()).step_by(stride) {
            let r = f32::from_bits(bits);
            let (hi, lo) = weight_halves(r);
            assert!(hi <= 1 << 16 && lo < 1 << 16, "r = {r:e}");
            assert_eq!(
                (u64::from(hi) << 16) + u64::from(lo),
                weight_of(r),
                "r = {r:e}"
            );
        }
    }

    #[test]
    fn weight_halves_equal_weight_of() {
        halves_sweep(97);
        for r in [
            0.0f32,
            1.0,
            0.5,
            2f32.powi(-32),
            2f32.powi(-33),
            1.0 - f32::EPSILON / 2.0,
        ] {
            let (hi, lo) = weight_halves(r);
            assert_eq!((u64::from(hi) << 16) + u64::from(lo), weight_of(r));
        }
    }

    #[test]
    #[ignore = "exhaustive over [0, 1]: about a minute in release"]
    fn weight_halves_equal_weight_of_exhaustively() {
        halves_sweep(1);
    }

    #[test]
    fn weights() {
        assert_eq!(weight_of(1.0), WEIGHT_ONE);
        assert_eq!(weight_of(0.5), WEIGHT_ONE / 2);
        assert_eq!(weight_of(0.0), 0);
        assert_eq!(weight_of(1e-10), 0);
        assert_eq!(relative_weight(0.0, 1e-5), WEIGHT_ONE);
    }

    #[test]
    fn pick_boundaries() {
        let w = [3, 0, 2];
        assert_eq!(pick(&w, 0), Some(0));
        assert_eq!(pick(&w, 2), Some(0));
        assert_eq!(pick(&w, 3), Some(2));
        assert_eq!(pick(&w, 4), Some(2));
        assert_eq!(pick(&w, 5), None);
    }
}
