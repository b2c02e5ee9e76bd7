//! L1 / L0 plan for a cube-unit GEMM of decode shapes (`m` padded to the 16-row fractal).
//!
//! The vector-path GEMV (`gemv.asc`) is what the emulator runs; this plan is the budget a cube
//! kernel must respect on each chip: double-buffered L0A/L0B tiles, a double-buffered L0C
//! accumulator and L1 staging, with MX scale bytes counted next to their operands on the 950.

use crate::chip::ChipSpec;
use crate::error::{AscendError, Result, shape_err};
use crate::mx::MX_BLOCK;
use crate::tiling::{GemvFormat, align_up};

/// A cube GEMM tile plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CubeGemvPlan {
    /// Rows per fractal tile (16).
    pub base_m: usize,
    /// Output columns per L0C tile.
    pub base_n: usize,
    /// Reduction depth per L0A/L0B tile.
    pub base_k: usize,
    /// Bytes used in L0A (both buffers).
    pub l0a_used: usize,
    /// Bytes used in L0B (both buffers).
    pub l0b_used: usize,
    /// Bytes used in L0C (both buffers, f32).
    pub l0c_used: usize,
    /// Bytes used in L1 (both buffers of A and B with scales).
    pub l1_used: usize,
}

/// Plan a cube GEMM for `m ≤ 16` rows, `n` outputs, `k` depth. MX formats need a 950
/// (`native_mx`); on the 910B they must go through the vector path.
pub fn plan_cube_gemv(
    spec: &ChipSpec,
    m: usize,
    n: usize,
    k: usize,
    f: GemvFormat,
) -> Result<CubeGemvPlan> {
    if m == 0 || n == 0 || k == 0 || m > 16 {
        return shape_err("cube gemv: need 1 <= m <= 16 and n, k > 0");
    }
    if matches!(f, GemvFormat::Mx(_)) && !spec.native_mx {
        return Err(AscendError::Unsupported(format!(
            "{:?} cube unit has no MX operands; use the vector-path GEMV",
            spec.chip
        )));
    }
    let base_m = 16;
    // bytes per element ×2 so FP4 (half a byte) stays integral.
    let (a2, b2, scale) = match f {
        GemvFormat::Bf16 => (4, 4, false),
        GemvFormat::Mx(mf) => (2, mf.bytes(2), true),
    };
    let bytes = |elems: usize, twice: usize| elems * twice / 2;
    let mut best: Option<CubeGemvPlan> = None;
    for base_k in [512usize, 256, 128, 64, 32] {
        for base_n in [256usize, 128, 64, 32, 16] {
            let base_k = base_k.min(align_up(k, MX_BLOCK));
            let base_n = base_n.min(align_up(n, 16));
            let sc = |rows: usize| if scale { rows * base_k / MX_BLOCK } else { 0 };
            let l0a = 2 * (bytes(base_m * base_k, a2) + sc(base_m));
            let l0b = 2 * (bytes(base_k * base_n, b2) + sc(base_n));
            let l0c = 2 * base_m * base_n * 4;
            let l1 = 2 * l0a + 2 * l0b;
            if l0a <= spec.l0a_bytes
                && l0b <= spec.l0b_bytes
                && l0c <= spec.l0c_bytes
                && l1 <= spec.l1_bytes
            {
                let p = CubeGemvPlan {
                    base_m,
                    base_n,
                    base_k,
                    l0a_used: l0a,
                    l0b_used: l0b,
                    l0c_used: l0c,
                    l1_used: l1,
                };
                if best.is_none_or(|b| base_n * base_k > b.base_n * b.base_k) {
                    best = Some(p);
                }
            }
        }
    }
    best.ok_or_else(|| AscendError::Budget {
        buffer: "L0",
        need: 0,
        have: spec.l0b_bytes,
        what: format!("cube gemv {m}x{n}x{k}"),
    })
}
