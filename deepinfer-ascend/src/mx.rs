//! OCP microscaling formats as DeepSeek uses them: FP8 E4M3 and FP4 E2M1 elements, one E8M0
//! (power-of-two) scale per 32 consecutive elements, scale = 2^ceil(log2(amax / max_elem)).
//!
//! Element encoding rounds to nearest, ties to even, and saturates (the MX spec's conversion);
//! the scale is chosen so that saturation never happens for finite inputs.

/// Elements per MX scale block.
pub const MX_BLOCK: usize = 32;

/// Largest finite FP8 E4M3 (OCP "fn" variant) value.
pub const E4M3_MAX: f32 = 448.0;
/// Largest FP4 E2M1 value.
pub const E2M1_MAX: f32 = 6.0;

/// MX element formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MxFormat {
    /// FP8 E4M3, one byte per element.
    Fp8E4M3,
    /// FP4 E2M1, two elements per byte, the even element in the low nibble.
    Fp4E2M1,
}

impl MxFormat {
    /// Largest representable magnitude.
    pub const fn max_value(self) -> f32 {
        match self {
            MxFormat::Fp8E4M3 => E4M3_MAX,
            MxFormat::Fp4E2M1 => E2M1_MAX,
        }
    }

    /// Smallest amax used when choosing a scale (DeepSeek's floors: 1e-4 for FP8, 6·2⁻¹²⁶ for FP4).
    pub fn amax_floor(self) -> f32 {
        match self {
            MxFormat::Fp8E4M3 => 1e-4,
            MxFormat::Fp4E2M1 => 6.0 * f32::from_bits(0x0080_0000),
        }
    }

    /// Storage bytes of `n` elements (n even for FP4).
    pub const fn bytes(self, n: usize) -> usize {
        match self {
            MxFormat::Fp8E4M3 => n,
            MxFormat::Fp4E2M1 => n.div_ceil(2),
        }
    }

    const fn mantissa_bits(self) -> i32 {
        match self {
            MxFormat::Fp8E4M3 => 3,
            MxFormat::Fp4E2M1 => 1,
        }
    }

    const fn min_normal_exp(self) -> i32 {
        match self {
            MxFormat::Fp8E4M3 => -6,
            MxFormat::Fp4E2M1 => 0,
        }
    }

    const fn max_code(self) -> u8 {
        match self {
            MxFormat::Fp8E4M3 => 0x7e,
            MxFormat::Fp4E2M1 => 0x7,
        }
    }

    const fn sign_bit(self) -> u8 {
        match self {
            MxFormat::Fp8E4M3 => 0x80,
            MxFormat::Fp4E2M1 => 0x8,
        }
    }

    /// Encode one value (already divided by the block scale), round-to-nearest-even, saturating.
    pub fn encode(self, v: f32) -> u8 {
        let sign = if v.is_sign_negative() {
            self.sign_bit()
        } else {
            0
        };
        let a = f64::from(v.abs());
        if a.is_nan() {
            // MX elements have no NaN in E2M1; the scale carries NaN. Map to zero.
            return 0;
        }
        if a == 0.0 {
            return sign;
        }
        let m = self.mantissa_bits();
        let emin = self.min_normal_exp();
        let e = floor_log2(a).max(emin);
        // Codes are contiguous in magnitude: code = (e - emin) * 2^m + q, q = a / 2^(e-m).
        let q = (a / pow2(e - m)).round_ties_even();
        let code = f64::from((e - emin) * (1 << m)) + q;
        let code = code.min(f64::from(self.max_code())) as u8;
        code | sign
    }

    /// Decode one element code.
    pub fn decode(self, code: u8) -> f32 {
        let m = self.mantissa_bits();
        let emin = self.min_normal_exp();
        let sign = if code & self.sign_bit() != 0 {
            -1.0
        } else {
            1.0
        };
        let mag = i32::from(code & (self.sign_bit() - 1));
        if self == MxFormat::Fp8E4M3 && mag == 0x7f {
            return f32::NAN;
        }
        let field = mag >> m;
        let mant = mag & ((1 << m) - 1);
        let v = if field == 0 {
            f64::from(mant) * pow2(emin - m)
        } else {
            f64::from((1 << m) + mant) * pow2(emin + field - 1 - m)
        };
        (sign * v) as f32
    }
}

/// 2^e as f64 (exact for the exponents used here).
fn pow2(e: i32) -> f64 {
    f64::powi(2.0, e)
}

