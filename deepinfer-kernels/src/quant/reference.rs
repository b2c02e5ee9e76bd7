//! Plain per-element quantise / dequantise: the specification the fast block kernels of
//! [`QuantMatrix::quantize`] / [`QuantMatrix::dequantize`] are tested against, bit for bit.
//!
//! Slow on purpose: one value at a time, rounded by the NumPy reference's rules
//! ([`round_e4m3`], [`round_e2m1`]) rather than by the bit tricks of the fast encoders, and
//! block maxima by an ordinary float fold. Use the [`QuantMatrix`] methods in real code.

use super::fp4::{self, E2M1_VALUES, round_e2m1};
use super::fp8::{
    self, ceil_log2, e4m3_decode, exp2i, floor_log2, round_e4m3, ue8m0_decode, ue8m0_encode_pow2,
};
use super::{QuantFormat, QuantMatrix, ScaleFormat, Scales};
use crate::error::{Result, invalid, shape_err};

/// The e4m3fn byte of `v`, by rounding with [`round_e4m3`] and reading the exact value's
/// fields (NaN → `0x7f`).
pub fn e4m3_encode_reference(v: f32) -> u8 {
    if v.is_nan() {
        return 0x7f;
    }
    let r = round_e4m3(v);
    let sign = if r.is_sign_negative() { 0x80u8 } else { 0 };
    let a = r.abs();
    let code = if a < exp2i(-6) {
        // Subnormal: a multiple of 2^-9 (exact).
        (a * 512.0) as u8
    } else {
        let e = floor_log2(a);
        let m = (a / exp2i(e) * 8.0 - 8.0) as u8;
        (((e + 7) as u8) << 3) | m
    };
    sign | code
}

/// The 4-bit e2m1 code of `v`, by rounding with [`round_e2m1`] and looking the value up
/// (NaN → 0; a value that rounds to zero is +0).
pub fn e2m1_encode_reference(v: f32) -> u8 {
    if v.is_nan() {
        return 0;
    }
    let r = round_e2m1(v);
    let code = E2M1_VALUES.iter().position(|&g| g == r.abs()).unwrap_or(7) as u8;
    if code != 0 && r.is_sign_negative() {
        code | 8
    } else {
        code
    }
}

/// Quantises like [`QuantMatrix::quantize`], one value at a time.
pub fn quantize_reference(
    x: &[f32],
    rows: usize,
    cols: usize,
    format: QuantFormat,
) -> Result<QuantMatrix> {
    const OP: &str = "quantize_reference";
    if x.len() != rows * cols {
        return Err(shape_err(
            OP,
            format!("{} values for [{rows}, {cols}]", x.len()),
        ));
    }
    if x.iter().any(|v| !v.is_finite()) {
        return Err(invalid(OP, "non-finite value"));
    }
    let (br, bc) = (format.block_rows(), format.block_cols());
    if bc == 0 || br == 0 {
        return Err(invalid(OP, "zero block size"));
    }
    match format {
        QuantFormat::Fp8 { scale, .. } => Ok(fp8_reference(x, rows, cols, br, bc, scale, format)),
        QuantFormat::Mxfp4 | QuantFormat::Nvfp4 => {
            if !cols.is_multiple_of(bc) {
                return Err(shape_err(OP, format!("cols {cols} not a multiple of {bc}")));
            }
            Ok(fp4_reference(x, rows, cols, format))
        }
    }
}

