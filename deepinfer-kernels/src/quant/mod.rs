//! Block-quantised weight formats: FP8 e4m3 (block-scaled, f32 or UE8M0 scales), MXFP4 and
//! NVFP4, with quantise / dequantise, and the QAT round trips of the NumPy reference.
//!
//! A [`QuantMatrix`] is a `[rows, cols]` weight in the PyTorch `Linear` layout (`[out, in]`):
//! blocks run along `cols` (the reduction axis), so a GEMV reads one row's values and scales
//! contiguously.

mod block;
pub mod fp4;
pub mod fp8;
pub mod reference;

use crate::error::{Result, invalid, shape_err};
use fp4::{e2m1_decode, round_e2m1};
use fp8::{ceil_log2, e4m3_decode, exp2i, round_e4m3, ue8m0_decode, ue8m0_encode_pow2};

/// How FP8 block scales are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleFormat {
    /// One f32 per block: `amax / 448` (DeepSeek's `weight_scale_inv`).
    F32,
    /// One power of two per block: `2^ceil(log2(amax / 448))`, stored as UE8M0.
    Ue8m0,
}

/// A quantised weight format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// FP8 e4m3 values with one scale per `block_rows × block_cols` tile (DeepSeek: 128×128).
    Fp8 {
        /// Rows per scale block.
        block_rows: usize,
        /// Columns per scale block.
        block_cols: usize,
        /// Scale storage.
        scale: ScaleFormat,
    },
    /// MXFP4: e2m1 values, blocks of 32 along a row, UE8M0 scales.
    Mxfp4,
    /// NVFP4: e2m1 values, blocks of 16 along a row, E4M3 scales, one f32 tensor scale.
    Nvfp4,
}

impl QuantFormat {
    /// DeepSeek's FP8 weight format: 128×128 blocks with f32 scales.
    pub const FP8_128_F32: QuantFormat = QuantFormat::Fp8 {
        block_rows: 128,
        block_cols: 128,
        scale: ScaleFormat::F32,
    };

    /// Columns per scale block along a row.
    pub fn block_cols(&self) -> usize {
        match self {
            QuantFormat::Fp8 { block_cols, .. } => *block_cols,
            QuantFormat::Mxfp4 => 32,
            QuantFormat::Nvfp4 => 16,
        }
    }

    /// Rows per scale block.
    pub fn block_rows(&self) -> usize {
        match self {
            QuantFormat::Fp8 { block_rows, .. } => *block_rows,
            _ => 1,
        }
    }

    /// The tensor dtype of a matrix in this format.
    pub fn dtype(&self) -> crate::DType {
        match self {
            QuantFormat::Fp8 { .. } => crate::DType::F8E4M3,
            QuantFormat::Mxfp4 => crate::DType::Mxfp4,
            QuantFormat::Nvfp4 => crate::DType::Nvfp4,
        }
    }
}

/// A quantised `[rows, cols]` matrix: packed values plus block scales.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantMatrix {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    /// FP8: `rows * cols` bytes. FP4: `rows * cols / 2` bytes, low nibble = even column.
    data: Vec<u8>,
    /// Raw scale bytes or f32s, row-major over the block grid.
    scales: Scales,
    tensor_scale: f32,
}

/// Raw block scales.
#[derive(Debug, Clone, PartialEq)]
enum Scales {
    F32(Vec<f32>),
    /// UE8M0 or E4M3 bytes, read according to the format.
    Bytes(Vec<u8>),
}

impl QuantMatrix {
    /// Quantises a row-major `[rows, cols]` f32 matrix.
    ///
    /// FP4 formats need `cols` to be a multiple of the block (32 or 16); FP8 blocks may be
    /// partial at the edges. Non-finite input is rejected.
    pub fn quantize(x: &[f32], rows: usize, cols: usize, format: QuantFormat) -> Result<Self> {
        const OP: &str = "quantize";
        if x.len() != rows * cols {
            return Err(shape_err(
                OP,
                format!("{} values for [{rows}, {cols}]", x.len()),
            ));
        }
        let bc = format.block_cols();
        let br = format.block_rows();
        if bc == 0 || br == 0 {
            return Err(invalid(OP, "zero block size"));
        }
        // Non-finite input is caught by the block maxima (one pass fewer over the input).
        let q = match format {
            QuantFormat::Fp8 { scale, .. } => quantize_fp8(x, rows, cols, br, bc, scale, format),
            QuantFormat::Mxfp4 | QuantFormat::Nvfp4 => {
                if !cols.is_multiple_of(bc) {
                    return Err(shape_err(OP, format!("cols {cols} not a multiple of {bc}")));
                }
                quantize_fp4(x, rows, cols, format)
            }
        };
        q.ok_or_else(|| invalid(OP, "non-finite value"))
    }

