//! Attention of one layer over a batch of sequence segments: window K=V, compressed entries
//! (V4.1 shared from KV sources; V4 CSA/HCA per layer), lightning indexer with candidate
//! blocks, sink, and the grouped output projection.

use super::forward::Ctx;
use super::global::GlobalPart;
use super::state::{CompressorState, SeqState};
use super::{Model, ModelError};
use crate::config::{AttnKind, ModelKind, last_at_or_below};
use crate::model::weights::{AttnW, CompressorW};
use deepinfer_kernels::{Backend, FakeQuant, TensorInfo};

type R<T> = Result<T, ModelError>;

/// Per-row selected compressed entries (entry indices into the layer's entry tensor).
pub(crate) type Selection = Vec<Vec<Vec<i64>>>;

impl<B: Backend> Model<B> {
    /// Attention for layer `l`; `x` is `[S, D]` (normed collapsed streams).
    pub(crate) fn attention(
        &self,
        ctx: &mut Ctx<'_, '_, '_, B::Tensor>,
        x: &B::Tensor,
        l: usize,
    ) -> R<B::Tensor> {
        let c = &self.cfg;
        let be = &self.be;
        let aw: &AttnW<B::Tensor> = &self.w.layers[l].attn;
        let (h, d) = (c.num_heads, c.head_dim);
        let s_total = x.shape()[0];
        let eps = c.rms_norm_eps as f32;
        let ratio = c.compress_ratios[l];
        let f = if ratio > 0 {
            &self.f_comp
        } else {
            &self.f_main
        };
        let sp = super::prof::span("attn.qkv");
        let qr = be.rms_norm(&self.mm(x, &aw.wq_a)?, Some(&aw.q_norm), eps)?;
        let mut q = be.reshape(&self.mm(&qr, &aw.wq_b)?, &[s_total, h, d])?;
        if c.kind == ModelKind::V4 {
            q = be.rms_norm(&q, None, eps)?;
        }
        let q = be.rope(&q, &ctx.pos, f, false)?;
        let kv = be.rope(
            &be.rms_norm(&self.mm(x, &aw.wkv)?, Some(&aw.kv_norm), eps)?,
            &ctx.pos,
            f,
            false,
        )?;
        let kv = self.cache_quant(kv, FakeQuant::Fp8 { block: 32 })?;
        drop(sp);
        let sp = super::prof::span("attn.compress+index");

        // Compressed entries: which layer's entries, and which of them each row reads.
        let (entry_layer, selection): (Option<usize>, Option<Selection>) = match c.attn_kinds[l] {
            AttnKind::Sliding => (None, None),
            AttnKind::Shared => {
                let src = last_at_or_below(&c.kv_source_layers, l)
                    .ok_or_else(|| ModelError::Input(format!("layer {l} has no KV source")))?;
                if src == l && !ctx.replay && ctx.skip_compress != Some(l) {
                    self.compress_v41(ctx, x, l)?;
                }
                if c.index_source_layers.contains(&l) {
                    let sel = self.indexer_v41(ctx, x, &qr, l)?;
                    ctx.shared_topk = Some(sel);
                }
                (Some(src), ctx.shared_topk.clone())
            }
            AttnKind::Csa => {
                let cw = aw
                    .compressor
                    .as_ref()
                    .ok_or_else(|| missing(l, "compressor"))?;
                let iw = aw.indexer.as_ref().ok_or_else(|| missing(l, "indexer"))?;
                let icw = iw
                    .compressor
                    .as_ref()
                    .ok_or_else(|| missing(l, "indexer compressor"))?;
                if !ctx.replay {
                    self.compress_v4(ctx, x, l, cw, false)?;
                    self.compress_v4(ctx, x, l, icw, true)?;
                }
                (Some(l), Some(self.indexer_v4(ctx, x, &qr, l)?))
            }
            AttnKind::Hca => {
                let cw = aw
                    .compressor
                    .as_ref()
                    .ok_or_else(|| missing(l, "compressor"))?;
                if !ctx.replay {
                    self.compress_v4(ctx, x, l, cw, false)?;
                }
                // every visible entry
                let mut sel = Vec::with_capacity(ctx.segs.len());
                for (si, seg) in ctx.segs.iter().enumerate() {
                    let t = ctx.states[si].global.count(GlobalPart::Entries, l);
                    sel.push(
                        (0..seg.len)
                            .map(|r| {
                                let vis = ((seg.pos0 + r + 1) / ratio).min(t);
                                (0..vis as i64).collect()
                            })
                            .collect(),
                    );
                }
                (Some(l), Some(sel))
            }
        };

        drop(sp);
        let sp = super::prof::span("attn.keys");
        // Key set: per segment [window rows | new rows | entries], all segments concatenated.
        let wn = c.sliding_window;
        let mut parts: Vec<B::Tensor> = Vec::new();
        let mut idx_rows: Vec<Vec<i64>> = Vec::with_capacity(s_total);
        let mut base = 0usize;
        for (si, seg) in ctx.segs.iter().enumerate() {
            let st: &mut SeqState<B::Tensor> = ctx.states[si];
            let kv_seg = be.narrow(&kv, 0, seg.off, seg.len)?;
            let prev_rows = st.window[l].as_ref().map(|t| t.shape()[0]).unwrap_or(0);
            let win_all = match st.window[l].take() {
                Some(p) => be.concat(&[&p, &kv_seg], 0)?,
                None => kv_seg.clone(),
            };
            let n_all = prev_rows + seg.len;
            let keep = (wn - 1).min(n_all);
            st.window[l] = if keep > 0 {
                Some(be.narrow(&win_all, 0, n_all - keep, keep)?)
            } else {
                None
            };
            parts.push(win_all);
            let ent_base = base + n_all;
            let mut n_ent = 0;
            let ent = match entry_layer {
                Some(el) => st.global.gather(be, GlobalPart::Entries, el)?,
                None => None,
            };
            if let Some(e) = ent {
                n_ent = e.shape()[0];
                parts.push(e);
            }
            // window position of key row k: seg.pos0 - prev_rows + k
            let first_pos = seg.pos0 - prev_rows;
            for r in 0..seg.len {
                let p = seg.pos0 + r;
                let lo = (p + 1).saturating_sub(wn).max(first_pos);
                let mut row: Vec<i64> = (lo..=p).map(|kp| (base + kp - first_pos) as i64).collect();
                if let Some(sel) = selection.as_ref() {
                    for &w in &sel[si][r] {
                        if (w as usize) < n_ent {
                            row.push((ent_base + w as usize) as i64);
                        }
                    }
                }
                idx_rows.push(row);
            }
            base = ent_base + n_ent;
        }
        let kmax = idx_rows.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let mut idx = vec![-1i64; s_total * kmax];
        for (r, row) in idx_rows.iter().enumerate() {
            idx[r * kmax..r * kmax + row.len()].copy_from_slice(row);
        }
        let idx = be.upload_i64(&idx, &[s_total, kmax])?;
        let refs: Vec<&B::Tensor> = parts.iter().collect();
        let keys = be.concat(&refs, 0)?;
        drop(sp);
        let sp = super::prof::span("attn.core");
        let o = be.sparse_attention(&q, &keys, &idx, &aw.sink, 1.0 / (d as f32).sqrt())?;
        let o = be.rope(&o, &ctx.pos, f, true)?;
        drop(sp);
        let _sp = super::prof::span("attn.out");
        let g = c.o_groups;
        let z = be.grouped_matmul(&be.reshape(&o, &[s_total, g, h * d / g])?, &aw.wo_a)?;
        let out = self.mm(&be.reshape(&z, &[s_total, g * c.o_lora_rank])?, &aw.wo_b)?;
        Ok(out)
    }

