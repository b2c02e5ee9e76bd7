//! FP8 e4m3fn and UE8M0 scalar encodings.
//!
//! e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no infinities, largest finite
//! value 448, `0x7f`/`0xff` are NaN. UE8M0: an unsigned power of two `2^(byte - 127)`.

/// Largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;

/// `floor(log2(a))` for a finite `a > 0` (exact, from the f32 bits; subnormals included).
#[inline]
pub(crate) fn floor_log2(a: f32) -> i32 {
    let bits = a.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32;
    if exp == 0 {
        // Subnormal: the position of the highest set mantissa bit.
        let m = bits & 0x7f_ffff;
        -127 - (m.leading_zeros() as i32 - 9)
    } else {
        exp - 127
    }
}

/// Rounds to the nearest e4m3fn value (ties to even), saturating at ±448. NaN stays NaN.
///
/// The same rule as the NumPy reference: `q = 2^(max(floor(log2|v|), -6) - 3)`,
/// `round_half_even(|v| / q) * q`, capped at 448.
#[inline]
pub fn round_e4m3(v: f32) -> f32 {
    if v.is_nan() {
        return v;
    }
    let a = v.abs().min(E4M3_MAX);
    if a == 0.0 {
        return 0.0f32.copysign(v);
    }
    let e = floor_log2(a).max(-6);
    let q = exp2i(e - 3);
    ((a / q).round_ties_even() * q).min(E4M3_MAX).copysign(v)
}

/// `2^e` for `e` in the f32 normal/subnormal range.
#[inline]
pub(crate) fn exp2i(e: i32) -> f32 {
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (e + 149).max(0))
    }
}

/// Encodes a value to its e4m3fn byte (round to nearest even, saturating; NaN → `0x7f`).
///
/// Bit arithmetic with no branch and no float-to-int conversion, so loops over it vectorise:
/// the same result as encoding [`round_e4m3`]'s value.
#[inline(always)]
pub fn e4m3_encode(v: f32) -> u8 {
    let bits = v.to_bits();
    let sign = (bits >> 24) & 0x80;
    let x = bits & 0x7fff_ffff;
    // |v| < 2^-6: e4m3 subnormals, steps of 2^-9, rounded (ties to even) by adding 2^23 and
    // reading the integer from the mantissa bits (8 rounds up into the first normal code).
    let sub = (f32::from_bits(x.min(0x3c80_0000)) * 512.0 + 8_388_608.0).to_bits() - 0x4b00_0000;
    // Otherwise round the f32 mantissa to 3 bits (ties to even), rebias the exponent 127 → 7,
    // saturate at 448 (`0x7e`). Both computed, one selected.
    let xn = x.max(0x3c80_0000);
    let norm = ((xn + 0x7_ffff + ((xn >> 20) & 1)) >> 20)
        .wrapping_sub(120 << 3)
        .min(0x7e);
    let code = if x < 0x3c80_0000 { sub } else { norm };
    let byte = if x > 0x7f80_0000 { 0x7f } else { sign | code };
    byte as u8
}

/// Decodes an e4m3fn byte.
#[inline]
pub fn e4m3_decode(b: u8) -> f32 {
    E4M3_LUT[b as usize]
}

const fn e4m3_decode_slow(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((b >> 3) & 0xf) as i32;
    let m = (b & 7) as f32;
    if exp == 15 && (b & 7) == 7 {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        m / 512.0
    } else {
        let mut p = 1.0f32;
        let mut i = 0;
        // 2^(exp - 7) by repeated multiplication (const context).
        if exp >= 7 {
            while i < exp - 7 {
                p *= 2.0;
                i += 1;
            }
        } else {
            while i < 7 - exp {
                p /= 2.0;
                i += 1;
            }
        }
        (1.0 + m / 8.0) * p
    };
    sign * mag
}

/// Decoding table for all 256 e4m3fn bytes.
pub static E4M3_LUT: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_decode_slow(i as u8);
        i += 1;
    }
    t
};

/// Encodes a power-of-two scale `2^p` as UE8M0 (`p + 127`, clamped to the finite range).
#[inline]
pub fn ue8m0_encode_pow2(p: i32) -> u8 {
    (p + 127).clamp(0, 254) as u8
}

/// Decodes a UE8M0 byte to its scale (255 is NaN).
#[inline]
pub fn ue8m0_decode(b: u8) -> f32 {
    if b == 255 {
        f32::NAN
    } else {
        let e = b as i32 - 127;
        if e >= -126 {
            exp2i(e)
        } else {
            // 2^-127 is subnormal in f32.
            f32::from_bits(1 << 22)
        }
    }
}

/// The power-of-two exponent `ceil(log2(x))` for a finite `x > 0`.
#[inline]
pub(crate) fn ceil_log2(x: f32) -> i32 {
    let f = floor_log2(x);
    if exp2i(f) == x { f } else { f + 1 }
}
