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

/// Decoding table for a packed byte: both values (low nibble first), one load per byte.
pub static E2M1_PAIR_LUT: [[f32; 2]; 256] = {
    let mut t = [[0.0f32; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [E2M1_LUT[i & 0xf], E2M1_LUT[i >> 4]];
        i += 1;
    }
    t
};

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
/// Thresholds at the midpoints between neighbours, `>` where the lower neighbour has the even
/// mantissa and `>=` where the upper one has, compared on the bit patterns of `|v|` (which
/// order like the values): the same result as [`round_e2m1`], with no branch, so loops over
/// it vectorise. A value that rounds to zero encodes as +0, like the reference's
/// `sign(v) * 0`.
#[inline(always)]
pub fn e2m1_encode(v: f32) -> u8 {
    let bits = v.to_bits();
    let a = (bits & 0x7fff_ffff) as i32;
    // `a >= t` is `a > bits(t) - 1` for the thresholds with ties going up.
    let code = i32::from(a > B0_25)
        + i32::from(a > B0_75 - 1)
        + i32::from(a > B1_25)
        + i32::from(a > B1_75 - 1)
        + i32::from(a > B2_5)
        + i32::from(a > B3_5 - 1)
        + i32::from(a > B5_0);
    let nan = a > 0x7f80_0000;
    let sign = ((bits >> 28) & 8) as i32;
    let code = if code == 0 || nan { 0 } else { code | sign };
    code as u8
}

const B0_25: i32 = 0.25f32.to_bits() as i32;
const B0_75: i32 = 0.75f32.to_bits() as i32;
const B1_25: i32 = 1.25f32.to_bits() as i32;
const B1_75: i32 = 1.75f32.to_bits() as i32;
const B2_5: i32 = 2.5f32.to_bits() as i32;
const B3_5: i32 = 3.5f32.to_bits() as i32;
const B5_0: i32 = 5.0f32.to_bits() as i32;

/// Decodes a 4-bit code (only the low nibble is read).
#[inline]
pub fn e2m1_decode(code: u8) -> f32 {
    E2M1_LUT[(code & 0xf) as usize]
}