    /// V4.1 KV source: pool this chunk's complete groups into entries and indexer keys.
    pub(crate) fn compress_v41(
        &self,
        ctx: &mut Ctx<'_, '_, '_, B::Tensor>,
        x: &B::Tensor,
        l: usize,
    ) -> R<()> {
        let c = &self.cfg;
        let be = &self.be;
        let aw = &self.w.layers[l].attn;
        let cw = aw
            .compressor
            .as_ref()
            .ok_or_else(|| missing(l, "compressor"))?;
        let (wk, k_norm) = aw
            .indexer
            .as_ref()
            .and_then(|i| i.wk.as_ref())
            .ok_or_else(|| missing(l, "indexer.wk"))?;
        let ratio = c.compress_ratios[l];
        let eps = c.rms_norm_eps as f32;
        let a_all = self.mm(x, &cw.wkv)?;
        let z_all = match &cw.wgate {
            Some(wg) if ratio > 1 => Some(self.mm(x, wg)?),
            _ => None,
        };
        for (si, seg) in ctx.segs.iter().enumerate() {
            let st: &mut SeqState<B::Tensor> = ctx.states[si];
            let a = be.narrow(&a_all, 0, seg.off, seg.len)?;
            let (lat, gpos): (B::Tensor, Vec<i64>) = if ratio == 1 {
                (a, (0..seg.len).map(|r| (seg.pos0 + r) as i64).collect())
            } else {
                let z = be.narrow(
                    z_all
                        .as_ref()
                        .ok_or_else(|| missing(l, "compressor.wgate"))?,
                    0,
                    seg.off,
                    seg.len,
                )?;
                let cs: &mut CompressorState<B::Tensor> = &mut st.compressor[l];
                let (a, z, n_pend) = match cs.pending.take() {
                    Some((pa, pz)) => {
                        let n = pa.shape()[0];
                        (be.concat(&[&pa, &a], 0)?, be.concat(&[&pz, &z], 0)?, n)
                    }
                    None => (a, z, 0),
                };
                let rows = a.shape()[0];
                let full = rows - rows % ratio;
                if full < rows {
                    cs.pending = Some((
                        be.narrow(&a, 0, full, rows - full)?,
                        be.narrow(&z, 0, full, rows - full)?,
                    ));
                }
                if full == 0 {
                    continue;
                }
                let first = (seg.pos0 - n_pend) / ratio;
                let pooled = be.compress_pool(
                    &be.narrow(&a, 0, 0, full)?,
                    &be.narrow(&z, 0, 0, full)?,
                    ratio,
                    false,
                    false,
                )?;
                (
                    pooled,
                    (0..full / ratio)
                        .map(|i| ((first + i) * ratio) as i64)
                        .collect(),
                )
            };
            let lat = be.rms_norm(&lat, Some(&cw.norm), eps)?;
            let ent = be.rope(&lat, &gpos, &self.f_comp, false)?;
            let key = be.rope(
                &be.rms_norm(&self.mm(&lat, wk)?, Some(k_norm), eps)?,
                &gpos,
                &self.f_comp,
                false,
            )?;
            let ent = self.cache_quant(ent, FakeQuant::Nvfp4 { block: 16 })?;
            let key = self.cache_quant(key, FakeQuant::Mxfp4 { block: 32 })?;
            st.global.append(be, GlobalPart::Entries, l, ent)?;
            st.global.append(be, GlobalPart::IndexKeys, l, key)?;
        }
        Ok(())
    }

