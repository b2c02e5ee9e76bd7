//! Partial interleaved RoPE on the last `rope_dim` channels of every head vector.

use super::{
    BUFFER_NUM, FieldRole::*, KernelTiling, Partition, TilingAbi, UbBudget, align_up, align32,
    halving, pick_largest, tiling_struct, u32_of,
};
use crate::chip::ChipSpec;
use crate::error::{Result, shape_err};

/// Problem shape of one RoPE launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeShape {
    /// Rows (tokens); each has its own position.
    pub rows: usize,
    /// Heads per row.
    pub heads: usize,
    /// Channels per head vector.
    pub head_dim: usize,
    /// Rotated channels at the end of each vector (even).
    pub rope_dim: usize,
    /// Rows of the cos/sin tables (positions must be below this).
    pub table_len: usize,
    /// Rotate by −φ (undo RoPE on the attention output).
    pub inverse: bool,
}

tiling_struct! {
    /// Tiling of `rope.asc`.
    RopeTiling {
        /// Rows.
        rows: u32 = Scalar,
        /// Heads per row.
        heads: u32 = Scalar,
        /// Channels per head.
        head_dim: u32 = Scalar,
        /// Rotated channels.
        rope_dim: u32 = Scalar,
        /// rope_dim / 2.
        half_rope: u32 = Scalar,
        /// head_dim rounded up to 16 (UB row stride in bf16 elements).
        row_stride: u32 = AlignedCount { elem_bytes: 2 },
        /// Rows in the cos/sin tables.
        table_len: u32 = Scalar,
        /// 1 to rotate by −φ.
        inverse: u32 = Scalar,
        /// Blocks launched.
        block_dim: u32 = Scalar,
        /// Head vectors per block.
        vecs_per_block: u32 = Scalar,
        /// Head vectors of the last block.
        last_vecs: u32 = Scalar,
        /// Head vectors per tile.
        vecs_per_tile: u32 = Scalar,
        /// Bytes of one x tile (vecs_per_tile × row_stride bf16).
        x_bytes: u32 = BufferBytes,
        /// Bytes of one cos (or sin) row buffer.
        cs_bytes: u32 = BufferBytes,
        /// Bytes of the f32 work buffer.
        tmp_bytes: u32 = BufferBytes,
    }
}

impl RopeTiling {
    /// Plan a launch.
    pub fn plan(spec: &ChipSpec, s: &RopeShape) -> Result<Self> {
        if s.rows == 0 || s.heads == 0 || s.head_dim == 0 || s.table_len == 0 {
            return shape_err("rope: empty input");
        }
        if s.rope_dim == 0 || !s.rope_dim.is_multiple_of(2) || s.rope_dim > s.head_dim {
            return shape_err(format!(
                "rope: rope_dim {} must be even and <= head_dim",
                s.rope_dim
            ));
        }
        let units = s.rows * s.heads;
        let part = Partition::new(units, spec.vector_cores, 1)?;
        let stride = align_up(s.head_dim, 16);
        let half = s.rope_dim / 2;
        let t = pick_largest(spec, "rope", halving(part.per_block as usize, 1), |v| {
            let t = Self {
                rows: u32_of(s.rows, "rows")?,
                heads: u32_of(s.heads, "heads")?,
                head_dim: u32_of(s.head_dim, "head_dim")?,
                rope_dim: u32_of(s.rope_dim, "rope_dim")?,
                half_rope: u32_of(half, "half")?,
                row_stride: u32_of(stride, "stride")?,
                table_len: u32_of(s.table_len, "table_len")?,
                inverse: u32::from(s.inverse),
                block_dim: part.block_dim,
                vecs_per_block: part.per_block,
                last_vecs: part.last,
                vecs_per_tile: u32_of(v, "vecs")?,
                x_bytes: u32_of(align32(v * stride * 2), "x_bytes")?,
                cs_bytes: u32_of(align32(half * 4), "cs_bytes")?,
                // even lanes, odd lanes, and two products, all f32.
                tmp_bytes: u32_of(4 * align32(half * 4), "tmp_bytes")?,
            };
            Ok((t, t.budget()))
        })?;
        t.validate()?;
        Ok(t)
    }
}

impl KernelTiling for RopeTiling {
    fn budget(&self) -> UbBudget {
        UbBudget::default()
            .queue("inQueueX", BUFFER_NUM, self.x_bytes as usize)
            .queue("inQueueCos", BUFFER_NUM, self.cs_bytes as usize)
            .queue("inQueueSin", BUFFER_NUM, self.cs_bytes as usize)
            .queue("outQueueY", BUFFER_NUM, self.x_bytes as usize)
            .tmp("tmpBuf", self.tmp_bytes as usize)
    }
}
