//! CPU emulator of the kernels' tiled algorithms.
//!
//! Each emulator follows its `.asc` source step by step: the same split over blocks, the same
//! tile loop, the same UB buffers (allocated from a [`UbArena`] that fails on overflow or
//! misalignment), the same dtype steps (bf16 casts round to nearest even, f32 accumulation,
//! MX quantisation) and the same reduction order ([`tree_sum`] inside a tile, sequential across
//! tiles). Outputs go through [`GmOut`], which fails unless every index is written exactly once.

use crate::chip::{BLOCK_BYTES, ChipSpec};
use crate::error::{AscendError, Result};

mod attention;
mod gemv;
mod hc_mix;
mod rmsnorm;
mod rope;
mod router;
mod sampling;

pub use attention::{AttentionInputs, attention};
pub use gemv::{GemvInputs, gemv};
pub use hc_mix::hc_mix;
pub use rmsnorm::{RmsNormOutput, rmsnorm_quant};
pub use rope::rope;
pub use router::{RouterOutput, router};
pub use sampling::{fixed_weight, sampling};

/// Unified buffer of one emulated vector core: a bump allocator over the chip's UB size.
#[derive(Debug)]
pub struct UbArena {
    kernel: &'static str,
    capacity: usize,
    used: usize,
    names: Vec<&'static str>,
}

impl UbArena {
    /// An empty UB of `spec.ub_bytes`.
    pub fn new(spec: &ChipSpec, kernel: &'static str) -> Self {
        Self {
            kernel,
            capacity: spec.ub_bytes,
            used: 0,
            names: Vec::new(),
        }
    }

    /// `pipe.InitBuffer(name, depth, bytes)`: fails on a second init of the same name, on a size
    /// that is not whole 32-byte blocks, and on overflowing the UB.
    pub fn init_buffer(&mut self, name: &'static str, depth: u32, bytes: u32) -> Result<UbBuf> {
        let bytes = bytes as usize;
        if self.names.contains(&name) {
            return Err(self.err(format!("{name} initialised twice")));
        }
        if bytes == 0
            || !bytes.is_multiple_of(BLOCK_BYTES)
            || !self.used.is_multiple_of(BLOCK_BYTES)
        {
            return Err(self.err(format!(
                "{name}: {bytes} bytes is not a whole number of 32-byte blocks"
            )));
        }
        let need = self.used + depth as usize * bytes;
        if need > self.capacity {
            return Err(self.err(format!(
                "{name}: UB overflow ({need} bytes > {} available)",
                self.capacity
            )));
        }
        self.names.push(name);
        let offset = self.used;
        self.used = need;
        Ok(UbBuf {
            kernel: self.kernel,
            name,
            offset,
            bytes,
        })
    }

    /// Bytes allocated so far.
    pub fn used(&self) -> usize {
        self.used
    }

    fn err(&self, detail: String) -> AscendError {
        AscendError::Emulator {
            kernel: self.kernel,
            detail,
        }
    }
}

/// One buffer (or one slot of a queue) in UB.
#[derive(Debug, Clone, Copy)]
pub struct UbBuf {
    kernel: &'static str,
    name: &'static str,
    offset: usize,
    bytes: usize,
}

impl UbBuf {
    /// Byte offset in UB.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes per slot.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn err(&self, detail: String) -> AscendError {
        AscendError::Emulator {
            kernel: self.kernel,
            detail: format!("{}: {detail}", self.name),
        }
    }

    /// Check that `rows` rows of `row_len` elements of `T`, each padded to 32 bytes, fit.
    pub fn fits<T>(&self, rows: usize, row_len: usize) -> Result<()> {
        let row_bytes = crate::tiling::align32(row_len * size_of::<T>());
        if rows * row_bytes > self.bytes {
            return Err(self.err(format!(
                "{rows} rows of {row_len} elements need {} bytes, buffer has {}",
                rows * row_bytes,
                self.bytes
            )));
        }
        Ok(())
    }

    /// Move `len` elements from global memory at `off` into this buffer. `pad` false emulates
    /// `DataCopy` (byte count must be whole 32-byte blocks); true emulates `DataCopyPad`.
    pub fn load<T: Copy>(&self, src: &[T], off: usize, len: usize, pad: bool) -> Result<Vec<T>> {
        self.load_rows(src, std::iter::once(off), len, pad)
            .map(|mut v| v.remove(0))
    }

    /// Strided move of several rows (one DataCopy with a block count); each row lands padded
    /// to 32 bytes in UB.
    pub fn load_rows<T: Copy>(
        &self,
        src: &[T],
        starts: impl IntoIterator<Item = usize>,
        len: usize,
        pad: bool,
    ) -> Result<Vec<Vec<T>>> {
        if !pad && !(len * size_of::<T>()).is_multiple_of(BLOCK_BYTES) {
            return Err(self.err(format!(
                "DataCopy of {} bytes is not a multiple of 32",
                len * size_of::<T>()
            )));
        }
        let mut out = Vec::new();
        for s in starts {
            let row = src
                .get(s..s + len)
                .ok_or_else(|| self.err(format!("global read {s}..{} out of bounds", s + len)))?;
            out.push(row.to_vec());
        }
        self.fits::<T>(out.len(), len)?;
        Ok(out)
    }

    /// Move `data` from this buffer to global memory at `off` (`pad` as in [`UbBuf::load`]).
    pub fn store<T: Copy + Default>(
        &self,
        dst: &mut GmOut<T>,
        off: usize,
        data: &[T],
        pad: bool,
    ) -> Result<()> {
        if !pad && !std::mem::size_of_val(data).is_multiple_of(BLOCK_BYTES) {
            return Err(self.err(format!(
                "DataCopy of {} bytes is not a multiple of 32",
                std::mem::size_of_val(data)
            )));
        }
        self.fits::<T>(1, data.len())?;
        dst.write(off, data).map_err(|d| self.err(d))
    }
}