    /// V4 compressor (main or the indexer's own), CSA with overlap or HCA without.
    fn compress_v4(
        &self,
        ctx: &mut Ctx<'_, '_, '_, B::Tensor>,
        x: &B::Tensor,
        l: usize,
        cw: &CompressorW<B::Tensor>,
        for_indexer: bool,
    ) -> R<()> {
        let _sp = super::prof::span("attn.compress");
        let c = &self.cfg;
        let be = &self.be;
        let ratio = c.compress_ratios[l];
        let overlap = c.attn_kinds[l] == AttnKind::Csa;
        let eps = c.rms_norm_eps as f32;
        let a_all = self.mm(x, &cw.wkv)?;
        let wg = cw
            .wgate
            .as_ref()
            .ok_or_else(|| missing(l, "compressor.wgate"))?;
        let ape = cw
            .ape
            .as_ref()
            .ok_or_else(|| missing(l, "compressor.ape"))?;
        let z_all = self.mm(x, wg)?;
        let slots: Vec<i64> = ctx.pos.iter().map(|&p| p % ratio as i64).collect();
        let slots = be.upload_i64(&slots, &[slots.len()])?;
        let z_all = be.add(&z_all, &be.gather_rows(ape, &slots)?)?;
        for (si, seg) in ctx.segs.iter().enumerate() {
            let st: &mut SeqState<B::Tensor> = ctx.states[si];
            let a = be.narrow(&a_all, 0, seg.off, seg.len)?;
            let z = be.narrow(&z_all, 0, seg.off, seg.len)?;
            let cs = if for_indexer {
                &mut st.index_compressor[l]
            } else {
                &mut st.compressor[l]
            };
            let (a, z) = match cs.pending.take() {
                Some((pa, pz)) => (be.concat(&[&pa, &a], 0)?, be.concat(&[&pz, &z], 0)?),
                None => (a, z),
            };
            let rows = a.shape()[0];
            let full = rows - rows % ratio;
            if full < rows {
                cs.pending = Some((
                    be.narrow(&a, 0, full, rows - full)?,
                    be.narrow(&z, 0, full, rows - full)?,
                ));
            }
            if full == 0 {
                continue;
            }
            let (fa, fz) = (be.narrow(&a, 0, 0, full)?, be.narrow(&z, 0, 0, full)?);
            let new_prev = if overlap {
                Some((
                    be.narrow(&fa, 0, full - ratio, ratio)?,
                    be.narrow(&fz, 0, full - ratio, ratio)?,
                ))
            } else {
                None
            };
            let pooled = match (overlap, cs.previous.take()) {
                (true, Some((pa, pz))) => be.compress_pool(
                    &be.concat(&[&pa, &fa], 0)?,
                    &be.concat(&[&pz, &fz], 0)?,
                    ratio,
                    true,
                    true,
                )?,
                (true, None) => be.compress_pool(&fa, &fz, ratio, true, false)?,
                (false, _) => be.compress_pool(&fa, &fz, ratio, false, false)?,
            };
            cs.previous = new_prev;
            let part = if for_indexer {
                GlobalPart::IndexKeys
            } else {
                GlobalPart::Entries
            };
            let first = st.global.count(part, l);
            let gpos: Vec<i64> = (0..full / ratio)
                .map(|i| ((first + i) * ratio) as i64)
                .collect();
            let ent = be.rope(
                &be.rms_norm(&pooled, Some(&cw.norm), eps)?,
                &gpos,
                &self.f_comp,
                false,
            )?;
            let fq = if for_indexer {
                FakeQuant::Mxfp4 { block: 32 }
            } else {
                FakeQuant::Nvfp4 { block: 16 }
            };
            let ent = self.cache_quant(ent, fq)?;
            st.global.append(be, part, l, ent)?;
        }
        Ok(())
    }

