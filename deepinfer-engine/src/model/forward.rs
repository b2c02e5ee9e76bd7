//! The backbone forward pass over a batch of sequences, each consuming a chunk of tokens on
//! top of its own state (prefill chunks and decode rows mix freely).

use super::attention::{Candidates, Selection};
use super::state::SeqState;
use super::{Model, ModelError};
use crate::config::ModelKind;
use deepinfer_kernels::{Backend, RouteParams, RouteScore, TensorInfo};
use std::collections::BTreeMap;

type R<T> = Result<T, ModelError>;

/// One sequence in a batch: its state and the tokens it consumes now.
#[derive(Debug)]
pub struct BatchItem<'a, T> {
    /// The sequence's state (advanced by the call).
    pub state: &'a mut SeqState<T>,
    /// Tokens to consume (at positions `state.pos ..`).
    pub tokens: &'a [u32],
}

/// Which rows get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Every row (scoring).
    All,
    /// The last row of each item (generation).
    Last,
}

/// Named intermediates of a forward pass (`[shape], values`), for layer-by-layer checks.
#[derive(Debug, Default, Clone)]
pub struct Trace {
    /// Name → (shape, values).
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

/// A segment of the batch rows belonging to one sequence.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seg {
    pub off: usize,
    pub len: usize,
    pub pos0: usize,
}

/// What a forward pass carries between layers.
pub(crate) struct Ctx<'a, 'b, 'c, T> {
    pub segs: Vec<Seg>,
    pub states: Vec<&'b mut SeqState<T>>,
    pub pos: Vec<i64>,
    pub ids: Vec<u32>,
    /// The top-k published by the latest index source (V4.1).
    pub shared_topk: Option<Selection>,
    /// Per segment: candidate keep mask of the candidate source layer (V4.1).
    pub candidates: Candidates<T>,
    pub trace: Option<&'a mut Trace>,
    /// Bounded replay: rebuild window state only (compressors untouched, no advance).
    pub replay: bool,
    /// Decoder-side bounded replay: this layer's compressor already ran on every row.
    pub skip_compress: Option<usize>,
    /// Expert parallelism: this rank's side of the group.
    pub ep: Option<&'b mut super::expert_parallel::ExpertParallel<'c>>,
}

impl<B: Backend> Model<B> {
    pub(crate) fn record(
        &self,
        ctx: &mut Ctx<'_, '_, '_, B::Tensor>,
        name: &str,
        t: &B::Tensor,
    ) -> R<()> {
        if let Some(tr) = ctx.trace.as_deref_mut() {
            let v = self.be.download_f32(t)?;
            tr.tensors.insert(name.to_string(), (t.shape().to_vec(), v));
        }
        Ok(())
    }

