//! RMSNorm with optional dynamic MXFP8 quantisation of the output.

use super::{
    BUFFER_NUM, FieldRole::*, KernelTiling, Partition, TilingAbi, UbBudget, align32, halving,
    pick_largest, tiling_struct, u32_of,
};
use crate::chip::ChipSpec;
use crate::error::{Result, shape_err};
use crate::mx::MX_BLOCK;

/// Problem shape of one RMSNorm launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsNormShape {
    /// Rows (tokens).
    pub rows: usize,
    /// Row length.
    pub dim: usize,
    /// Epsilon inside the square root.
    pub eps: f32,
    /// Also emit MXFP8 codes and E8M0 scales of the bf16 output.
    pub quant: bool,
}

tiling_struct! {
    /// Tiling of `rmsnorm_quant.asc`.
    RmsNormTiling {
        /// Rows in the launch.
        rows: u32 = Scalar,
        /// Row length.
        dim: u32 = Scalar,
        /// Blocks launched.
        block_dim: u32 = Scalar,
        /// Rows per block (the last block takes the rest).
        rows_per_block: u32 = Scalar,
        /// Rows of the last block.
        last_rows: u32 = Scalar,
        /// Elements per tile (multiple of 32, so any element type moves in whole blocks).
        tile_len: u32 = AlignedCount { elem_bytes: 1 },
        /// Tiles per row.
        tile_num: u32 = Scalar,
        /// Elements of the last tile (1..=tile_len; moved with DataCopyPad).
        tail_len: u32 = Scalar,
        /// 1 when MXFP8 output is wanted.
        quant: u32 = Scalar,
        /// Epsilon.
        eps: f32 = Scalar,
        /// 1 / dim.
        inv_dim: f32 = Scalar,
        /// Bytes of one x (bf16) tile buffer.
        x_bytes: u32 = BufferBytes,
        /// Bytes of one weight (f32) tile buffer.
        w_bytes: u32 = BufferBytes,
        /// Bytes of one y (bf16) tile buffer.
        y_bytes: u32 = BufferBytes,
        /// Bytes of one MXFP8 code tile buffer.
        q_bytes: u32 = BufferBytes,
        /// Bytes of one scale tile buffer.
        s_bytes: u32 = BufferBytes,
        /// Bytes of the f32 work buffer.
        tmp_bytes: u32 = BufferBytes,
    }
}

impl RmsNormTiling {
    /// Plan a launch.
    pub fn plan(spec: &ChipSpec, s: &RmsNormShape) -> Result<Self> {
        if s.rows == 0 || s.dim == 0 {
            return shape_err("rmsnorm: empty input");
        }
        if s.quant && !s.dim.is_multiple_of(MX_BLOCK) {
            return shape_err(format!(
                "rmsnorm: quantised dim {} not a multiple of 32",
                s.dim
            ));
        }
        if !(s.eps >= 0.0 && s.eps.is_finite()) {
            return shape_err("rmsnorm: eps must be finite and >= 0");
        }
        let part = Partition::new(s.rows, spec.vector_cores, 1)?;
        let t = pick_largest(
            spec,
            "rmsnorm",
            halving(s.dim.min(8192), MX_BLOCK),
            |tile| {
                let t = Self::with_tile(s, part, tile)?;
                Ok((t, t.budget()))
            },
        )?;
        t.validate()?;
        Ok(t)
    }

    fn with_tile(s: &RmsNormShape, part: Partition, tile: usize) -> Result<Self> {
        let tile_num = s.dim.div_ceil(tile);
        let tail = s.dim - (tile_num - 1) * tile;
        let (q_bytes, s_bytes) = if s.quant {
            (align32(tile), align32(tile / MX_BLOCK))
        } else {
            (32, 32)
        };
        Ok(Self {
            rows: u32_of(s.rows, "rows")?,
            dim: u32_of(s.dim, "dim")?,
            block_dim: part.block_dim,
            rows_per_block: part.per_block,
            last_rows: part.last,
            tile_len: u32_of(tile, "tile")?,
            tile_num: u32_of(tile_num, "tile_num")?,
            tail_len: u32_of(tail, "tail")?,
            quant: u32::from(s.quant),
            eps: s.eps,
            inv_dim: 1.0 / s.dim as f32,
            x_bytes: u32_of(align32(tile * 2), "x_bytes")?,
            w_bytes: u32_of(align32(tile * 4), "w_bytes")?,
            y_bytes: u32_of(align32(tile * 2), "y_bytes")?,
            q_bytes: u32_of(q_bytes, "q_bytes")?,
            s_bytes: u32_of(s_bytes, "s_bytes")?,
            // f32 copy of the tile plus the reduction work area (same size).
            tmp_bytes: u32_of(align32(tile * 4) * 2, "tmp_bytes")?,
        })
    }
}

impl KernelTiling for RmsNormTiling {
    fn budget(&self) -> UbBudget {
        UbBudget::default()
            .queue("inQueueX", BUFFER_NUM, self.x_bytes as usize)
            .queue("inQueueW", BUFFER_NUM, self.w_bytes as usize)
            .queue("outQueueY", BUFFER_NUM, self.y_bytes as usize)
            .queue("outQueueQ", BUFFER_NUM, self.q_bytes as usize)
            .queue("outQueueS", BUFFER_NUM, self.s_bytes as usize)
            .tmp("tmpBuf", self.tmp_bytes as usize)
    }
}