    /// V4.1 index source: top-k of `owner`'s keys, with candidate blocks.
    fn indexer_v41(
        &self,
        ctx: &mut Ctx<'_, '_, '_, B::Tensor>,
        x: &B::Tensor,
        qr: &B::Tensor,
        l: usize,
    ) -> R<Selection> {
        let c = &self.cfg;
        let be = &self.be;
        let iw = self.w.layers[l]
            .attn
            .indexer
            .as_ref()
            .ok_or_else(|| missing(l, "indexer"))?;
        let owners: Vec<usize> = c
            .kv_source_layers
            .iter()
            .copied()
            .filter(|j| c.index_source_layers.contains(j))
            .collect();
        let owner = last_at_or_below(&owners, l).ok_or_else(|| missing(l, "index key owner"))?;
        let ratio = c.compress_ratios[l];
        let (hi, di) = (c.index_n_heads, c.index_head_dim);
        let s_total = x.shape()[0];
        let qi = be.rope(
            &be.reshape(&self.mm(qr, &iw.wq_b)?, &[s_total, hi, di])?,
            &ctx.pos,
            &self.f_comp,
            false,
        )?;
        let qi = self.cache_quant(qi, FakeQuant::Mxfp4 { block: 32 })?;
        let wts = self.mm(x, &iw.weights_proj)?;
        let scale = ((di as f64).powf(-0.5) * (hi as f64).powf(-0.5)) as f32;
        let cand_src = c.candidate_source_layer;
        let mut out = Vec::with_capacity(ctx.segs.len());
        for (si, seg) in ctx.segs.iter().enumerate() {
            let st: &SeqState<B::Tensor> = ctx.states[si];
            let Some(keys) = st.global.gather(be, GlobalPart::IndexKeys, owner)? else {
                out.push(vec![Vec::new(); seg.len]);
                if cand_src == Some(l) {
                    ctx.candidates[si] = None;
                }
                continue;
            };
            let t = keys.shape()[0];
            let vis: Vec<usize> = (0..seg.len)
                .map(|r| ((seg.pos0 + r + 1) / ratio).min(t))
                .collect();
            let q_seg = be.narrow(&qi, 0, seg.off, seg.len)?;
            let w_seg = be.narrow(&wts, 0, seg.off, seg.len)?;
            let mut score = be.indexer_scores(&q_seg, &keys, &w_seg, &vis, scale)?;
            if cand_src == Some(l) {
                ctx.candidates[si] = Some(self.candidate_mask(&score, &vis, t)?);
            } else if cand_src.is_some_and(|cs| cs < l)
                && let Some(mask) = ctx.candidates[si].as_ref()
                && mask.shape() == score.shape()
            {
                score = be.mask_neg_inf(&score, mask)?;
            }
            let k = c.index_topk.min(t);
            out.push(self.picks(&score, k, &vis)?);
        }
        Ok(out)
    }

