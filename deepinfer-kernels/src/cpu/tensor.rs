//! The CPU tensor: a shape plus a shared, reference-counted buffer.

use std::borrow::Cow;
use std::sync::Arc;

use half::{bf16, f16};

use super::buf::Buf;
use crate::DType;
use crate::backend::TensorInfo;
use crate::error::{KernelError, Result, shape_err};
use crate::quant::QuantMatrix;

/// Buffers by element type (shared; writes copy on demand).
#[derive(Debug, Clone)]
pub(crate) enum Data {
    F32(Buf<f32>),
    BF16(Buf<bf16>),
    F16(Buf<f16>),
    I32(Buf<i32>),
    I64(Buf<i64>),
    Quant(Arc<QuantMatrix>),
}

/// A tensor in host memory. Cloning shares the buffer.
#[derive(Debug, Clone)]
pub struct CpuTensor {
    pub(crate) shape: Vec<usize>,
    pub(crate) data: Data,
}

impl TensorInfo for CpuTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn dtype(&self) -> DType {
        match &self.data {
            Data::F32(_) => DType::F32,
            Data::BF16(_) => DType::BF16,
            Data::F16(_) => DType::F16,
            Data::I32(_) => DType::I32,
            Data::I64(_) => DType::I64,
            Data::Quant(q) => q.format().dtype(),
        }
    }
}

impl CpuTensor {
    /// An f32 tensor from owned data (checked against the shape).
    pub fn from_vec(data: Vec<f32>, shape: &[usize]) -> Result<Self> {
        check_len("CpuTensor::from_vec", data.len(), shape)?;
        Ok(Self::f32_unchecked(data, shape))
    }

    pub(crate) fn f32_unchecked(data: Vec<f32>, shape: &[usize]) -> Self {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        Self {
            shape: shape.to_vec(),
            data: Data::F32(Buf::owned(data)),
        }
    }

    pub(crate) fn i32_unchecked(data: Vec<i32>, shape: &[usize]) -> Self {
        debug_assert_eq!(data.len(), shape.iter().product::<usize>());
        Self {
            shape: shape.to_vec(),
            data: Data::I32(Buf::owned(data)),
        }
    }

    /// Borrowed f32 view (f32) or a converted copy (bf16, f16, dequantised weights).
    pub fn to_f32(&self, op: &'static str) -> Result<Cow<'_, [f32]>> {
        Ok(match &self.data {
            Data::F32(v) => Cow::Borrowed(v.as_slice()),
            Data::BF16(v) => Cow::Owned(v.iter().map(|x| x.to_f32()).collect()),
            Data::F16(v) => Cow::Owned(v.iter().map(|x| x.to_f32()).collect()),
            Data::Quant(q) => Cow::Owned(q.dequantize()),
            Data::I32(_) | Data::I64(_) => {
                return Err(KernelError::DType {
                    op,
                    dtype: self.dtype(),
                });
            }
        })
    }

    /// Whether the values are read in place from bytes the tensor does not own (a weight
    /// made by [`crate::Backend::upload_shared`] from a memory-mapped checkpoint).
    pub fn is_view(&self) -> bool {
        match &self.data {
            Data::F32(b) => b.is_view(),
            Data::BF16(b) => b.is_view(),
            Data::F16(b) => b.is_view(),
            Data::I32(b) => b.is_view(),
            Data::I64(b) => b.is_view(),
            Data::Quant(_) => false,
        }
    }

    /// Integer view widened to i64.
    pub fn to_i64(&self, op: &'static str) -> Result<Cow<'_, [i64]>> {
        Ok(match &self.data {
            Data::I64(v) => Cow::Borrowed(v.as_slice()),
            Data::I32(v) => Cow::Owned(v.iter().map(|&x| x as i64).collect()),
            _ => {
                return Err(KernelError::DType {
                    op,
                    dtype: self.dtype(),
                });
            }
        })
    }

    /// Last-axis size (1 for a scalar shape).
    pub(crate) fn last(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Number of rows: all elements over the last axis.
    pub(crate) fn rows(&self) -> usize {
        let l = self.last();
        self.numel().checked_div(l).unwrap_or(0)
    }
}

pub(crate) fn check_len(op: &'static str, len: usize, shape: &[usize]) -> Result<()> {
    let n: usize = shape.iter().product();
    if n != len {
        return Err(shape_err(op, format!("{len} values for shape {shape:?}")));
    }
    Ok(())
}

pub(crate) fn want_rank(op: &'static str, t: &CpuTensor, rank: usize) -> Result<()> {
    if t.shape.len() != rank {
        return Err(shape_err(
            op,
            format!("want rank {rank}, got shape {:?}", t.shape),
        ));
    }
    Ok(())
}