/// A global-memory output that counts writes per element.
#[derive(Debug, Clone)]
pub struct GmOut<T> {
    data: Vec<T>,
    writes: Vec<u8>,
}

impl<T: Copy + Default> GmOut<T> {
    /// `len` zeroed elements, none written yet.
    pub fn new(len: usize) -> Self {
        Self {
            data: vec![T::default(); len],
            writes: vec![0; len],
        }
    }

    /// Write `src` at `off`; out-of-range writes are an error.
    pub fn write(&mut self, off: usize, src: &[T]) -> std::result::Result<(), String> {
        let end = off + src.len();
        if end > self.data.len() {
            return Err(format!(
                "global write {off}..{end} past {}",
                self.data.len()
            ));
        }
        self.data[off..end].copy_from_slice(src);
        for w in &mut self.writes[off..end] {
            *w = w.saturating_add(1);
        }
        Ok(())
    }

    /// The data, if every element was written exactly once.
    pub fn finish(self, kernel: &'static str) -> Result<Vec<T>> {
        if let Some((i, &w)) = self.writes.iter().enumerate().find(|&(_, &w)| w != 1) {
            return Err(AscendError::Emulator {
                kernel,
                detail: format!("output index {i} written {w} times"),
            });
        }
        Ok(self.data)
    }
}

/// The vector unit's reduction order: repeatedly add the upper half onto the lower half.
pub fn tree_sum(v: &[f32]) -> f32 {
    if v.is_empty() {
        return 0.0;
    }
    let mut b = v.to_vec();
    let mut n = b.len();
    while n > 1 {
        let h = n.div_ceil(2);
        for i in 0..n / 2 {
            b[i] += b[i + h];
        }
        n = h;
    }
    b[0]
}

/// Input length check shared by the emulators and the device runner.
pub fn check_len(kernel: &'static str, what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(AscendError::Shape(format!(
            "{kernel}: {what} has {got} elements, expected {want}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chip::Chip;

    #[test]
    fn arena_rejects_overflow_misalignment_and_double_init() {
        let spec = Chip::Ascend910B.spec();
        let mut ub = UbArena::new(&spec, "t");
        assert!(ub.init_buffer("a", 2, 48).is_err());
        ub.init_buffer("a", 2, 64 * 1024).unwrap();
        assert!(ub.init_buffer("a", 1, 32).is_err());
        assert!(ub.init_buffer("b", 1, 64 * 1024 + 32).is_err());
        ub.init_buffer("b", 1, 64 * 1024).unwrap();
        assert_eq!(ub.used(), spec.ub_bytes);
    }

    #[test]
    fn datacopy_needs_whole_blocks_but_pad_does_not() {
        let spec = Chip::Ascend950.spec();
        let mut ub = UbArena::new(&spec, "t");
        let b = ub.init_buffer("x", 1, 64).unwrap();
        let src = vec![1u16; 100];
        assert!(b.load(&src, 0, 16, false).is_ok());
        assert!(b.load(&src, 0, 15, false).is_err());
        assert!(b.load(&src, 0, 15, true).is_ok());
        assert!(
            b.load(&src, 0, 33, true).is_err(),
            "33 u16 pad to 96 bytes > 64"
        );
        assert!(b.load(&src, 90, 16, false).is_err(), "out of bounds read");
    }

    #[test]
    fn gm_out_detects_double_and_missing_writes() {
        let mut g = GmOut::<f32>::new(4);
        g.write(0, &[1.0, 2.0]).unwrap();
        assert!(g.clone().finish("t").is_err());
        g.write(1, &[3.0, 4.0, 5.0]).unwrap();
        assert!(g.clone().finish("t").is_err());
        assert!(g.write(3, &[1.0, 1.0]).is_err());
        let mut h = GmOut::<f32>::new(2);
        h.write(0, &[1.0, 2.0]).unwrap();
        assert_eq!(h.finish("t").unwrap(), vec![1.0, 2.0]);
    }

    #[test]
    fn tree_sum_order() {
        assert_eq!(tree_sum(&[]), 0.0);
        assert_eq!(tree_sum(&[1.0, 2.0, 3.0]), 6.0);
        // (1e8 + 1) + (-1e8 + 1) in tree order vs left to right differs in f32.
        let v = [1e8f32, -1e8, 1.0, 1.0];
        assert_eq!(tree_sum(&v), (1e8f32 + 1.0) + (-1e8f32 + 1.0));
    }
}
