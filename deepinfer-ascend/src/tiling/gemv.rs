//! GEMV / skinny GEMM for decode: `y[m, n] = x[m, k] · W[n, k]ᵀ`, f32 output, weights bf16 or
//! MX (FP8 E4M3 / FP4 E2M1 with E8M0 scales per 32 along k; activations then MXFP8).

use super::{
    BUFFER_NUM, FieldRole::*, KernelTiling, Partition, TilingAbi, UbBudget, align32, halving,
    tiling_struct, u32_of,
};
use crate::chip::ChipSpec;
use crate::error::{Result, shape_err};
use crate::mx::{MX_BLOCK, MxFormat};

/// Entries of the GEMV decode table: 256 E4M3 values, 256 E8M0 scale values, 16 E2M1 values.
pub const GEMV_LUT_LEN: usize = 256 + 256 + 16;

/// The decode table the host passes to `gemv.asc` (NaN codes decode to NaN).
pub fn gemv_lut() -> Vec<f32> {
    let mut t: Vec<f32> = (0..=255u8).map(|c| MxFormat::Fp8E4M3.decode(c)).collect();
    t.extend((0..=255u8).map(crate::mx::scale_value));
    t.extend((0..16u8).map(|c| MxFormat::Fp4E2M1.decode(c)));
    t
}

/// Weight (and activation) storage of a GEMV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemvFormat {
    /// bf16 activations × bf16 weights.
    Bf16,
    /// MXFP8 activations × MX weights of the given element format.
    Mx(MxFormat),
}

impl GemvFormat {
    /// Code used in the tiling struct: 0 bf16, 1 MXFP8 weights, 2 MXFP4 weights.
    pub const fn code(self) -> u32 {
        match self {
            GemvFormat::Bf16 => 0,
            GemvFormat::Mx(MxFormat::Fp8E4M3) => 1,
            GemvFormat::Mx(MxFormat::Fp4E2M1) => 2,
        }
    }

    /// Bytes of `n` weight elements.
    pub const fn weight_bytes(self, n: usize) -> usize {
        match self {
            GemvFormat::Bf16 => 2 * n,
            GemvFormat::Mx(f) => f.bytes(n),
        }
    }

    /// Bytes of `n` activation elements.
    pub const fn act_bytes(self, n: usize) -> usize {
        match self {
            GemvFormat::Bf16 => 2 * n,
            GemvFormat::Mx(_) => n,
        }
    }
}

/// Problem shape of one GEMV launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvShape {
    /// Activation rows (decode batch, at most [`GemvTiling::MAX_M`]).
    pub m: usize,
    /// Output features.
    pub n: usize,
    /// Input features (a multiple of 32 for MX formats, of 16 for bf16).
    pub k: usize,
    /// Storage format.
    pub format: GemvFormat,
}

tiling_struct! {
    /// Tiling of `gemv.asc` (vector-unit path; see `plan_cube_gemv` for the cube plan).
    GemvTiling {
        /// Activation rows.
        m: u32 = Scalar,
        /// Output features.
        n: u32 = Scalar,
        /// Input features.
        k: u32 = Scalar,
        /// Format code (0 bf16, 1 MXFP8, 2 MXFP4).
        format: u32 = Scalar,
        /// Blocks launched.
        block_dim: u32 = Scalar,
        /// Output features per block.
        n_per_block: u32 = Scalar,
        /// Output features of the last block.
        last_n: u32 = Scalar,
        /// Output features per tile.
        n_tile: u32 = Scalar,
        /// Input features per k tile (multiple of 64, so FP4 rows are whole 32-byte blocks).
        k_tile: u32 = AlignedCount { elem_bytes: 1 },
        /// k tiles per row.
        k_tiles: u32 = Scalar,
        /// Input features of the last k tile.
        k_tail: u32 = Scalar,
        /// Bytes of one activation tile (m × k_tile).
        x_bytes: u32 = BufferBytes,
        /// Bytes of one activation-scale tile.
        xs_bytes: u32 = BufferBytes,
        /// Bytes of one weight tile (n_tile × k_tile).
        w_bytes: u32 = BufferBytes,
        /// Bytes of one weight-scale tile.
        ws_bytes: u32 = BufferBytes,
        /// Bytes of one output tile (m × n_tile f32).
        y_bytes: u32 = BufferBytes,
        /// Bytes of the f32 work area (dequantised x and W rows, products, accumulators).
        tmp_bytes: u32 = BufferBytes,
        /// Bytes of the decode tables ([`GEMV_LUT_LEN`] f32: E4M3, E8M0, E2M1 values).
        lut_bytes: u32 = BufferBytes,
    }
}

