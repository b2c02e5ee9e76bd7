//! Emulation of `sampling.asc`.

use super::{GmOut, UbArena, check_len};
use crate::chip::ChipSpec;
use crate::error::{AscendError, Result};
use crate::tiling::{BUFFER_NUM, SamplingTiling};

const K: &str = "sampling";

/// Fixed-point weight of one probability: `floor(p · 2^shift)`, 0 for NaN or p ≤ 0, saturating.
pub fn fixed_weight(p: f32, shift: u32) -> u32 {
    if p.is_nan() || p <= 0.0 {
        return 0;
    }
    let v = p * (1u64 << shift) as f32;
    if v >= u32::MAX as f32 {
        u32::MAX
    } else {
        v as u32
    }
}

/// One token per row: the smallest `i` with `Σ_{j≤i} w_j > ⌊u · W / 2³²⌋`, where `w` are the
/// fixed-point weights, `W` their total and `u` the row's 32-bit uniform draw. Integer sums make
/// the pick independent of the tiling. A row with no mass returns `vocab` (no token).
///
/// The device accumulates in int32, so a row's total weight must stay below 2³¹ (probabilities
/// summing to at most 128); larger totals are rejected here as they would overflow there.
pub fn sampling(
    spec: &ChipSpec,
    t: &SamplingTiling,
    probs: &[f32],
    uniforms: &[u32],
) -> Result<Vec<u32>> {
    let (rows, v) = (t.rows as usize, t.vocab as usize);
    check_len(K, "probs", probs.len(), rows * v)?;
    check_len(K, "uniforms", uniforms.len(), rows)?;
    let mut tok = GmOut::<u32>::new(rows);
    let tile = t.tile_len as usize;
    for b in 0..t.block_dim {
        let mut ub = UbArena::new(spec, K);
        let qp = ub.init_buffer("inQueueP", BUFFER_NUM, t.in_bytes)?;
        let qt = ub.init_buffer("outQueueTok", 1, t.out_bytes)?;
        let tmp = ub.init_buffer("tmpBuf", 1, t.tmp_bytes)?;
        let first = (b * t.rows_per_block) as usize;
        let n = if b + 1 == t.block_dim {
            t.last_rows
        } else {
            t.rows_per_block
        } as usize;
        for (r, &u) in uniforms.iter().enumerate().skip(first).take(n) {
            let weights = |i: usize| -> Result<Vec<u32>> {
                let len = if i + 1 == t.tile_num as usize {
                    t.tail_len as usize
                } else {
                    tile
                };
                let p = qp.load(probs, r * v + i * tile, len, len != tile)?;
                tmp.fits::<u32>(2, len)?;
                Ok(p.iter().map(|&x| fixed_weight(x, t.fixed_shift)).collect())
            };
            let mut total: u64 = 0;
            for i in 0..t.tile_num as usize {
                total += weights(i)?.iter().map(|&w| u64::from(w)).sum::<u64>();
                if total >= 1 << 31 {
                    return Err(AscendError::Emulator {
                        kernel: K,
                        detail: format!(
                            "row {r}: fixed-point total overflows int32 (probabilities sum above 128)"
                        ),
                    });
                }
            }
            let mut pick = v as u32;
            if total > 0 {
                let target = (u64::from(u) * total) >> 32;
                let mut run = 0u64;
                'tiles: for i in 0..t.tile_num as usize {
                    let w = weights(i)?;
                    let ts: u64 = w.iter().map(|&x| u64::from(x)).sum();
                    if run + ts <= target {
                        run += ts;
                        continue;
                    }
                    for (j, &x) in w.iter().enumerate() {
                        run += u64::from(x);
                        if run > target {
                            pick = (i * tile + j) as u32;
                            break 'tiles;
                        }
                    }
                }
            }
            qt.store(&mut tok, r, &[pick], true)?;
        }
    }
    tok.finish(K)
}