    /// Reassembles a matrix from raw parts (e.g. loaded from a checkpoint).
    ///
    /// `scales_f32` is used for FP8 with f32 scales; `scale_bytes` for UE8M0 / E4M3 scales.
    pub fn from_parts(
        format: QuantFormat,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
        scales_f32: Option<Vec<f32>>,
        scale_bytes: Option<Vec<u8>>,
        tensor_scale: f32,
    ) -> Result<Self> {
        const OP: &str = "QuantMatrix::from_parts";
        let bc = format.block_cols();
        let br = format.block_rows();
        if bc == 0 || br == 0 {
            return Err(invalid(OP, "zero block size"));
        }
        let nblocks = rows.div_ceil(br) * cols.div_ceil(bc);
        let data_len = match format {
            QuantFormat::Fp8 { .. } => rows * cols,
            _ => {
                if !cols.is_multiple_of(bc) {
                    return Err(shape_err(OP, format!("cols {cols} not a multiple of {bc}")));
                }
                rows * cols / 2
            }
        };
        if data.len() != data_len {
            return Err(shape_err(
                OP,
                format!("{} data bytes, want {data_len}", data.len()),
            ));
        }
        let scales = match (format, scales_f32, scale_bytes) {
            (
                QuantFormat::Fp8 {
                    scale: ScaleFormat::F32,
                    ..
                },
                Some(s),
                None,
            ) => Scales::F32(s),
            (
                QuantFormat::Fp8 {
                    scale: ScaleFormat::F32,
                    ..
                },
                _,
                _,
            ) => {
                return Err(invalid(OP, "FP8 with f32 scales needs scales_f32 only"));
            }
            (_, None, Some(b)) => Scales::Bytes(b),
            _ => return Err(invalid(OP, "this format needs scale_bytes only")),
        };
        let n = match &scales {
            Scales::F32(s) => s.len(),
            Scales::Bytes(b) => b.len(),
        };
        if n != nblocks {
            return Err(shape_err(OP, format!("{n} scales, want {nblocks}")));
        }
        Ok(Self {
            format,
            rows,
            cols,
            data,
            scales,
            tensor_scale,
        })
    }

    /// The format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (input features, the reduction axis).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The packed values.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The f32 block scales (FP8 with [`ScaleFormat::F32`]), row-major over the block grid.
    pub fn scales_f32(&self) -> Option<&[f32]> {
        match &self.scales {
            Scales::F32(s) => Some(s),
            Scales::Bytes(_) => None,
        }
    }

    /// The raw scale bytes (UE8M0 for FP8 / MXFP4, E4M3 for NVFP4), row-major over the block
    /// grid.
    pub fn scale_bytes(&self) -> Option<&[u8]> {
        match &self.scales {
            Scales::Bytes(b) => Some(b),
            Scales::F32(_) => None,
        }
    }

    /// Every block scale decoded to f32 (tensor scale included), row-major over the block grid.
    pub fn decoded_scales(&self) -> Vec<f32> {
        let nbc = self.cols.div_ceil(self.format.block_cols());
        let nbr = self.rows.div_ceil(self.format.block_rows());
        let br = self.format.block_rows();
        (0..nbr * nbc)
            .map(|i| self.block_scale((i / nbc) * br, i % nbc))
            .collect()
    }

    /// The NVFP4 per-tensor f32 scale (1 for the other formats).
    pub fn tensor_scale(&self) -> f32 {
        self.tensor_scale
    }

    /// Bytes of values plus scales.
    pub fn nbytes(&self) -> usize {
        self.data.len()
            + match &self.scales {
                Scales::F32(s) => 4 * s.len(),
                Scales::Bytes(b) => b.len(),
            }
    }

    /// Decoded scale of the block holding (row, block column `bj`), tensor scale included.
    #[inline]
    pub fn block_scale(&self, row: usize, bj: usize) -> f32 {
        let nbc = self.cols.div_ceil(self.format.block_cols());
        let i = (row / self.format.block_rows()) * nbc + bj;
        match (&self.scales, self.format) {
            (Scales::F32(s), _) => s[i],
            (Scales::Bytes(b), QuantFormat::Nvfp4) => e4m3_decode(b[i]) * self.tensor_scale,
            (Scales::Bytes(b), _) => ue8m0_decode(b[i]),
        }
    }

