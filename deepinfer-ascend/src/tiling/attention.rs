//! Decode attention over sliding-window rows plus gathered compressed entries, with a per-head
//! sink logit in the softmax denominator. K = V (one shared vector per key, MQA).

use super::{
    BUFFER_NUM, FieldRole::*, KernelTiling, Partition, TilingAbi, UbBudget, align32, tiling_struct,
    u32_of,
};
use crate::chip::ChipSpec;
use crate::error::{AscendError, Result, shape_err};

/// Problem shape of one attention launch (one query token, all heads).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    /// Query heads.
    pub heads: usize,
    /// Channels per head (= key/value width), a multiple of 16.
    pub head_dim: usize,
    /// Window rows visible to the query (the model always has at least its own row; zero
    /// keys in total give a zero output, all probability on the sink).
    pub n_window: usize,
    /// Compressed entries selected for the query.
    pub n_comp: usize,
    /// Rows in the compressed cache the indices point into.
    pub comp_rows: usize,
    /// Score scale (head_dim^-1/2).
    pub scale: f32,
}

tiling_struct! {
    /// Tiling of `attention.asc`. Blocks split the heads; every block walks all keys.
    AttentionTiling {
        /// Query heads.
        heads: u32 = Scalar,
        /// Channels per head.
        head_dim: u32 = AlignedCount { elem_bytes: 2 },
        /// Window keys.
        n_window: u32 = Scalar,
        /// Compressed keys.
        n_comp: u32 = Scalar,
        /// Rows of the compressed cache.
        comp_rows: u32 = Scalar,
        /// Score scale.
        scale: f32 = Scalar,
        /// Blocks launched.
        block_dim: u32 = Scalar,
        /// Heads per block.
        heads_per_block: u32 = Scalar,
        /// Heads of the last block.
        last_heads: u32 = Scalar,
        /// Keys per tile.
        keys_per_tile: u32 = Scalar,
        /// Bytes of the query buffer (heads_per_block × head_dim bf16).
        q_bytes: u32 = BufferBytes,
        /// Bytes of one key tile (keys_per_tile × head_dim bf16).
        k_bytes: u32 = BufferBytes,
        /// Bytes of the output buffer (heads_per_block × head_dim bf16).
        o_bytes: u32 = BufferBytes,
        /// Bytes of the f32 accumulator (heads_per_block × head_dim).
        acc_bytes: u32 = BufferBytes,
        /// Bytes of the f32 work area (query, key tile, scores, statistics).
        tmp_bytes: u32 = BufferBytes,
    }
}

impl AttentionTiling {
    /// Plan a launch.
    pub fn plan(spec: &ChipSpec, s: &AttentionShape) -> Result<Self> {
        if s.heads == 0 || s.head_dim == 0 {
            return shape_err("attention: empty input");
        }
        if !s.head_dim.is_multiple_of(16) {
            return shape_err(format!(
                "attention: head_dim {} not a multiple of 16",
                s.head_dim
            ));
        }
        if s.n_comp > 0 && s.comp_rows == 0 {
            return shape_err("attention: compressed indices but an empty cache");
        }
        if !s.scale.is_finite() {
            return shape_err("attention: scale must be finite");
        }
        let part = Partition::new(s.heads, spec.vector_cores, 1)?;
        let keys = s.n_window + s.n_comp;
        let mut last_err = None;
        for kt in [64usize, 32, 16, 8, 4, 2, 1] {
            let kt = kt.min(keys).max(1);
            let t = Self::with_tile(s, part, kt)?;
            match t.budget().check(spec, "attention") {
                Ok(()) => {
                    t.validate()?;
                    return Ok(t);
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| AscendError::Shape("attention: no tile".into())))
    }

    /// Bytes of the f32 work area as `attention.asc` lays it out: query (hb × d), key tile
    /// (kt × d), scores (hb × kt), running max and sum (hb each, padded to 8), a d-wide product
    /// row, and a 32-byte slot for scalar exponentials at the end.
    pub fn tmp_layout(hb: usize, kt: usize, d: usize) -> usize {
        align32(hb * d * 4)
            + align32(kt * d * 4)
            + align32(hb * kt * 4)
            + 2 * align32(hb * 4)
            + align32(d * 4)
            + 32
    }

    fn with_tile(s: &AttentionShape, part: Partition, kt: usize) -> Result<Self> {
        let hb = part.per_block as usize;
        let d = s.head_dim;
        let tmp = Self::tmp_layout(hb, kt, d);
        Ok(Self {
            heads: u32_of(s.heads, "heads")?,
            head_dim: u32_of(d, "head_dim")?,
            n_window: u32_of(s.n_window, "n_window")?,
            n_comp: u32_of(s.n_comp, "n_comp")?,
            comp_rows: u32_of(s.comp_rows, "comp_rows")?,
            scale: s.scale,
            block_dim: part.block_dim,
            heads_per_block: part.per_block,
            last_heads: part.last,
            keys_per_tile: u32_of(kt, "keys_per_tile")?,
            q_bytes: u32_of(align32(hb * d * 2), "q_bytes")?,
            k_bytes: u32_of(align32(kt * d * 2), "k_bytes")?,
            o_bytes: u32_of(align32(hb * d * 2), "o_bytes")?,
            acc_bytes: u32_of(align32(hb * d * 4), "acc_bytes")?,
            tmp_bytes: u32_of(tmp, "tmp_bytes")?,
        })
    }
}

impl KernelTiling for AttentionTiling {
    fn budget(&self) -> UbBudget {
        UbBudget::default()
            .queue("inQueueQ", 1, self.q_bytes as usize)
            .queue("inQueueK", BUFFER_NUM, self.k_bytes as usize)
            .queue("outQueueO", 1, self.o_bytes as usize)
            .tmp("accBuf", self.acc_bytes as usize)
            .tmp("tmpBuf", self.tmp_bytes as usize)
    }
}
