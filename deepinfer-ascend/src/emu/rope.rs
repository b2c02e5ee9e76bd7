//! Emulation of `rope.asc`.

use half::bf16;

use super::{GmOut, UbArena, check_len};
use crate::chip::ChipSpec;
use crate::error::{AscendError, Result};
use crate::tiling::{BUFFER_NUM, RopeTiling};

const K: &str = "rope";

/// Rotate the last `rope_dim` channels of every head vector as interleaved pairs:
/// `(a, b) → (a·c − b·s, a·s + b·c)` with `s` negated when `inverse`; other channels pass through.
///
/// `cos` and `sin` are `[table_len, rope_dim/2]`, `positions` has one entry per row.
pub fn rope(
    spec: &ChipSpec,
    t: &RopeTiling,
    x: &[bf16],
    positions: &[u32],
    cos: &[f32],
    sin: &[f32],
) -> Result<Vec<bf16>> {
    let (rows, heads, d) = (t.rows as usize, t.heads as usize, t.head_dim as usize);
    let half = t.half_rope as usize;
    check_len(K, "x", x.len(), rows * heads * d)?;
    check_len(K, "positions", positions.len(), rows)?;
    check_len(K, "cos", cos.len(), t.table_len as usize * half)?;
    check_len(K, "sin", sin.len(), t.table_len as usize * half)?;
    if let Some(p) = positions.iter().find(|&&p| p >= t.table_len) {
        return Err(AscendError::Shape(format!(
            "rope: position {p} outside the table"
        )));
    }
    let nope = d - 2 * half;
    let mut y = GmOut::<bf16>::new(x.len());
    for b in 0..t.block_dim {
        let mut ub = UbArena::new(spec, K);
        let qx = ub.init_buffer("inQueueX", BUFFER_NUM, t.x_bytes)?;
        let qc = ub.init_buffer("inQueueCos", BUFFER_NUM, t.cs_bytes)?;
        let qs = ub.init_buffer("inQueueSin", BUFFER_NUM, t.cs_bytes)?;
        let qy = ub.init_buffer("outQueueY", BUFFER_NUM, t.x_bytes)?;
        let tmp = ub.init_buffer("tmpBuf", 1, t.tmp_bytes)?;
        let first = (b * t.vecs_per_block) as usize;
        let count = if b + 1 == t.block_dim {
            t.last_vecs
        } else {
            t.vecs_per_block
        } as usize;
        let vt = t.vecs_per_tile as usize;
        let mut v0 = first;
        while v0 < first + count {
            let nv = vt.min(first + count - v0);
            let tile = qx.load_rows(x, (v0..v0 + nv).map(|v| v * d), d, true)?;
            qy.fits::<bf16>(nv, d)?;
            for (j, xv) in tile.iter().enumerate() {
                let v = v0 + j;
                let pos = positions[v / heads] as usize;
                let c = qc.load(cos, pos * half, half, true)?;
                let s = qs.load(sin, pos * half, half, true)?;
                tmp.fits::<f32>(4, half)?;
                let mut out = xv.clone();
                for i in 0..half {
                    let a = xv[nope + 2 * i].to_f32();
                    let bb = xv[nope + 2 * i + 1].to_f32();
                    let si = if t.inverse != 0 { -s[i] } else { s[i] };
                    out[nope + 2 * i] = bf16::from_f32(a * c[i] - bb * si);
                    out[nope + 2 * i + 1] = bf16::from_f32(a * si + bb * c[i]);
                }
                qy.store(&mut y, v * d, &out, true)?;
            }
            v0 += nv;
        }
    }
    y.finish(K)
}