    /// Decodes the unscaled values of `row`, columns `[c0, c0 + out.len())`.
    #[inline]
    pub fn decode_values(&self, row: usize, c0: usize, out: &mut [f32]) {
        match self.format {
            QuantFormat::Fp8 { .. } => {
                let base = row * self.cols + c0;
                let n = out.len();
                for (o, &b) in out.iter_mut().zip(&self.data[base..base + n]) {
                    *o = e4m3_decode(b);
                }
            }
            _ => {
                let start = row * self.cols + c0;
                for (i, o) in out.iter_mut().enumerate() {
                    let j = start + i;
                    let byte = self.data[j / 2];
                    *o = e2m1_decode(if j.is_multiple_of(2) { byte } else { byte >> 4 });
                }
            }
        }
    }

    /// Dequantises one row into `out` (length `cols`): value × block scale.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        let bc = self.format.block_cols();
        let cols = self.cols;
        // The block scales of this row, decoded once per block (tensor scale included).
        let nbc = cols.div_ceil(bc);
        let s0 = (row / self.format.block_rows()) * nbc;
        let scale = |bj: usize| match (&self.scales, self.format) {
            (Scales::F32(s), _) => s[s0 + bj],
            (Scales::Bytes(b), QuantFormat::Nvfp4) => e4m3_decode(b[s0 + bj]) * self.tensor_scale,
            (Scales::Bytes(b), _) => ue8m0_decode(b[s0 + bj]),
        };
        match self.format {
            QuantFormat::Fp8 { .. } => {
                let data = &self.data[row * cols..(row + 1) * cols];
                for (bj, (chunk, bytes)) in out.chunks_mut(bc).zip(data.chunks(bc)).enumerate() {
                    block::decode_fp8(bytes, scale(bj), chunk);
                }
            }
            _ => self.dequantize_range(row, 0, out),
        }
    }

    /// Dequantises columns `[c0, c0 + out.len())` of `row` into `out` (value × block scale,
    /// the same values as [`QuantMatrix::dequantize_row`]). For FP4, `c0` must be even.
    pub fn dequantize_range(&self, row: usize, c0: usize, out: &mut [f32]) {
        let bc = self.format.block_cols();
        let nbc = self.cols.div_ceil(bc);
        let s0 = (row / self.format.block_rows()) * nbc;
        let scale = |bj: usize| match (&self.scales, self.format) {
            (Scales::F32(s), _) => s[s0 + bj],
            (Scales::Bytes(b), QuantFormat::Nvfp4) => e4m3_decode(b[s0 + bj]) * self.tensor_scale,
            (Scales::Bytes(b), _) => ue8m0_decode(b[s0 + bj]),
        };
        let base = row * self.cols;
        let mut c = c0;
        let mut rest = out;
        while !rest.is_empty() {
            let bj = c / bc;
            let fp4 = !matches!(self.format, QuantFormat::Fp8 { .. });
            if fp4 && c.is_multiple_of(bc) && rest.len() >= bc {
                // Up to 64 whole FP4 blocks in one call (scales decoded first).
                let nb = (rest.len() / bc).min(64);
                let mut sc = [0.0f32; 64];
                for (i, s) in sc[..nb].iter_mut().enumerate() {
                    *s = scale(bj + i);
                }
                let take = nb * bc;
                let (piece, tail) = rest.split_at_mut(take);
                let bytes = &self.data[(base + c) / 2..(base + c + take) / 2];
                block::decode_fp4_blocks(bytes, &sc[..nb], bc / 2, piece);
                c += take;
                rest = tail;
                continue;
            }
            let take = ((bj + 1) * bc - c).min(rest.len());
            let (piece, tail) = rest.split_at_mut(take);
            if fp4 {
                block::decode_fp4(
                    &self.data[(base + c) / 2..(base + c + take).div_ceil(2)],
                    scale(bj),
                    piece,
                )
            } else {
                block::decode_fp8(&self.data[base + c..base + c + take], scale(bj), piece)
            }
            c += take;
            rest = tail;
        }
    }

    /// Dequantises the whole matrix (row-major f32).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.cols];
        self.fill_dequantized(&mut out);
        out
    }

    /// Dequantises the whole matrix into `out` (row-major, length `rows * cols`), for callers
    /// that reuse a buffer.
    pub fn dequantize_into(&self, out: &mut [f32]) -> Result<()> {
        if out.len() != self.rows * self.cols {
            return Err(shape_err(
                "dequantize_into",
                format!("buffer of {} for [{}, {}]", out.len(), self.rows, self.cols),
            ));
        }
        self.fill_dequantized(out);
        Ok(())
    }

    fn fill_dequantized(&self, out: &mut [f32]) {
        if self.cols == 0 {
            return;
        }
        for (r, row) in out.chunks_mut(self.cols).enumerate() {
            self.dequantize_row(r, row);
        }
    }
}

