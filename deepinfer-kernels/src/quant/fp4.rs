//! FP4 e2m1 scalar encoding: 1 sign bit, 2 exponent bits, 1 mantissa bit.
//!
//! Magnitudes by code: 0, 0.5, 1, 1.5, 2, 3, 4, 6. Two values share a byte, the element with
//! the even index in the low nibble.

use super::fp8::exp2i;
use super::fp8::floor_log2;

/// Largest e2m1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// Magnitudes of the eight non-negative codes.
pub const E2M1_VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Decoding table for all 16 codes (bit 3 is the sign).
pub static E2M1_LUT: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Rounds to the nearest e2m1 value (ties to even), saturating at ±6.
///
/// The NumPy reference's rule: `q = 2^(max(floor(log2|v|), 0) - 1)`,
/// `min(round_half_even(|v| / q) * q, 6)`.
#[inline]
pub fn round_e2m1(v: f32) -> f32 {
    if v.is_nan() {
        return v;
    }
    let a = v.abs();
    if a == 0.0 {
        return 0.0f32.copysign(v);
    }
    let a = a.min(8.0);
    let e = floor_log2(a).max(0);
    let q = exp2i(e - 1);
    ((a / q).round_ties_even() * q).min(E2M1_MAX).copysign(v)
}

/// Encodes a value to its 4-bit code (round to nearest even, saturating; NaN → 0).
///
/// Thresholds at the midpoints between neighbours; `>` where the lower neighbour has the even
/// mantissa, `>=` where the upper one has: the same result as [`round_e2m1`].
#[inline]
pub fn e2m1_encode(v: f32) -> u8 {
    let sign = if v.is_sign_negative() && !v.is_nan() {
        8u8
    } else {
        0
    };
    let a = v.abs();
    let code = u8::from(a > 0.25)
        + u8::from(a >= 0.75)
        + u8::from(a > 1.25)
        + u8::from(a >= 1.75)
        + u8::from(a > 2.5)
        + u8::from(a >= 3.5)
        + u8::from(a > 5.0);
    // -0 encodes as +0 (code 0), like the reference's sign(v) * 0.
    (sign & 0u8.wrapping_sub(u8::from(code != 0))) | code
}

/// Decodes a 4-bit code (only the low nibble is read).
#[inline]
pub fn e2m1_decode(code: u8) -> f32 {
    E2M1_LUT[(code & 0xf) as usize]
}