    /// Layer-`cs` candidate blocks as a keep mask `[rows, T]` (i32).
    fn candidate_mask(&self, score: &B::Tensor, vis: &[usize], t: usize) -> R<B::Tensor> {
        let be = &self.be;
        let bs = self.cfg.candidate_block_size;
        let nb = t.div_ceil(bs);
        let bsc = be.block_max(score, bs)?;
        let mut host = be.download_f32(&bsc)?;
        for (r, &v) in vis.iter().enumerate() {
            if v > 0 {
                host[r * nb + (v - 1) / bs] = f32::INFINITY; // the newest block is always kept
            }
        }
        let bsc = be.upload_f32(&host, &[vis.len(), nb])?;
        let kb = self.cfg.candidate_topk_blocks.min(nb);
        let picks = be.download_i64(&be.topk(&bsc, kb)?)?;
        let mut keep = vec![0i32; vis.len() * t];
        for r in 0..vis.len() {
            for &b in &picks[r * kb..(r + 1) * kb] {
                if b >= 0 {
                    let b = b as usize;
                    for e in b * bs..((b + 1) * bs).min(t) {
                        keep[r * t + e] = 1;
                    }
                }
            }
        }
        Ok(be.upload_i32(&keep, &[vis.len(), t])?)
    }

    /// Top-`k` entries per row, ascending, dropping invisible or empty picks.
    fn picks(&self, score: &B::Tensor, k: usize, vis: &[usize]) -> R<Vec<Vec<i64>>> {
        if k == 0 {
            return Ok(vec![Vec::new(); vis.len()]);
        }
        let top = self.be.download_i64(&self.be.topk(score, k)?)?;
        Ok(vis
            .iter()
            .enumerate()
            .map(|(r, &v)| {
                let mut row: Vec<i64> = top[r * k..(r + 1) * k]
                    .iter()
                    .copied()
                    .filter(|&e| e >= 0 && (e as usize) < v)
                    .collect();
                row.sort_unstable();
                row
            })
            .collect())
    }

    /// V4 CSA indexer over the layer's own index keys.
    fn indexer_v4(
        &self,
        ctx: &mut Ctx<'_, '_, '_, B::Tensor>,
        x: &B::Tensor,
        qr: &B::Tensor,
        l: usize,
    ) -> R<Selection> {
        let _sp = super::prof::span("attn.indexer");
        let c = &self.cfg;
        let be = &self.be;
        let iw = self.w.layers[l]
            .attn
            .indexer
            .as_ref()
            .ok_or_else(|| missing(l, "indexer"))?;
        let ratio = c.compress_ratios[l];
        let (hi, di) = (c.index_n_heads, c.index_head_dim);
        let s_total = x.shape()[0];
        let qi = be.rope(
            &be.reshape(&self.mm(qr, &iw.wq_b)?, &[s_total, hi, di])?,
            &ctx.pos,
            &self.f_comp,
            false,
        )?;
        let qi = self.cache_quant(qi, FakeQuant::Mxfp4 { block: 32 })?;
        let wts = self.mm(x, &iw.weights_proj)?;
        let scale = ((di as f64).powf(-0.5) * (hi as f64).powf(-0.5)) as f32;
        let mut out = Vec::with_capacity(ctx.segs.len());
        for (si, seg) in ctx.segs.iter().enumerate() {
            let st: &SeqState<B::Tensor> = ctx.states[si];
            let Some(keys) = st.global.gather(be, GlobalPart::IndexKeys, l)? else {
                out.push(vec![Vec::new(); seg.len]);
                continue;
            };
            let t = keys.shape()[0];
            let vis: Vec<usize> = (0..seg.len)
                .map(|r| ((seg.pos0 + r + 1) / ratio).min(t))
                .collect();
            let score = be.indexer_scores(
                &be.narrow(&qi, 0, seg.off, seg.len)?,
                &keys,
                &be.narrow(&wts, 0, seg.off, seg.len)?,
                &vis,
                scale,
            )?;
            out.push(self.picks(&score, c.index_topk.min(t), &vis)?);
        }
        Ok(out)
    }
}

fn missing(l: usize, what: &str) -> ModelError {
    ModelError::Input(format!("layer {l} has no {what} weights"))
}

/// Type alias used by forward.rs for the per-segment candidate masks.
pub(crate) type Candidates<T> = Vec<Option<T>>;
