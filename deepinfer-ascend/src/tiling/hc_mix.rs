//! Hyper-connection merge: `X'_k = post_k · out + Σ_j C[j,k] · X_j`, f32 math, bf16 streams.

use super::{
    BUFFER_NUM, FieldRole::*, KernelTiling, Partition, TilingAbi, UbBudget, align32, halving,
    pick_largest, tiling_struct, u32_of,
};
use crate::chip::ChipSpec;
use crate::error::{Result, shape_err};

/// Problem shape of one merge launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HcMixShape {
    /// Tokens.
    pub rows: usize,
    /// Residual streams (hc_mult, 4 in DeepSeek V4).
    pub streams: usize,
    /// Hidden size.
    pub dim: usize,
}

tiling_struct! {
    /// Tiling of `hc_mix.asc`. Blocks split the hidden dimension; each block runs every row.
    HcMixTiling {
        /// Tokens.
        rows: u32 = Scalar,
        /// Streams.
        streams: u32 = Scalar,
        /// Hidden size.
        dim: u32 = Scalar,
        /// Blocks launched.
        block_dim: u32 = Scalar,
        /// Columns per block (multiple of 16).
        cols_per_block: u32 = AlignedCount { elem_bytes: 2 },
        /// Columns of the last block.
        last_cols: u32 = Scalar,
        /// Columns per tile (multiple of 16).
        tile_cols: u32 = AlignedCount { elem_bytes: 2 },
        /// Bytes of one streams tile (streams × tile_cols bf16).
        x_bytes: u32 = BufferBytes,
        /// Bytes of one sublayer-output tile.
        o_bytes: u32 = BufferBytes,
        /// Bytes of the f32 work area (accumulator and converted operand).
        tmp_bytes: u32 = BufferBytes,
    }
}

impl HcMixTiling {
    /// Plan a launch.
    pub fn plan(spec: &ChipSpec, s: &HcMixShape) -> Result<Self> {
        if s.rows == 0 || s.streams == 0 || s.dim == 0 {
            return shape_err("hc_mix: empty input");
        }
        if s.streams > 16 {
            return shape_err(format!("hc_mix: {} streams (at most 16)", s.streams));
        }
        let part = Partition::new(s.dim, spec.vector_cores, 64)?;
        let t = pick_largest(spec, "hc_mix", halving(part.per_block as usize, 16), |c| {
            let t = Self {
                rows: u32_of(s.rows, "rows")?,
                streams: u32_of(s.streams, "streams")?,
                dim: u32_of(s.dim, "dim")?,
                block_dim: part.block_dim,
                cols_per_block: part.per_block,
                last_cols: part.last,
                tile_cols: u32_of(c, "tile_cols")?,
                x_bytes: u32_of(align32(s.streams * c * 2), "x_bytes")?,
                o_bytes: u32_of(align32(c * 2), "o_bytes")?,
                tmp_bytes: u32_of(2 * align32(c * 4), "tmp_bytes")?,
            };
            Ok((t, t.budget()))
        })?;
        t.validate()?;
        Ok(t)
    }
}

impl KernelTiling for HcMixTiling {
    fn budget(&self) -> UbBudget {
        UbBudget::default()
            .queue("inQueueX", BUFFER_NUM, self.x_bytes as usize)
            .queue("inQueueO", BUFFER_NUM, self.o_bytes as usize)
            .queue("outQueueY", BUFFER_NUM, self.x_bytes as usize)
            .tmp("tmpBuf", self.tmp_bytes as usize)
    }
}