    /// Run the backbone over a batch. Returns, per item, logits `[rows, V]` flattened
    /// (`rows` = chunk length for [`Logits::All`], 1 for [`Logits::Last`]).
    pub fn forward(
        &self,
        items: &mut [BatchItem<'_, B::Tensor>],
        which: Logits,
        trace: Option<&mut Trace>,
    ) -> R<Vec<Vec<f32>>> {
        super::sync::check_host_read("Model::forward (logits to the host)")?;
        let sp = super::prof::span("forward");
        let (h, rows) = self.forward_hidden(items, trace)?;
        let _head = super::prof::span("head");
        let out = self.head_logits(&h, rows, which);
        drop(sp);
        out
    }

    /// Final-normed hidden rows `[S, D]` (and the DSpark context update done).
    pub(crate) fn forward_hidden(
        &self,
        items: &mut [BatchItem<'_, B::Tensor>],
        trace: Option<&mut Trace>,
    ) -> R<(B::Tensor, Vec<usize>)> {
        self.forward_hidden_mode(items, trace, false, None)
    }

    /// [`Model::forward_hidden`] as one rank of an expert-parallel group.
    pub(crate) fn forward_hidden_ep(
        &self,
        items: &mut [BatchItem<'_, B::Tensor>],
        ep: &mut super::expert_parallel::ExpertParallel<'_>,
    ) -> R<(B::Tensor, Vec<usize>)> {
        self.forward_hidden_mode(items, None, false, Some(ep))
    }

    pub(crate) fn forward_hidden_mode(
        &self,
        items: &mut [BatchItem<'_, B::Tensor>],
        trace: Option<&mut Trace>,
        replay: bool,
        ep: Option<&mut super::expert_parallel::ExpertParallel<'_>>,
    ) -> R<(B::Tensor, Vec<usize>)> {
        let c = &self.cfg;
        let be = &self.be;
        if items.is_empty() {
            return Err(ModelError::Input("empty batch".into()));
        }
        let mut segs = Vec::new();
        let mut pos = Vec::new();
        let mut ids = Vec::new();
        let mut off = 0;
        for it in items.iter() {
            if it.tokens.is_empty() {
                return Err(ModelError::Input("a batch item has no tokens".into()));
            }
            if let Some(&bad) = it.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(ModelError::Input(format!(
                    "token id {bad} outside the vocabulary ({})",
                    c.vocab_size
                )));
            }
            if it.state.window.len() != c.num_layers {
                return Err(ModelError::Input(
                    "sequence state belongs to another model".into(),
                ));
            }
            segs.push(Seg {
                off,
                len: it.tokens.len(),
                pos0: it.state.pos,
            });
            pos.extend((0..it.tokens.len()).map(|r| (it.state.pos + r) as i64));
            ids.extend_from_slice(it.tokens);
            off += it.tokens.len();
        }
        let s_total = off;
        // Engram hashes per Engram layer, [S, cols] each.
        let hashes: Vec<B::Tensor> = match (&self.hasher, &c.engram) {
            (Some(hs), Some(ec)) => {
                let cols = hs.columns();
                let nl = ec.layer_ids.len();
                let mut per_layer = vec![Vec::with_capacity(s_total * cols); nl];
                for it in items.iter() {
                    let hv = hs.hash(&it.state.history, it.state.pos, it.tokens);
                    for s in 0..it.tokens.len() {
                        for (li, dst) in per_layer.iter_mut().enumerate() {
                            dst.extend_from_slice(
                                &hv[(s * nl + li) * cols..(s * nl + li + 1) * cols],
                            );
                        }
                    }
                }
                per_layer
                    .iter()
                    .map(|v| be.upload_i64(v, &[s_total, cols]))
                    .collect::<Result<_, _>>()?
            }
            _ => Vec::new(),
        };
        let n_items = items.len();
        let states: Vec<&mut SeqState<B::Tensor>> =
            items.iter_mut().map(|it| &mut *it.state).collect();
        let mut ctx = Ctx {
            segs,
            states,
            pos,
            ids,
            shared_topk: None,
            candidates: (0..n_items).map(|_| None).collect(),
            trace,
            replay,
            skip_compress: None,
            ep,
        };
        let orig_segs = ctx.segs.clone();
        let orig_ids = ctx.ids.clone();
        let tail_from = if self.decoder_replay && !replay {
            c.kv_source_layers.last().copied()
        } else {
            None
        };
        let (n, dm) = (c.hc_mult, c.hidden_size);
        let eps = c.rms_norm_eps as f32;
        let ids_i64: Vec<i64> = ctx.ids.iter().map(|&t| t as i64).collect();
        let ids_t = be.upload_i64(&ids_i64, &[s_total])?;
        let e = be.gather_rows(&self.w.embed, &ids_t)?;
        self.record(&mut ctx, "embed", &e)?;
        let mut x = self.broadcast_streams(&e, s_total)?;
        let mut pre_mix = match c.kind {
            ModelKind::V41 => Some(self.one_hot_pre(s_total)?),
            ModelKind::V4 => None,
        };
        let targets: Vec<usize> = c
            .dspark
            .as_ref()
            .map(|d| d.target_layer_ids.clone())
            .unwrap_or_default();
        let mut feats = Vec::new();
        for l in 0..c.num_layers {
            let lw = &self.w.layers[l];
            if let (Some(ew), Some(ec)) = (&lw.engram, &c.engram) {
                let li = ec.layer_ids.iter().position(|&j| j == l).unwrap_or(0);
                x = self.engram(&mut ctx, &x, ew, &hashes[li], l)?;
            }
            if targets.contains(&l) && self.w.dspark.is_some() {
                feats.push(be.mean_axis1(&x)?);
            }
            let sp = super::prof::span("hc.mix");
            let ma = self.hc(&x, &lw.hc_attn)?;
            drop(sp);
            let sp = super::prof::span("hc.collapse+norm");
            let collapse_pre = match c.kind {
                ModelKind::V41 => pre_mix.as_ref().unwrap_or(&ma.pre),
                ModelKind::V4 => &ma.pre,
            };
            let mut collapsed = be.hc_collapse(&x, collapse_pre)?;
            let mut xin = be.rms_norm(&collapsed, Some(&lw.attn_norm), eps)?;
            drop(sp);
            let mut ma = ma;
            let wn = c.sliding_window;
            if tail_from == Some(l) && ctx.segs.iter().any(|s| s.len > wn) {
                // Decoder-side bounded replay: the last KV source compresses every row, then
                // this layer's attention and everything above run on each item's last
                // `sliding_window` rows only, with their windows floored at the tail start.
                self.compress_v41(&mut ctx, &xin, l)?;
                ctx.skip_compress = Some(l);
                let keep: Vec<(usize, usize)> = ctx
                    .segs
                    .iter()
                    .map(|s| (s.off + s.len - s.len.min(wn), s.len.min(wn)))
                    .collect();
                let pick = |t: &B::Tensor| -> R<B::Tensor> {
                    let parts = keep
                        .iter()
                        .map(|&(o, n)| be.narrow(t, 0, o, n))
                        .collect::<Result<Vec<_>, _>>()?;
                    let refs: Vec<&B::Tensor> = parts.iter().collect();
                    Ok(be.concat(&refs, 0)?)
                };
                x = pick(&x)?;
                collapsed = pick(&collapsed)?;
                xin = pick(&xin)?;
                ma = deepinfer_kernels::HcMixes {
                    pre: pick(&ma.pre)?,
                    post: pick(&ma.post)?,
                    comb: pick(&ma.comb)?,
                };
                for f in feats.iter_mut() {
                    *f = pick(f)?;
                }
                let mut pos = Vec::new();
                let mut ids = Vec::new();
                let mut off = 0;
                for (si, seg) in ctx.segs.iter_mut().enumerate() {
                    let (o, n) = keep[si];
                    pos.extend_from_slice(&ctx.pos[o..o + n]);
                    ids.extend_from_slice(&ctx.ids[o..o + n]);
                    if n < seg.len {
                        for j in l..c.num_layers {
                            ctx.states[si].window[j] = None;
                        }
                    }
                    *seg = Seg {
                        off,
                        len: n,
                        pos0: seg.pos0 + seg.len - n,
                    };
                    off += n;
                }
                ctx.pos = pos;
                ctx.ids = ids;
            }
            let sp = super::prof::span("attn");
            let a = self.attention(&mut ctx, &xin, l)?;
            drop(sp);
            let sp = super::prof::span("hc.expand");
            x = be.hc_expand(&x, &a, &ma.post, &ma.comb)?;
            drop(sp);
            let sp = super::prof::span("hc.mix");
            let mf = self.hc(&x, &lw.hc_ffn)?;
            drop(sp);
            let fpre = match c.kind {
                ModelKind::V41 => &ma.pre,
                ModelKind::V4 => &mf.pre,
            };
            let sp = super::prof::span("hc.collapse+norm");
            let fcol = be.hc_collapse(&x, fpre)?;
            let fin = be.rms_norm(&fcol, Some(&lw.ffn_norm), eps)?;
            drop(sp);
            let sp = super::prof::span("moe");
            let fo = self.moe(&mut ctx, &fin, &lw.ffn, c.num_experts_per_tok, Some(l))?;
            drop(sp);
            let sp = super::prof::span("hc.expand");
            x = be.hc_expand(&x, &fo, &mf.post, &mf.comb)?;
            drop(sp);
            if ctx.trace.is_some() {
                let p = format!("l{l}");
                self.record(&mut ctx, &format!("{p}.attn_hc.collapsed"), &collapsed)?;
                self.record(&mut ctx, &format!("{p}.ffn_hc.collapsed"), &fcol)?;
                self.record(&mut ctx, &format!("{p}.attn.in"), &xin)?;
                self.record(&mut ctx, &format!("{p}.attn.out"), &a)?;
                self.record(&mut ctx, &format!("{p}.ffn.in"), &fin)?;
                self.record(&mut ctx, &format!("{p}.ffn.out"), &fo)?;
                for (nm, t) in [("pre", &ma.pre), ("post", &ma.post), ("comb", &ma.comb)] {
                    self.record(&mut ctx, &format!("{p}.attn_hc.{nm}"), t)?;
                }
                for (nm, t) in [("pre", &mf.pre), ("post", &mf.post), ("comb", &mf.comb)] {
                    self.record(&mut ctx, &format!("{p}.ffn_hc.{nm}"), t)?;
                }
                self.record(&mut ctx, &format!("{p}.out_streams"), &x)?;
                if ctx.states.len() == 1 {
                    let st = &ctx.states[0].global;
                    let ent = st.gather(&self.be, super::global::GlobalPart::Entries, l);
                    let keys = st.gather(&self.be, super::global::GlobalPart::IndexKeys, l);
                    if let Some(t) = ent? {
                        self.record(&mut ctx, &format!("{p}.compressor.entries"), &t)?;
                    }
                    if let Some(t) = keys? {
                        self.record(&mut ctx, &format!("{p}.indexer.keys"), &t)?;
                    }
                }
            }
            pre_mix = Some(mf.pre);
        }
        let y = match (&self.w.hc_head, c.kind) {
            (Some(hw), ModelKind::V4) => {
                let flat = be.rms_norm(&be.reshape(&x, &[x.shape()[0], n * dm])?, None, eps)?;
                let mix = self.mm(&flat, &hw.fn_)?;
                let pre = be.hc_pre_only(&mix, &hw.scale, &hw.base, c.hc_eps as f32)?;
                be.hc_collapse(&x, &pre)?
            }
            _ => {
                let pre =
                    pre_mix.ok_or_else(|| ModelError::Input("model without layers".into()))?;
                be.hc_collapse(&x, &pre)?
            }
        };
        self.record(&mut ctx, "hc_head.out", &y)?;
        let hfinal = be.rms_norm(&y, Some(&self.w.norm), eps)?;
        self.record(&mut ctx, "final_norm.out", &hfinal)?;
        if !feats.is_empty() {
            let refs: Vec<&B::Tensor> = feats.iter().collect();
            let main_hidden = be.concat(&refs, 1)?;
            self.dspark_context(&mut ctx, &main_hidden)?;
        }
        let rows: Vec<usize> = ctx.segs.iter().map(|s| s.len).collect();
        for (st, seg) in ctx.states.iter_mut().zip(orig_segs.iter()) {
            if replay {
                continue;
            }
            st.pos += seg.len;
            st.history
                .extend_from_slice(&orig_ids[seg.off..seg.off + seg.len]);
        }
        Ok((hfinal, rows))
    }

    pub(crate) fn head_logits(
        &self,
        h: &B::Tensor,
        lens: Vec<usize>,
        which: Logits,
    ) -> R<Vec<Vec<f32>>> {
        let be = &self.be;
        let v = self.cfg.vocab_size;
        let rows = match which {
            Logits::All => h.clone(),
            Logits::Last => {
                let mut off = 0;
                let mut lasts = Vec::new();
                for &n in &lens {
                    off += n;
                    lasts.push(be.narrow(h, 0, off - 1, 1)?);
                }
                let refs: Vec<&B::Tensor> = lasts.iter().collect();
                be.concat(&refs, 0)?
            }
        };
        let logits = be.download_f32(&self.mm(&rows, &self.w.head)?)?;
        if lens.len() == 1 {
            return Ok(vec![logits]); // one item: its rows are the whole buffer
        }
        let mut out = Vec::with_capacity(lens.len());
        let mut off = 0;
        for &n in &lens {
            let k = if which == Logits::All { n } else { 1 };
            out.push(logits[off * v..(off + k) * v].to_vec());
            off += k;
        }
        Ok(out)
    }

    /// `[S, D]` → `[S, N, D]` with every stream a copy.
    pub(crate) fn broadcast_streams(&self, e: &B::Tensor, s: usize) -> R<B::Tensor> {
        let be = &self.be;
        let dm = self.cfg.hidden_size;
        let e3 = be.reshape(e, &[s, 1, dm])?;
        let parts: Vec<&B::Tensor> = (0..self.cfg.hc_mult).map(|_| &e3).collect();
        Ok(be.concat(&parts, 1)?)
    }

    /// V4.1's initial pre-mix: one-hot on stream 0.
    pub(crate) fn one_hot_pre(&self, s: usize) -> R<B::Tensor> {
        let n = self.cfg.hc_mult;
        let mut v = vec![0.0f32; s * n];
        for r in 0..s {
            v[r * n] = 1.0;
        }
        Ok(self.be.upload_f32(&v, &[s, n])?)
    }

    pub(crate) fn hc(
        &self,
        x: &B::Tensor,
        w: &super::weights::HcW<B::Tensor>,
    ) -> R<deepinfer_kernels::HcMixes<B::Tensor>> {
        let c = &self.cfg;
        let be = &self.be;
        let s = x.shape()[0];
        let flat = be.rms_norm(
            &be.reshape(x, &[s, c.hc_mult * c.hidden_size])?,
            None,
            c.rms_norm_eps as f32,
        )?;
        let mix = self.mm(&flat, &w.fn_)?;
        Ok(be.hc_mixes(
            &mix,
            &w.scale,
            &w.base,
            c.hc_mult,
            c.hc_eps as f32,
            c.hc_sinkhorn_iters,
        )?)
    }

    /// MoE with sqrt-softplus routing (or hash routing), clamped SwiGLU, shared expert.
    pub(crate) fn moe(
        &self,
        ctx: &mut Ctx<'_, '_, '_, B::Tensor>,
        x: &B::Tensor,
        fw: &super::weights::FfnW<B::Tensor>,
        top_k: usize,
        layer: Option<usize>,
    ) -> R<B::Tensor> {
        let c = &self.cfg;
        let be = &self.be;
        let mut logits = self.mm(x, &fw.gate)?;
        if c.gate_temp != 1.0 {
            logits = be.affine(&logits, (1.0 / c.gate_temp) as f32, 0.0)?;
        }
        let p = RouteParams {
            score: RouteScore::SqrtSoftplus,
            top_k,
            renormalize: match c.kind {
                ModelKind::V4 => true,
                ModelKind::V41 => c.norm_topk_prob && top_k > 1,
            },
            scale: c.routed_scaling_factor as f32,
        };
        let sp = super::prof::span("moe.route");
        let (idx, wts) = match &fw.tid2eid {
            Some(table) => {
                // Gather this batch's table rows first, so the routing op sees an [S, k]
                // table instead of validating the whole [V, k] one on every call.
                let ids: Vec<i64> = ctx.ids.iter().map(|&t| t as i64).collect();
                let rows = be.gather_rows(table, &be.upload_i64(&ids, &[ids.len()])?)?;
                let local: Vec<i64> = (0..ids.len() as i64).collect();
                let local = be.upload_i64(&local, &[ids.len()])?;
                be.moe_route_hash(&logits, &rows, &local, p)?
            }
            None => be.moe_route(&logits, fw.bias.as_ref(), p)?,
        };
        if let (Some(l), Some(counts)) = (layer, &self.expert_load) {
            for e in be.download_i64(&idx)? {
                if let Some(c) = counts.get(l).and_then(|c| c.get(e as usize)) {
                    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        if let (Some(l), true) = (layer, ctx.trace.is_some()) {
            let mut v = be.download_i64(&idx)?;
            for row in v.chunks_mut(top_k) {
                row.sort_unstable();
            }
            let shape = idx.shape().to_vec();
            if let Some(tr) = ctx.trace.as_deref_mut() {
                tr.tensors.insert(
                    format!("l{l}.router.indices"),
                    (shape, v.iter().map(|&e| e as f32).collect()),
                );
            }
            self.record(ctx, &format!("l{l}.router.logits"), &logits)?;
        }
        let experts = super::expert_parallel::expert_list(&fw.experts);
        let lim = c.swiglu_limit as f32;
        drop(sp);
        let sp = super::prof::span("moe.experts");
        // FP8 activations: the experts' input is rounded once for all of them.
        let xq = match experts.first() {
            Some(e) if e.gate.dtype().is_quantized() => self.fp8_activation(x)?,
            _ => None,
        };
        let xe = xq.as_ref().unwrap_or(x);
        let routed = match (layer, ctx.ep.as_deref_mut()) {
            (Some(l), Some(ep)) => ep.routed(l, be, xe, &idx, &wts, &experts, lim)?,
            _ => be.moe_experts(xe, &idx, &wts, &experts, lim)?,
        };
        drop(sp);
        let _sp = super::prof::span("moe.shared");
        let (w1, w3, w2) = &fw.shared;
        let shared = self.mm(&be.swiglu(&self.mm(x, w1)?, &self.mm(x, w3)?, lim)?, w2)?;
        Ok(be.add(&routed, &shared)?)
    }

    /// Engram injection: `X_n += gate_n * value` with a signed-sqrt sigmoid gate per stream.
    fn engram(
        &self,
        ctx: &mut Ctx<'_, '_, '_, B::Tensor>,
        x: &B::Tensor,
        ew: &super::weights::EngramW<B::Tensor>,
        hash: &B::Tensor,
        l: usize,
    ) -> R<B::Tensor> {
        let c = &self.cfg;
        let be = &self.be;
        let (n, dm) = (c.hc_mult, c.hidden_size);
        let s = x.shape()[0];
        let eps = c.rms_norm_eps as f32;
        let emb = be.gather_rows(&ew.embed, hash)?; // [S, cols, hd]
        let cols_hd = emb.numel() / s;
        let kv = self.mm(&be.reshape(&emb, &[s, cols_hd])?, &ew.wkv)?; // [S, (N+1) D]
        let key = be.reshape(&be.narrow(&kv, 1, 0, n * dm)?, &[s, n, dm])?;
        let value = be.narrow(&kv, 1, n * dm, dm)?;
        let prod = be.mul(
            &be.mul(&be.rms_norm(x, None, eps)?, &ew.qk)?,
            &be.rms_norm(&key, None, eps)?,
        )?;
        let dot = be.download_f32(&self.mm(&prod, &self.ones_d)?)?; // [S, N, 1]
        let inv = 1.0 / (dm as f64).sqrt();
        let gate: Vec<f32> = dot
            .iter()
            .map(|&v| {
                let d = v as f64 * inv;
                let sq = d.abs().max(1e-6).sqrt().copysign(d);
                (1.0 / (1.0 + (-sq).exp())) as f32
            })
            .collect();
        let gate = be.upload_f32(&gate, &[s, n])?;
        let mut eye = vec![0.0f32; s * n * n];
        for r in 0..s {
            for k in 0..n {
                eye[r * n * n + k * n + k] = 1.0;
            }
        }
        let eye = be.upload_f32(&eye, &[s, n, n])?;
        if ctx.trace.is_some() {
            self.record(ctx, &format!("l{l}.engram.gate"), &gate)?;
        }
        Ok(be.hc_expand(x, &value, &gate, &eye)?)
    }
}
