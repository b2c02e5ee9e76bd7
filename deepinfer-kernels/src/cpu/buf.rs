//! A CPU tensor's element buffer: owned and shared by reference count, or a read-only view
//! of memory someone else owns (a memory-mapped checkpoint), read in place. Writes copy a
//! view into an owned buffer first.

use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;

use bytemuck::Pod;

use crate::error::{Result, invalid};

pub(crate) use crate::backend::SharedBytes;

/// Elements of one tensor.
#[derive(Clone)]
pub(crate) enum Buf<T> {
    Owned(Arc<Vec<T>>),
    View {
        bytes: SharedBytes,
        start: usize,
        len: usize,
        _t: PhantomData<T>,
    },
}

impl<T: std::fmt::Debug> std::fmt::Debug for Buf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Buf::Owned(v) => write!(f, "Owned({} elements)", v.len()),
            Buf::View { len, .. } => write!(f, "View({len} elements)"),
        }
    }
}

impl<T: Pod> Buf<T> {
    /// An owned buffer.
    pub(crate) fn owned(v: Vec<T>) -> Self {
        Buf::Owned(Arc::new(v))
    }

    /// `len` elements at byte `start` of `bytes`, read in place. Fails when the range is
    /// outside the bytes or not aligned for `T` (the caller then copies instead).
    pub(crate) fn view(bytes: SharedBytes, start: usize, len: usize) -> Result<Self> {
        let size = std::mem::size_of::<T>();
        let end = len
            .checked_mul(size)
            .and_then(|n| n.checked_add(start))
            .filter(|&e| e <= (*bytes).as_ref().len())
            .ok_or_else(|| {
                invalid(
                    "view",
                    format!("{len} elements at byte {start} lie outside the bytes"),
                )
            })?;
        bytemuck::try_cast_slice::<u8, T>(&(*bytes).as_ref()[start..end])
            .map_err(|e| invalid("view", format!("elements at byte {start}: {e}")))?;
        Ok(Buf::View {
            bytes,
            start,
            len,
            _t: PhantomData,
        })
    }

    /// The elements.
    pub(crate) fn as_slice(&self) -> &[T] {
        match self {
            Buf::Owned(v) => v,
            Buf::View {
                bytes, start, len, ..
            } => {
                let end = start + len * std::mem::size_of::<T>();
                // Range and alignment were checked in `view`, and the bytes never change.
                bytemuck::cast_slice(&(**bytes).as_ref()[*start..end])
            }
        }
    }

    /// Mutable elements, copying a view (or a buffer shared with other tensors) first.
    pub(crate) fn make_mut(&mut self) -> &mut Vec<T> {
        if let Buf::View { .. } = self {
            *self = Buf::owned(self.as_slice().to_vec());
        }
        match self {
            Buf::Owned(v) => Arc::make_mut(v),
            Buf::View { .. } => unreachable!("a view was replaced by an owned copy above"),
        }
    }

    /// Whether the elements are read in place from memory this buffer does not own.
    pub(crate) fn is_view(&self) -> bool {
        matches!(self, Buf::View { .. })
    }
}

impl<T: Pod> Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_reads_in_place_and_a_write_copies() {
        let raw: Vec<u8> = [1.5f32, -2.0, 3.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let bytes: SharedBytes = Arc::new(raw);
        let mut b = Buf::<f32>::view(bytes.clone(), 4, 2).unwrap();
        assert!(b.is_view());
        assert_eq!(&b[..], &[-2.0, 3.25]);
        b.make_mut()[0] = 7.0;
        assert!(!b.is_view());
        assert_eq!(&b[..], &[7.0, 3.25]);
        assert_eq!(Buf::<f32>::view(bytes.clone(), 0, 3).unwrap().len(), 3);
    }

    #[test]
    fn out_of_range_or_misaligned_views_are_errors() {
        let bytes: SharedBytes = Arc::new(vec![0u8; 16]);
        assert!(Buf::<f32>::view(bytes.clone(), 8, 3).is_err());
        assert!(Buf::<f32>::view(bytes.clone(), usize::MAX, 2).is_err());
        assert!(Buf::<f32>::view(bytes.clone(), 0, usize::MAX).is_err());
        // Allocations of 16 bytes are at least 8-aligned, so byte 1 is misaligned for f32.
        assert!(Buf::<f32>::view(bytes, 1, 2).is_err());
    }
}
