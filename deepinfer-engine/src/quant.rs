//! Decoding of the stored weight formats into f32: bf16, f16, FP8 e4m3 with block scales,
//! FP4 e2m1 pairs with per-32 UE8M0 scales, and UE8M0 scales themselves.
//!
//! Matmul matrices stored FP8 or FP4 stay quantised on the backend
//! (`WeightLoader::stored_quant`); these decoders serve the other tensors, layouts the
//! kernels do not read, and `MatmulWeights::F32`.

/// FP8 e4m3fn (no infinities; 0x7f/0xff are NaN) to f32.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0x0f) as i32;
    let m = (b & 0x07) as f32;
    if e == 0x0f && (b & 0x07) == 0x07 {
        return f32::NAN;
    }
    if e == 0 {
        sign * m / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

/// UE8M0 scale byte (a biased power-of-two exponent; 0xff is NaN) to f32.
pub fn ue8m0_to_f32(b: u8) -> f32 {
    if b == 0xff {
        f32::NAN
    } else {
        // 2^(b-127) spans subnormal f32 at the bottom; f64 keeps it exact.
        (2f64.powi(b as i32 - 127)) as f32
    }
}

/// The 16 FP4 e2m1 values by code (bit 3 is the sign).
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Unpack FP4 pairs (low nibble = even element) into `out` (twice as long as `packed`).
pub fn unpack_e2m1(packed: &[u8], out: &mut [f32]) {
    for (i, &b) in packed.iter().enumerate() {
        out[2 * i] = E2M1[(b & 0x0f) as usize];
        out[2 * i + 1] = E2M1[(b >> 4) as usize];
    }
}

/// Multiply a row-major `[rows, cols]` matrix in place by block scales `[ceil(rows/br), ceil(cols/bc)]`.
pub fn apply_block_scales(
    w: &mut [f32],
    rows: usize,
    cols: usize,
    scales: &[f32],
    br: usize,
    bc: usize,
) {
    let sc_cols = cols.div_ceil(bc);
    for r in 0..rows {
        let srow = &scales[(r / br) * sc_cols..(r / br + 1) * sc_cols];
        for (c, v) in w[r * cols..(r + 1) * cols].iter_mut().enumerate() {
            *v *= srow[c / bc];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_known_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0); // exponent 7 = bias
        assert_eq!(e4m3_to_f32(0x7e), 448.0); // largest finite
        assert_eq!(e4m3_to_f32(0xb8), -1.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert!(e4m3_to_f32(0x7f).is_nan());
    }

    #[test]
    fn ue8m0_and_e2m1() {
        assert_eq!(ue8m0_to_f32(127), 1.0);
        assert_eq!(ue8m0_to_f32(130), 8.0);
        assert_eq!(ue8m0_to_f32(125), 0.25);
        let mut out = [0.0; 4];
        unpack_e2m1(&[0x71, 0x9f], &mut out);
        assert_eq!(out, [0.5, 6.0, -6.0, -0.5]);
    }
}
