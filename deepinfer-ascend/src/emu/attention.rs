//! Emulation of `attention.asc`.

use half::bf16;

use super::{GmOut, UbArena, check_len, tree_sum};
use crate::chip::ChipSpec;
use crate::error::{AscendError, Result};
use crate::tiling::{AttentionTiling, BUFFER_NUM};

const K: &str = "attention";

/// Operands of one decode-attention launch (one query token).
#[derive(Debug, Clone, Copy)]
pub struct AttentionInputs<'a> {
    /// Queries, `heads × head_dim` bf16 (RoPE already applied).
    pub q: &'a [bf16],
    /// Window K=V rows, `n_window × head_dim`.
    pub window: &'a [bf16],
    /// Compressed cache, `comp_rows × head_dim`.
    pub comp: &'a [bf16],
    /// Selected compressed rows (visible to the query), `n_comp` indices into `comp`.
    pub comp_idx: &'a [u32],
    /// Per-head sink logits.
    pub sinks: &'a [f32],
}

/// `o_h = Σ_j softmax_j(ℓ) v_j` over window rows then selected compressed rows, where the
/// softmax denominator also holds `exp(sink_h)`. Online softmax over key tiles: running max,
/// rescale by `exp(m_old − m_new)`, tree sums inside a tile, keys added in order.
pub fn attention(
    spec: &ChipSpec,
    t: &AttentionTiling,
    a: AttentionInputs<'_>,
) -> Result<Vec<bf16>> {
    let (h, d) = (t.heads as usize, t.head_dim as usize);
    let (nw, nc) = (t.n_window as usize, t.n_comp as usize);
    check_len(K, "q", a.q.len(), h * d)?;
    check_len(K, "window", a.window.len(), nw * d)?;
    check_len(K, "comp", a.comp.len(), t.comp_rows as usize * d)?;
    check_len(K, "comp_idx", a.comp_idx.len(), nc)?;
    check_len(K, "sinks", a.sinks.len(), h)?;
    if let Some(i) = a.comp_idx.iter().find(|&&i| i >= t.comp_rows) {
        return Err(AscendError::Shape(format!(
            "attention: compressed index {i} out of range"
        )));
    }
    let mut o = GmOut::<bf16>::new(h * d);
    let kt = t.keys_per_tile as usize;
    let keys = nw + nc;
    for b in 0..t.block_dim {
        let mut ub = UbArena::new(spec, K);
        let qq = ub.init_buffer("inQueueQ", 1, t.q_bytes)?;
        let qk = ub.init_buffer("inQueueK", BUFFER_NUM, t.k_bytes)?;
        let qo = ub.init_buffer("outQueueO", 1, t.o_bytes)?;
        let accb = ub.init_buffer("accBuf", 1, t.acc_bytes)?;
        let tmp = ub.init_buffer("tmpBuf", 1, t.tmp_bytes)?;
        let h0 = (b * t.heads_per_block) as usize;
        let hb = if b + 1 == t.block_dim {
            t.last_heads
        } else {
            t.heads_per_block
        } as usize;
        let qrows = qq.load_rows(a.q, (h0..h0 + hb).map(|i| i * d), d, false)?;
        let qf: Vec<Vec<f32>> = qrows
            .iter()
            .map(|r| r.iter().map(|v| v.to_f32()).collect())
            .collect();
        accb.fits::<f32>(hb, d)?;
        tmp.fits::<u8>(
            1,
            AttentionTiling::tmp_layout(t.heads_per_block as usize, kt, d),
        )?;
        let mut acc = vec![vec![0f32; d]; hb];
        let mut mx = vec![f32::NEG_INFINITY; hb];
        let mut sum = vec![0f32; hb];
        let mut j0 = 0;
        while j0 < keys {
            let n = kt.min(keys - j0);
            // Gather: window rows, then compressed rows by index (one row copy each).
            let mut krows = Vec::with_capacity(n);
            for j in j0..j0 + n {
                let row = if j < nw {
                    qk.load(a.window, j * d, d, false)?
                } else {
                    qk.load(a.comp, a.comp_idx[j - nw] as usize * d, d, false)?
                };
                krows.push(row.iter().map(|v| v.to_f32()).collect::<Vec<f32>>());
            }
            qk.fits::<bf16>(n, d)?;
            for hh in 0..hb {
                let s: Vec<f32> = krows
                    .iter()
                    .map(|kr| {
                        let prod: Vec<f32> = qf[hh].iter().zip(kr).map(|(x, y)| x * y).collect();
                        tree_sum(&prod) * t.scale
                    })
                    .collect();
                let tile_max = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let m_new = mx[hh].max(tile_max);
                let alpha = (mx[hh] - m_new).exp();
                let p: Vec<f32> = s.iter().map(|v| (v - m_new).exp()).collect();
                sum[hh] = sum[hh] * alpha + tree_sum(&p);
                for v in acc[hh].iter_mut() {
                    *v *= alpha;
                }
                for (pj, kr) in p.iter().zip(&krows) {
                    for (v, kv) in acc[hh].iter_mut().zip(kr) {
                        *v += pj * kv;
                    }
                }
                mx[hh] = m_new;
            }
            j0 += n;
        }
        let mut out_rows = Vec::with_capacity(hb);
        for hh in 0..hb {
            let denom = sum[hh] + (a.sinks[h0 + hh] - mx[hh]).exp();
            let r = 1.0 / denom;
            out_rows.push(
                acc[hh]
                    .iter()
                    .map(|v| bf16::from_f32(v * r))
                    .collect::<Vec<bf16>>(),
            );
        }
        qo.fits::<bf16>(hb, d)?;
        for (hh, row) in out_rows.iter().enumerate() {
            qo.store(&mut o, (h0 + hh) * d, row, false)?;
        }
    }
    o.finish(K)
}
