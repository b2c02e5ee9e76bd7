//! Element types of device buffers.

/// Element type of a tensor.
///
/// The quantised weight formats carry their block scales with them (see [`crate::quant`]);
/// their logical shape is the dequantised `[rows, cols]` matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16 (the upper half of an f32).
    BF16,
    /// IEEE binary16.
    F16,
    /// FP8 e4m3fn values with block scales (a weight format).
    F8E4M3,
    /// FP4 e2m1 values, MXFP4 layout: blocks of 32 with UE8M0 scales (a weight format).
    Mxfp4,
    /// FP4 e2m1 values, NVFP4 layout: blocks of 16 with E4M3 scales and one f32 tensor scale.
    Nvfp4,
    /// 32-bit signed integers.
    I32,
    /// 64-bit signed integers.
    I64,
}

impl DType {
    /// True for the float activation types (f32, bf16, f16).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F16)
    }

    /// True for the block-quantised weight formats.
    pub fn is_quantized(self) -> bool {
        matches!(self, DType::F8E4M3 | DType::Mxfp4 | DType::Nvfp4)
    }

    /// True for the integer types.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }
}
