//! Emulation of `router.asc`.

use super::{GmOut, UbArena, check_len, tree_sum};
use crate::chip::ChipSpec;
use crate::error::Result;
use crate::tiling::{BUFFER_NUM, RouterTiling};

const K: &str = "router";

/// Softplus switches to the identity above this input (as PyTorch's default threshold).
pub const SOFTPLUS_THRESHOLD: f32 = 20.0;

/// Chosen experts and their weights, `rows × top_k` each, in selection order.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterOutput {
    /// Expert ids.
    pub ids: Vec<u32>,
    /// Routing weights.
    pub weights: Vec<f32>,
}

/// Scores, then top-k of `score + bias` (ties: lowest expert id), then weights
/// `score / (Σ chosen + 1e-20) · route_scale` (or `score · route_scale` without renorm).
pub fn router(
    spec: &ChipSpec,
    t: &RouterTiling,
    logits: &[f32],
    bias: &[f32],
) -> Result<RouterOutput> {
    let (rows, e, k) = (t.rows as usize, t.experts as usize, t.top_k as usize);
    check_len(K, "logits", logits.len(), rows * e)?;
    check_len(K, "bias", bias.len(), e)?;
    let mut ids = GmOut::<u32>::new(rows * k);
    let mut wts = GmOut::<f32>::new(rows * k);
    for b in 0..t.block_dim {
        let mut ub = UbArena::new(spec, K);
        let ql = ub.init_buffer("inQueueLogits", BUFFER_NUM, t.in_bytes)?;
        let qb = ub.init_buffer("inQueueBias", 1, t.bias_bytes)?;
        let qi = ub.init_buffer("outQueueIds", BUFFER_NUM, t.ids_bytes)?;
        let qw = ub.init_buffer("outQueueWts", BUFFER_NUM, t.wts_bytes)?;
        let tmp = ub.init_buffer("tmpBuf", 1, t.tmp_bytes)?;
        let bias_ub = qb.load(bias, 0, e, true)?;
        let first = (b * t.rows_per_block) as usize;
        let n = if b + 1 == t.block_dim {
            t.last_rows
        } else {
            t.rows_per_block
        } as usize;
        for r in first..first + n {
            let l = ql.load(logits, r * e, e, true)?;
            tmp.fits::<f32>(3, t.experts_pad as usize)?;
            let z: Vec<f32> = l.iter().map(|v| v * t.inv_temp).collect();
            let s: Vec<f32> = if t.score_func == 0 {
                let m = z.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
                let ex: Vec<f32> = z.iter().map(|v| (v - m).exp()).collect();
                let inv = 1.0 / tree_sum(&ex);
                ex.iter().map(|v| v * inv).collect()
            } else {
                z.iter()
                    .map(|&v| {
                        let sp = if v > SOFTPLUS_THRESHOLD {
                            v
                        } else {
                            (1.0 + v.exp()).ln()
                        };
                        sp.sqrt()
                    })
                    .collect()
            };
            let mut keys: Vec<f32> = s.iter().zip(&bias_ub).map(|(a, c)| a + c).collect();
            let mut sel = Vec::with_capacity(k);
            for _ in 0..k {
                // First maximum wins; NaN keys are never chosen over numbers.
                let mut best = 0usize;
                for (i, &v) in keys.iter().enumerate() {
                    if v > keys[best] || (keys[best].is_nan() && !v.is_nan()) {
                        best = i;
                    }
                }
                sel.push(best);
                keys[best] = f32::NEG_INFINITY;
            }
            let mut w: Vec<f32> = sel.iter().map(|&i| s[i]).collect();
            if t.renorm != 0 {
                let denom = w.iter().fold(0f32, |a, v| a + v) + 1e-20;
                for v in &mut w {
                    *v /= denom;
                }
            }
            for v in &mut w {
                *v *= t.route_scale;
            }
            let id: Vec<u32> = sel.iter().map(|&i| i as u32).collect();
            qi.store(&mut ids, r * k, &id, true)?;
            qw.store(&mut wts, r * k, &w, true)?;
        }
    }
    Ok(RouterOutput {
        ids: ids.finish(K)?,
        weights: wts.finish(K)?,
    })
}