impl GemvTiling {
    /// Largest decode batch one launch takes.
    pub const MAX_M: usize = 16;

    /// Plan a launch.
    pub fn plan(spec: &ChipSpec, s: &GemvShape) -> Result<Self> {
        if s.m == 0 || s.n == 0 || s.k == 0 {
            return shape_err("gemv: empty input");
        }
        if s.m > Self::MAX_M {
            return shape_err(format!("gemv: m = {} exceeds {}", s.m, Self::MAX_M));
        }
        let k_align = match s.format {
            GemvFormat::Bf16 => 16,
            GemvFormat::Mx(_) => MX_BLOCK,
        };
        if !s.k.is_multiple_of(k_align) {
            return shape_err(format!("gemv: k = {} not a multiple of {k_align}", s.k));
        }
        let part = Partition::new(s.n, spec.vector_cores, 8)?;
        let mut candidates = Vec::new();
        for kt in halving(s.k.min(4096), 64) {
            for nt in halving((part.per_block as usize).min(64), 8) {
                candidates.push((kt, nt));
            }
        }
        // Prefer the largest tile area.
        candidates.sort_by_key(|&(kt, nt)| std::cmp::Reverse(kt * nt));
        let mut chosen = None;
        let mut last_err = None;
        for (kt, nt) in candidates {
            let t = Self::with_tiles(s, part, kt, nt)?;
            match t.budget().check(spec, "gemv") {
                Ok(()) => {
                    chosen = Some(t);
                    break;
                }
                Err(e) => last_err = Some(e),
            }
        }
        let t = match chosen {
            Some(t) => t,
            None => {
                return Err(last_err.unwrap_or_else(|| {
                    crate::error::AscendError::Shape("gemv: no tile candidates".into())
                }));
            }
        };
        t.validate()?;
        Ok(t)
    }

    fn with_tiles(s: &GemvShape, part: Partition, kt: usize, nt: usize) -> Result<Self> {
        let k_tiles = s.k.div_ceil(kt);
        let k_tail = s.k - (k_tiles - 1) * kt;
        let scales = kt / MX_BLOCK;
        let (xs, ws) = match s.format {
            GemvFormat::Bf16 => (32, 32),
            // Each row of scales lands padded to whole 32-byte blocks (DataCopyPad).
            GemvFormat::Mx(_) => (s.m * align32(scales), nt * align32(scales)),
        };
        let tmp = align32(s.m * kt * 4) + align32(kt * 4) * 2 + align32(s.m * nt * 4);
        Ok(Self {
            m: u32_of(s.m, "m")?,
            n: u32_of(s.n, "n")?,
            k: u32_of(s.k, "k")?,
            format: s.format.code(),
            block_dim: part.block_dim,
            n_per_block: part.per_block,
            last_n: part.last,
            n_tile: u32_of(nt, "n_tile")?,
            k_tile: u32_of(kt, "k_tile")?,
            k_tiles: u32_of(k_tiles, "k_tiles")?,
            k_tail: u32_of(k_tail, "k_tail")?,
            x_bytes: u32_of(align32(s.format.act_bytes(s.m * kt)), "x_bytes")?,
            xs_bytes: u32_of(xs, "xs_bytes")?,
            w_bytes: u32_of(align32(s.format.weight_bytes(nt * kt)), "w_bytes")?,
            ws_bytes: u32_of(ws, "ws_bytes")?,
            y_bytes: u32_of(align32(s.m * nt * 4), "y_bytes")?,
            tmp_bytes: u32_of(tmp, "tmp_bytes")?,
            lut_bytes: (GEMV_LUT_LEN * 4) as u32,
        })
    }
}

impl KernelTiling for GemvTiling {
    fn budget(&self) -> UbBudget {
        UbBudget::default()
            .queue("inQueueX", BUFFER_NUM, self.x_bytes as usize)
            .queue("inQueueXs", BUFFER_NUM, self.xs_bytes as usize)
            .queue("inQueueW", BUFFER_NUM, self.w_bytes as usize)
            .queue("inQueueWs", BUFFER_NUM, self.ws_bytes as usize)
            .queue("outQueueY", BUFFER_NUM, self.y_bytes as usize)
            .tmp("tmpBuf", self.tmp_bytes as usize)
            .tmp("lutBuf", self.lut_bytes as usize)
    }
}
