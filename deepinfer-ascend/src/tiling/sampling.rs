//! Sampling from probabilities through a fixed-point integer CDF, so that any split of the
//! vocabulary (and any device) picks the same token for the same uniform draw.

use super::{
    BUFFER_NUM, FieldRole::*, KernelTiling, Partition, TilingAbi, UbBudget, align32, halving,
    pick_largest, tiling_struct, u32_of,
};
use crate::chip::ChipSpec;
use crate::error::{Result, shape_err};

/// Fixed-point weight of a probability: floor(p · 2^FIXED_SHIFT).
pub const FIXED_SHIFT: u32 = 24;

/// Problem shape of one sampling launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SamplingShape {
    /// Rows (one token drawn per row).
    pub rows: usize,
    /// Vocabulary size.
    pub vocab: usize,
}

tiling_struct! {
    /// Tiling of `sampling.asc`. Blocks split the rows; each row is scanned twice in tiles
    /// (total weight, then the tile holding the draw).
    SamplingTiling {
        /// Rows.
        rows: u32 = Scalar,
        /// Vocabulary size.
        vocab: u32 = Scalar,
        /// Blocks launched.
        block_dim: u32 = Scalar,
        /// Rows per block.
        rows_per_block: u32 = Scalar,
        /// Rows of the last block.
        last_rows: u32 = Scalar,
        /// Probabilities per tile (multiple of 8).
        tile_len: u32 = AlignedCount { elem_bytes: 4 },
        /// Tiles per row.
        tile_num: u32 = Scalar,
        /// Probabilities of the last tile.
        tail_len: u32 = Scalar,
        /// Fixed-point shift.
        fixed_shift: u32 = Scalar,
        /// Bytes of one probability tile buffer.
        in_bytes: u32 = BufferBytes,
        /// Bytes of one token-id output buffer.
        out_bytes: u32 = BufferBytes,
        /// Bytes of the integer work area (weights and their prefix).
        tmp_bytes: u32 = BufferBytes,
    }
}

impl SamplingTiling {
    /// Plan a launch.
    pub fn plan(spec: &ChipSpec, s: &SamplingShape) -> Result<Self> {
        if s.rows == 0 || s.vocab == 0 {
            return shape_err("sampling: empty input");
        }
        let part = Partition::new(s.rows, spec.vector_cores, 1)?;
        let t = pick_largest(spec, "sampling", halving(s.vocab.min(16384), 8), |tile| {
            let tile_num = s.vocab.div_ceil(tile);
            let t = Self {
                rows: u32_of(s.rows, "rows")?,
                vocab: u32_of(s.vocab, "vocab")?,
                block_dim: part.block_dim,
                rows_per_block: part.per_block,
                last_rows: part.last,
                tile_len: u32_of(tile, "tile")?,
                tile_num: u32_of(tile_num, "tile_num")?,
                tail_len: u32_of(s.vocab - (tile_num - 1) * tile, "tail")?,
                fixed_shift: FIXED_SHIFT,
                in_bytes: u32_of(align32(tile * 4), "in_bytes")?,
                out_bytes: 32,
                tmp_bytes: u32_of(2 * align32(tile * 4), "tmp_bytes")?,
            };
            Ok((t, t.budget()))
        })?;
        t.validate()?;
        Ok(t)
    }
}

impl KernelTiling for SamplingTiling {
    fn budget(&self) -> UbBudget {
        UbBudget::default()
            .queue("inQueueP", BUFFER_NUM, self.in_bytes as usize)
            .queue("outQueueTok", 1, self.out_bytes as usize)
            .tmp("tmpBuf", self.tmp_bytes as usize)
    }
}