/// floor(log2(a)) for finite positive a, exact (from the bit pattern).
fn floor_log2(a: f64) -> i32 {
    let bits = a.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    if exp == 0 {
        // Subnormal f64: never reached from f32 inputs, but stay exact.
        let mant = bits & ((1u64 << 52) - 1);
        return -1074 + (63 - mant.leading_zeros() as i32);
    }
    exp - 1023
}

/// ceil(log2(a)) for finite positive a, exact.
fn ceil_log2(a: f64) -> i32 {
    let f = floor_log2(a);
    if pow2(f) == a { f } else { f + 1 }
}

/// E8M0 scale code for a block with the given amax: 2^ceil(log2(max(amax, floor) / max_elem)).
pub fn scale_code(format: MxFormat, amax: f32) -> u8 {
    let a = f64::from(amax.max(format.amax_floor()));
    let e = ceil_log2(a / f64::from(format.max_value()));
    (e.clamp(-127, 127) + 127) as u8
}

/// Value of an E8M0 scale code (0xFF is NaN).
pub fn scale_value(code: u8) -> f32 {
    if code == 0xff {
        return f32::NAN;
    }
    pow2(i32::from(code) - 127) as f32
}

/// Quantise a slice (length a multiple of 32) into element codes and per-block scale codes.
///
/// FP4 output packs two elements per byte, the even element in the low nibble.
pub fn quantize(format: MxFormat, x: &[f32]) -> (Vec<u8>, Vec<u8>) {
    let mut scales = Vec::with_capacity(x.len() / MX_BLOCK);
    let mut codes = Vec::with_capacity(format.bytes(x.len()));
    for block in x.chunks(MX_BLOCK) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = scale_code(format, amax);
        scales.push(s);
        let inv = 1.0 / f64::from(scale_value(s));
        let q: Vec<u8> = block
            .iter()
            .map(|&v| format.encode((f64::from(v) * inv) as f32))
            .collect();
        match format {
            MxFormat::Fp8E4M3 => codes.extend_from_slice(&q),
            MxFormat::Fp4E2M1 => codes.extend(
                q.chunks(2)
                    .map(|p| p[0] | (p.get(1).copied().unwrap_or(0) << 4)),
            ),
        }
    }
    (codes, scales)
}

/// Element `i` of a packed code array, decoded and scaled.
pub fn dequant_at(format: MxFormat, codes: &[u8], scales: &[u8], i: usize) -> f32 {
    let code = match format {
        MxFormat::Fp8E4M3 => codes[i],
        MxFormat::Fp4E2M1 => (codes[i / 2] >> ((i & 1) * 4)) & 0xf,
    };
    format.decode(code) * scale_value(scales[i / MX_BLOCK])
}

/// Decode a whole packed array of `n` elements.
pub fn dequantize(format: MxFormat, codes: &[u8], scales: &[u8], n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| dequant_at(format, codes, scales, i))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_round_trips_every_code() {
        for c in 0u8..=255 {
            if c & 0x7f == 0x7f {
                continue;
            }
            let v = MxFormat::Fp8E4M3.decode(c);
            assert_eq!(MxFormat::Fp8E4M3.encode(v), c, "code {c:#x} value {v}");
        }
        assert_eq!(MxFormat::Fp8E4M3.decode(0x7e), 448.0);
        assert_eq!(MxFormat::Fp8E4M3.decode(0x01), 2f32.powi(-9));
    }

    #[test]
    fn e2m1_round_trips_every_code() {
        let want = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for c in 0u8..16 {
            let v = MxFormat::Fp4E2M1.decode(c);
            let mag = want[usize::from(c & 7)];
            assert_eq!(v.abs(), mag);
            assert_eq!(
                MxFormat::Fp4E2M1.encode(v),
                if v == 0.0 { c & 0x8 } else { c }
            );
        }
    }

    #[test]
    fn ties_go_to_even_and_saturate() {
        // 2.5 lies between 2 (code 4) and 3 (code 5): even code 4 wins.
        assert_eq!(MxFormat::Fp4E2M1.encode(2.5), 4);
        assert_eq!(MxFormat::Fp4E2M1.encode(100.0), 7);
        assert_eq!(MxFormat::Fp8E4M3.encode(1e9), 0x7e);
    }

    #[test]
    fn scale_never_saturates() {
        for amax in [1e-3f32, 0.3, 1.0, 6.0, 447.0, 448.0, 449.0, 3e5] {
            for f in [MxFormat::Fp8E4M3, MxFormat::Fp4E2M1] {
                let s = scale_value(scale_code(f, amax));
                assert!(amax / s <= f.max_value(), "{f:?} {amax}");
                assert!(amax / s > f.max_value() / 2.0 || amax < f.amax_floor());
            }
        }
    }
}
