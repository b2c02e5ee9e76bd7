//! Emulation of `hc_mix.asc`.

use half::bf16;

use super::{GmOut, UbArena, check_len};
use crate::chip::ChipSpec;
use crate::error::Result;
use crate::tiling::{BUFFER_NUM, HcMixTiling};

const K: &str = "hc_mix";

/// `X'_k = bf16(post_k · out + Σ_j C[j,k] · X_j)` per token, f32 math, j in increasing order.
///
/// `x` is `[rows, streams, dim]`, `out` `[rows, dim]`, `post` `[rows, streams]`, `comb`
/// `[rows, streams, streams]` row-major (`C[j,k]` at `j·streams + k`).
pub fn hc_mix(
    spec: &ChipSpec,
    t: &HcMixTiling,
    x: &[bf16],
    out: &[bf16],
    post: &[f32],
    comb: &[f32],
) -> Result<Vec<bf16>> {
    let (rows, ns, d) = (t.rows as usize, t.streams as usize, t.dim as usize);
    check_len(K, "x", x.len(), rows * ns * d)?;
    check_len(K, "out", out.len(), rows * d)?;
    check_len(K, "post", post.len(), rows * ns)?;
    check_len(K, "comb", comb.len(), rows * ns * ns)?;
    let mut y = GmOut::<bf16>::new(x.len());
    let tc = t.tile_cols as usize;
    for b in 0..t.block_dim {
        let mut ub = UbArena::new(spec, K);
        let qx = ub.init_buffer("inQueueX", BUFFER_NUM, t.x_bytes)?;
        let qo = ub.init_buffer("inQueueO", BUFFER_NUM, t.o_bytes)?;
        let qy = ub.init_buffer("outQueueY", BUFFER_NUM, t.x_bytes)?;
        let tmp = ub.init_buffer("tmpBuf", 1, t.tmp_bytes)?;
        let c0 = (b * t.cols_per_block) as usize;
        let nc = if b + 1 == t.block_dim {
            t.last_cols
        } else {
            t.cols_per_block
        } as usize;
        for r in 0..rows {
            // Scalars read straight from global memory.
            let p = &post[r * ns..(r + 1) * ns];
            let cm = &comb[r * ns * ns..(r + 1) * ns * ns];
            let mut c = c0;
            while c < c0 + nc {
                let cl = tc.min(c0 + nc - c);
                let pad = cl != tc;
                let xs = qx.load_rows(x, (0..ns).map(|j| (r * ns + j) * d + c), cl, pad)?;
                let o = qo.load(out, r * d + c, cl, pad)?;
                tmp.fits::<f32>(2, cl)?;
                qy.fits::<bf16>(ns, cl)?;
                for kk in 0..ns {
                    let mut acc: Vec<f32> = o.iter().map(|v| p[kk] * v.to_f32()).collect();
                    for (j, xj) in xs.iter().enumerate() {
                        let cjk = cm[j * ns + kk];
                        for (a, v) in acc.iter_mut().zip(xj) {
                            *a += cjk * v.to_f32();
                        }
                    }
                    let yt: Vec<bf16> = acc.iter().map(|&v| bf16::from_f32(v)).collect();
                    qy.store(&mut y, (r * ns + kk) * d + c, &yt, pad)?;
                }
                c += cl;
            }
        }
    }
    y.finish(K)
}