fn fp8_reference(
    x: &[f32],
    rows: usize,
    cols: usize,
    br: usize,
    bc: usize,
    scale: ScaleFormat,
    format: QuantFormat,
) -> QuantMatrix {
    let (nbr, nbc) = (rows.div_ceil(br), cols.div_ceil(bc));
    let mut scales_f = vec![0.0f32; nbr * nbc];
    for bi in 0..nbr {
        for bj in 0..nbc {
            let mut amax = 0.0f32;
            for r in bi * br..((bi + 1) * br).min(rows) {
                for c in bj * bc..((bj + 1) * bc).min(cols) {
                    amax = amax.max(x[r * cols + c].abs());
                }
            }
            let amax = amax.max(1e-12);
            scales_f[bi * nbc + bj] = match scale {
                ScaleFormat::F32 => amax / fp8::E4M3_MAX,
                ScaleFormat::Ue8m0 => exp2i(ceil_log2(amax / fp8::E4M3_MAX).clamp(-127, 127)),
            };
        }
    }
    let mut data = vec![0u8; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            // The scale is applied as a multiplication by its reciprocal (exact for powers of
            // two; the fast kernels do the same, so the contract includes it).
            let inv = 1.0 / scales_f[(r / br) * nbc + c / bc];
            data[r * cols + c] = e4m3_encode_reference(x[r * cols + c] * inv);
        }
    }
    let scales = match scale {
        ScaleFormat::F32 => Scales::F32(scales_f),
        ScaleFormat::Ue8m0 => Scales::Bytes(
            scales_f
                .iter()
                .map(|&s| ue8m0_encode_pow2(floor_log2(s)))
                .collect(),
        ),
    };
    QuantMatrix {
        format,
        rows,
        cols,
        data,
        scales,
        tensor_scale: 1.0,
    }
}

fn fp4_reference(x: &[f32], rows: usize, cols: usize, format: QuantFormat) -> QuantMatrix {
    let bc = format.block_cols();
    let nbc = cols / bc;
    let tensor_scale = if format == QuantFormat::Nvfp4 {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        if amax > 0.0 {
            amax / (fp8::E4M3_MAX * fp4::E2M1_MAX)
        } else {
            1.0
        }
    } else {
        1.0
    };
    let mut scale_bytes = vec![0u8; rows * nbc];
    let mut data = vec![0u8; rows * cols / 2];
    for r in 0..rows {
        for bj in 0..nbc {
            let blk = &x[r * cols + bj * bc..r * cols + (bj + 1) * bc];
            let amax = blk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let (byte, s) = if format == QuantFormat::Mxfp4 {
                let p = ceil_log2(amax.max(fp4::E2M1_MAX * exp2i(-126)) / fp4::E2M1_MAX);
                let b = ue8m0_encode_pow2(p);
                (b, ue8m0_decode(b))
            } else {
                let floor = fp4::E2M1_MAX * exp2i(-9);
                let b = e4m3_encode_reference((amax / tensor_scale).max(floor) / fp4::E2M1_MAX);
                (b, e4m3_decode(b) * tensor_scale)
            };
            scale_bytes[r * nbc + bj] = byte;
            let inv = 1.0 / s;
            for (i, &v) in blk.iter().enumerate() {
                let j = r * cols + bj * bc + i;
                let code = e2m1_encode_reference(v * inv);
                data[j / 2] |= if j.is_multiple_of(2) { code } else { code << 4 };
            }
        }
    }
    QuantMatrix {
        format,
        rows,
        cols,
        data,
        scales: Scales::Bytes(scale_bytes),
        tensor_scale,
    }
}

/// Dequantises like [`QuantMatrix::dequantize`], one value at a time: the decoded code times
/// [`QuantMatrix::block_scale`].
pub fn dequantize_reference(q: &QuantMatrix) -> Vec<f32> {
    let (rows, cols, bc) = (q.rows, q.cols, q.format.block_cols());
    let mut out = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let j = r * cols + c;
            let v = match q.format {
                QuantFormat::Fp8 { .. } => e4m3_decode(q.data[j]),
                _ => {
                    let code = (q.data[j / 2] >> (4 * (j % 2))) & 0xf;
                    let m = E2M1_VALUES[(code & 7) as usize];
                    if code & 8 != 0 { -m } else { m }
                }
            };
            out[j] = v * q.block_scale(r, c / bc);
        }
    }
    out
}