/// Block-scaled FP8 (the loop is [`block::quantize_fp8`]). `None` on non-finite input.
fn quantize_fp8(
    x: &[f32],
    rows: usize,
    cols: usize,
    br: usize,
    bc: usize,
    scale: ScaleFormat,
    format: QuantFormat,
) -> Option<QuantMatrix> {
    let mut scales_f = vec![0.0f32; rows.div_ceil(br) * cols.div_ceil(bc)];
    let mut data = vec![0u8; rows * cols];
    if !block::quantize_fp8(x, (rows, cols), (br, bc), scale, &mut scales_f, &mut data) {
        return None;
    }
    let scales = match scale {
        ScaleFormat::F32 => Scales::F32(scales_f),
        ScaleFormat::Ue8m0 => Scales::Bytes(
            scales_f
                .iter()
                .map(|&s| ue8m0_encode_pow2(fp8::floor_log2(s)))
                .collect(),
        ),
    };
    Some(QuantMatrix {
        format,
        rows,
        cols,
        data,
        scales,
        tensor_scale: 1.0,
    })
}

/// MXFP4 / NVFP4 (the loop is [`block::quantize_fp4`]). `None` on non-finite input.
fn quantize_fp4(x: &[f32], rows: usize, cols: usize, format: QuantFormat) -> Option<QuantMatrix> {
    let bc = format.block_cols();
    let nvfp4 = if format == QuantFormat::Nvfp4 {
        let m = block::amax_bits(x);
        if block::non_finite(m) {
            return None;
        }
        let amax = f32::from_bits(m);
        Some(if amax > 0.0 {
            amax / (fp8::E4M3_MAX * fp4::E2M1_MAX)
        } else {
            1.0
        })
    } else {
        None
    };
    let mut scale_bytes = vec![0u8; rows * (cols / bc)];
    let mut data = vec![0u8; rows * cols / 2];
    if !block::quantize_fp4(x, bc, nvfp4, &mut scale_bytes, &mut data) {
        return None;
    }
    Some(QuantMatrix {
        format,
        rows,
        cols,
        data,
        scales: Scales::Bytes(scale_bytes),
        tensor_scale: nvfp4.unwrap_or(1.0),
    })
}

/// The quantisation round trips the NumPy reference applies in QAT mode, along the last axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FakeQuant {
    /// `qat_fp8`: e4m3 values, one power-of-two scale per `block` channels (amax floor 1e-4).
    Fp8 {
        /// Channels per scale.
        block: usize,
    },
    /// `qat_mxfp4`: e2m1 values, one power-of-two scale per `block` channels.
    Mxfp4 {
        /// Channels per scale.
        block: usize,
    },
    /// `qat_nvfp4`: e2m1 values, one e4m3 scale (amax / 6 rounded) per `block` channels.
    Nvfp4 {
        /// Channels per scale.
        block: usize,
    },
}

impl FakeQuant {
    /// Channels per scale.
    pub fn block(&self) -> usize {
        match *self {
            FakeQuant::Fp8 { block } | FakeQuant::Mxfp4 { block } | FakeQuant::Nvfp4 { block } => {
                block
            }
        }
    }

    /// Applies the round trip in place to one block of values.
    pub fn apply_block(&self, g: &mut [f32]) {
        let amax = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        match *self {
            FakeQuant::Fp8 { .. } => {
                let s = exp2i(ceil_log2(amax.max(1e-4) / fp8::E4M3_MAX));
                for v in g.iter_mut() {
                    *v = round_e4m3(*v / s) * s;
                }
            }
            FakeQuant::Mxfp4 { .. } => {
                let s = exp2i(ceil_log2(
                    amax.max(fp4::E2M1_MAX * exp2i(-126)) / fp4::E2M1_MAX,
                ));
                for v in g.iter_mut() {
                    *v = round_e2m1((*v / s).clamp(-6.0, 6.0)) * s;
                }
            }
            FakeQuant::Nvfp4 { .. } => {
                let s = round_e4m3(amax.max(fp4::E2M1_MAX * exp2i(-9)) / fp4::E2M1_MAX);
                for v in g.iter_mut() {
                    *v = round_e2m1((*v / s).clamp(-6.0, 6.0)) * s;
                }
            }
        }
    }
}
