//! Emulation of `gemv.asc` (vector-unit path).

use half::bf16;

use super::{GmOut, UbArena, check_len, tree_sum};
use crate::chip::ChipSpec;
use crate::error::{AscendError, Result};
use crate::mx::{MX_BLOCK, MxFormat, scale_value};
use crate::tiling::{BUFFER_NUM, GemvTiling};

const K: &str = "gemv";

/// Rows of f32 values in UB.
type Rows = Vec<Vec<f32>>;

/// Operands of a GEMV, row-major: `x[m, k]`, `w[n, k]`.
#[derive(Debug, Clone, Copy)]
pub enum GemvInputs<'a> {
    /// bf16 activations and weights.
    Bf16 {
        /// Activations, `m × k`.
        x: &'a [bf16],
        /// Weights, `n × k`.
        w: &'a [bf16],
    },
    /// MXFP8 activations and MX weights.
    Mx {
        /// Weight element format.
        format: MxFormat,
        /// Activation E4M3 codes, `m × k`.
        x: &'a [u8],
        /// Activation scales, `m × k/32`.
        x_scales: &'a [u8],
        /// Weight codes, `n × bytes(k)` (FP4: two per byte, even element low).
        w: &'a [u8],
        /// Weight scales, `n × k/32`.
        w_scales: &'a [u8],
    },
}

