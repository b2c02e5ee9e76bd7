//! Emulation of `rmsnorm_quant.asc`.

use half::bf16;

use super::{GmOut, UbArena, check_len, tree_sum};
use crate::chip::ChipSpec;
use crate::error::Result;
use crate::mx::{MX_BLOCK, MxFormat, scale_code, scale_value};
use crate::tiling::{BUFFER_NUM, RmsNormTiling};

const K: &str = "rmsnorm_quant";

/// Outputs of RMSNorm (+ dynamic MXFP8 quantisation).
#[derive(Debug, Clone, PartialEq)]
pub struct RmsNormOutput {
    /// Normalised rows, bf16 (rounded to nearest even).
    pub y: Vec<bf16>,
    /// MXFP8 E4M3 codes of `y` (empty unless quantising).
    pub q: Vec<u8>,
    /// E8M0 scale per 32 elements of `y` (empty unless quantising).
    pub scales: Vec<u8>,
}

/// `y = bf16((x · rstd) · w)`, `rstd = 1/sqrt(Σx²/dim + eps)`, optional MXFP8 of `y`.
pub fn rmsnorm_quant(
    spec: &ChipSpec,
    t: &RmsNormTiling,
    x: &[bf16],
    w: &[f32],
) -> Result<RmsNormOutput> {
    let (rows, dim) = (t.rows as usize, t.dim as usize);
    check_len(K, "x", x.len(), rows * dim)?;
    check_len(K, "weight", w.len(), dim)?;
    let quant = t.quant != 0;
    let mut y = GmOut::<bf16>::new(rows * dim);
    let mut q = GmOut::<u8>::new(if quant { rows * dim } else { 0 });
    let mut s = GmOut::<u8>::new(if quant { rows * dim / MX_BLOCK } else { 0 });
    let tile = t.tile_len as usize;
    for b in 0..t.block_dim {
        let mut ub = UbArena::new(spec, K);
        let qx = ub.init_buffer("inQueueX", BUFFER_NUM, t.x_bytes)?;
        let qw = ub.init_buffer("inQueueW", BUFFER_NUM, t.w_bytes)?;
        let qy = ub.init_buffer("outQueueY", BUFFER_NUM, t.y_bytes)?;
        let qq = ub.init_buffer("outQueueQ", BUFFER_NUM, t.q_bytes)?;
        let qs = ub.init_buffer("outQueueS", BUFFER_NUM, t.s_bytes)?;
        let tmp = ub.init_buffer("tmpBuf", 1, t.tmp_bytes)?;
        let first = (b * t.rows_per_block) as usize;
        let nrows = if b + 1 == t.block_dim {
            t.last_rows
        } else {
            t.rows_per_block
        } as usize;
        for r in first..first + nrows {
            let row = r * dim;
            // Pass 1: sum of squares, tree inside a tile, sequential across tiles.
            let mut acc = 0f32;
            for i in 0..t.tile_num as usize {
                let len = if i + 1 == t.tile_num as usize {
                    t.tail_len as usize
                } else {
                    tile
                };
                let xt = qx.load(x, row + i * tile, len, len != tile)?;
                tmp.fits::<f32>(2, len)?;
                let sq: Vec<f32> = xt.iter().map(|v| v.to_f32() * v.to_f32()).collect();
                acc += tree_sum(&sq);
            }
            let rstd = 1.0 / (acc * t.inv_dim + t.eps).sqrt();
            // Pass 2: scale, weight, round to bf16, quantise.
            for i in 0..t.tile_num as usize {
                let len = if i + 1 == t.tile_num as usize {
                    t.tail_len as usize
                } else {
                    tile
                };
                let pad = len != tile;
                let xt = qx.load(x, row + i * tile, len, pad)?;
                let wt = qw.load(w, i * tile, len, pad)?;
                let yt: Vec<bf16> = xt
                    .iter()
                    .zip(&wt)
                    .map(|(v, wv)| bf16::from_f32((v.to_f32() * rstd) * wv))
                    .collect();
                qy.store(&mut y, row + i * tile, &yt, pad)?;
                if quant {
                    let (codes, sc) = quantize_tile(&yt);
                    qq.store(&mut q, row + i * tile, &codes, pad)?;
                    qs.store(&mut s, (row + i * tile) / MX_BLOCK, &sc, true)?;
                }
            }
        }
    }
    Ok(RmsNormOutput {
        y: y.finish(K)?,
        q: q.finish(K)?,
        scales: s.finish(K)?,
    })
}

/// Per 32-block: amax → E8M0 scale → multiply by 1/scale (exact) → E4M3 round to nearest even.
fn quantize_tile(y: &[bf16]) -> (Vec<u8>, Vec<u8>) {
    let f = MxFormat::Fp8E4M3;
    let mut codes = Vec::with_capacity(y.len());
    let mut scales = Vec::with_capacity(y.len() / MX_BLOCK);
    for blk in y.chunks(MX_BLOCK) {
        let amax = blk.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
        let sc = scale_code(f, amax);
        let inv = 1.0 / scale_value(sc);
        scales.push(sc);
        codes.extend(blk.iter().map(|v| f.encode(v.to_f32() * inv)));
    }
    (codes, scales)
}