/// `y[i, j] = Σ_k x[i, k] · w[j, k]` in f32: products of decoded elements, a tree sum per
/// 32-element block, the block scaled by its two E8M0 scales, blocks of a k tile added in
/// order from zero, and the k tiles' sums added to the accumulator in order.
pub fn gemv(spec: &ChipSpec, t: &GemvTiling, inp: GemvInputs<'_>) -> Result<Vec<f32>> {
    let (m, n, k) = (t.m as usize, t.n as usize, t.k as usize);
    let fmt = match inp {
        GemvInputs::Bf16 { x, w } => {
            check_len(K, "x", x.len(), m * k)?;
            check_len(K, "w", w.len(), n * k)?;
            None
        }
        GemvInputs::Mx {
            format,
            x,
            x_scales,
            w,
            w_scales,
        } => {
            check_len(K, "x", x.len(), m * k)?;
            check_len(K, "x_scales", x_scales.len(), m * k / MX_BLOCK)?;
            check_len(K, "w", w.len(), n * format.bytes(k))?;
            check_len(K, "w_scales", w_scales.len(), n * k / MX_BLOCK)?;
            Some(format)
        }
    };
    let want = match fmt {
        None => 0,
        Some(MxFormat::Fp8E4M3) => 1,
        Some(MxFormat::Fp4E2M1) => 2,
    };
    if want != t.format {
        return Err(AscendError::Shape(format!(
            "gemv: tiling format {} vs inputs {want}",
            t.format
        )));
    }
    let mut y = GmOut::<f32>::new(m * n);
    let (kt, nt) = (t.k_tile as usize, t.n_tile as usize);
    let sb = k / MX_BLOCK;
    for b in 0..t.block_dim {
        let mut ub = UbArena::new(spec, K);
        let qx = ub.init_buffer("inQueueX", BUFFER_NUM, t.x_bytes)?;
        let qxs = ub.init_buffer("inQueueXs", BUFFER_NUM, t.xs_bytes)?;
        let qw = ub.init_buffer("inQueueW", BUFFER_NUM, t.w_bytes)?;
        let qws = ub.init_buffer("inQueueWs", BUFFER_NUM, t.ws_bytes)?;
        let qy = ub.init_buffer("outQueueY", BUFFER_NUM, t.y_bytes)?;
        let tmp = ub.init_buffer("tmpBuf", 1, t.tmp_bytes)?;
        let lut = ub.init_buffer("lutBuf", 1, t.lut_bytes)?;
        if fmt.is_some() {
            lut.fits::<f32>(1, crate::tiling::GEMV_LUT_LEN)?;
        }
        let n0 = (b * t.n_per_block) as usize;
        let nn = if b + 1 == t.block_dim {
            t.last_n
        } else {
            t.n_per_block
        } as usize;
        let mut j0 = n0;
        while j0 < n0 + nn {
            let nc = nt.min(n0 + nn - j0);
            let mut acc = vec![0f32; m * nc];
            tmp.fits::<f32>(1, m * nt)?;
            for kk in 0..t.k_tiles as usize {
                let last = kk + 1 == t.k_tiles as usize;
                let kl = if last { t.k_tail as usize } else { kt };
                let pad = kl != kt;
                let k0 = kk * kt;
                // Dequantised activation rows and weight rows of this tile, f32.
                let (xf, wf, xsc, wsc): (Rows, Rows, Rows, Rows) = match inp {
                    GemvInputs::Bf16 { x, w } => {
                        let xr = qx.load_rows(x, (0..m).map(|i| i * k + k0), kl, pad)?;
                        let wr = qw.load_rows(w, (j0..j0 + nc).map(|j| j * k + k0), kl, pad)?;
                        let cv = |r: Vec<Vec<bf16>>| -> Vec<Vec<f32>> {
                            r.into_iter()
                                .map(|v| v.iter().map(|e| e.to_f32()).collect())
                                .collect()
                        };
                        (cv(xr), cv(wr), Vec::new(), Vec::new())
                    }
                    GemvInputs::Mx {
                        format,
                        x,
                        x_scales,
                        w,
                        w_scales,
                    } => {
                        let xr = qx.load_rows(x, (0..m).map(|i| i * k + k0), kl, pad)?;
                        let wb = format.bytes(kl);
                        let wrow = format.bytes(k);
                        let wr = qw.load_rows(
                            w,
                            (j0..j0 + nc).map(|j| j * wrow + format.bytes(k0)),
                            wb,
                            pad,
                        )?;
                        let nsb = kl / MX_BLOCK;
                        let xs = qxs.load_rows(
                            x_scales,
                            (0..m).map(|i| i * sb + k0 / MX_BLOCK),
                            nsb,
                            true,
                        )?;
                        let ws = qws.load_rows(
                            w_scales,
                            (j0..j0 + nc).map(|j| j * sb + k0 / MX_BLOCK),
                            nsb,
                            true,
                        )?;
                        let e8 = MxFormat::Fp8E4M3;
                        let xf = xr
                            .iter()
                            .map(|r| r.iter().map(|&c| e8.decode(c)).collect())
                            .collect();
                        let wf = wr
                            .iter()
                            .map(|r| {
                                (0..kl)
                                    .map(|i| format.decode(nibble(format, r, i)))
                                    .collect()
                            })
                            .collect();
                        let sv = |r: Vec<Vec<u8>>| -> Vec<Vec<f32>> {
                            r.into_iter()
                                .map(|v| v.into_iter().map(scale_value).collect())
                                .collect()
                        };
                        (xf, wf, sv(xs), sv(ws))
                    }
                };
                tmp.fits::<f32>(2 + m, kl)?;
                for (i, xrow) in xf.iter().enumerate() {
                    for (jj, wrow) in wf.iter().enumerate() {
                        // As the source: a k tile's blocks sum from zero, then join the accumulator.
                        let mut a = 0f32;
                        for (blk, (xb, wbk)) in
                            xrow.chunks(MX_BLOCK).zip(wrow.chunks(MX_BLOCK)).enumerate()
                        {
                            let prod: Vec<f32> = xb.iter().zip(wbk).map(|(p, q)| p * q).collect();
                            let mut part = tree_sum(&prod);
                            if !xsc.is_empty() {
                                part = part * xsc[i][blk] * wsc[jj][blk];
                            }
                            a += part;
                        }
                        acc[i * nc + jj] += a;
                    }
                }
            }
            for i in 0..m {
                qy.store(&mut y, i * n + j0, &acc[i * nc..(i + 1) * nc], true)?;
            }
            j0 += nc;
        }
    }
    y.finish(K)
}

/// Element `i` of a packed row.
fn nibble(f: MxFormat, row: &[u8], i: usize) -> u8 {
    match f {
        MxFormat::Fp8E4M3 => row[i],
        MxFormat::Fp4E2M1 => (row[i / 2] >> ((i & 1) * 4)) & 0xf,
    }
}
