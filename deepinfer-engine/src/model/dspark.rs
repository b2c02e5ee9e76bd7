//! The DSpark block drafter (V4.1 `mtp.*` stages; architecture section 10): context K=V
//! rows built from the target layers' input streams, a block `[anchor, noise x (B-1)]`
//! attending the stage's context window plus the whole block (no causal mask), then the
//! sequential Markov correction and the confidence head.

use super::forward::Ctx;
use super::state::SeqState;
use super::{Model, ModelError};
use deepinfer_kernels::{Backend, FakeQuant, TensorInfo};

type R<T> = Result<T, ModelError>;

/// One drafted block.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    /// `[B, V]` logits before the Markov correction.
    pub base_logits: Vec<f32>,
    /// `[B, V]` logits after it.
    pub logits: Vec<f32>,
    /// `[B]` greedy draft tokens (row i predicts position n + 1 + i).
    pub draft_ids: Vec<u32>,
    /// `[B]` probability of each draft token under its row's corrected logits (softmax at
    /// temperature 1), for the sampler's verification.
    pub draft_probs: Vec<f32>,
    /// `[B]` confidence (sigmoid), an estimate of each draft's acceptance probability.
    pub confidence: Vec<f32>,
    /// `[B]` confidence before the sigmoid.
    pub confidence_logit: Vec<f32>,
    /// `[B, D]` pre-norm collapsed block rows.
    pub head_hidden: Vec<f32>,
}

impl<B: Backend> Model<B> {
    /// Context side, run with every backbone chunk: each stage keeps its K=V rows of the
    /// last `sliding_window` positions.
    pub(crate) fn dspark_context(
        &self,
        ctx: &mut Ctx<'_, '_, '_, B::Tensor>,
        main_hidden: &B::Tensor,
    ) -> R<()> {
        let Some(dw) = self.w.dspark.as_ref() else {
            return Ok(());
        };
        let c = &self.cfg;
        let be = &self.be;
        let eps = c.rms_norm_eps as f32;
        self.record(ctx, "dspark.main_hidden", main_hidden)?;
        let main_x = be.rms_norm(
            &self.mm(main_hidden, &dw.main_proj)?,
            Some(&dw.main_norm),
            eps,
        )?;
        self.record(ctx, "dspark.main_x", &main_x)?;
        let wn = c.sliding_window;
        for (j, st) in dw.stages.iter().enumerate() {
            let kv = be.rope(
                &be.rms_norm(
                    &self.mm(&main_x, &st.attn.wkv)?,
                    Some(&st.attn.kv_norm),
                    eps,
                )?,
                &ctx.pos,
                &self.f_main,
                false,
            )?;
            let kv = self.cache_quant(kv, FakeQuant::Fp8 { block: 32 })?;
            for (si, seg) in ctx.segs.iter().enumerate() {
                let state: &mut SeqState<B::Tensor> = ctx.states[si];
                let rows = be.narrow(&kv, 0, seg.off, seg.len)?;
                let all = match state.dspark_window[j].take() {
                    Some(p) => be.concat(&[&p, &rows], 0)?,
                    None => rows,
                };
                let n = all.shape()[0];
                state.dspark_window[j] = Some(if n > wn {
                    be.narrow(&all, 0, n - wn, wn)?
                } else {
                    all
                });
            }
        }
        Ok(())
    }

    /// Draft one block after the `state.pos` tokens consumed so far; `anchor` is the accepted
    /// token for position `state.pos` (not yet fed to the backbone). The state is not changed.
    pub fn draft(&self, state: &SeqState<B::Tensor>, anchor: u32) -> R<Draft> {
        self.draft_batch(&[(state, anchor)])?
            .pop()
            .ok_or_else(|| ModelError::Input("no draft".into()))
    }

    /// [`Model::draft_batch`] keeping only what a runtime reads, for the first `depth` rows
    /// of each block: draft ids, confidences and head hiddens (`base_logits`, `logits` and
    /// `draft_probs` come back empty). The block still runs whole through the stages (its
    /// rows attend each other), but only `depth` rows pay the vocabulary projection and the
    /// Markov correction, which dominate the drafter's cost on a small model with a large
    /// vocabulary. Each kept row is the same computation as in [`Model::draft_batch`].
    pub fn draft_ids_batch(
        &self,
        items: &[(&SeqState<B::Tensor>, u32)],
        depth: usize,
    ) -> R<Vec<Draft>> {
        self.draft_rows(items, false, depth)
    }

    /// Draft one block for each `(state, anchor)` in one drafter pass: the blocks' rows are
    /// stacked (each attends its own context window and block), the Markov correction runs
    /// position by position over all sequences at once. Row for row the same computation as
    /// [`Model::draft`], so with batch-invariant kernels the drafts are identical.
    pub fn draft_batch(&self, items: &[(&SeqState<B::Tensor>, u32)]) -> R<Vec<Draft>> {
        self.draft_rows(items, true, usize::MAX)
    }

    fn draft_rows(
        &self,
        items: &[(&SeqState<B::Tensor>, u32)],
        full: bool,
        depth: usize,
    ) -> R<Vec<Draft>> {
        super::sync::check_host_read("Model::draft (draft ids to the host)")?;
        let c = &self.cfg;
        let be = &self.be;
        let (dw, ds) = match (self.w.dspark.as_ref(), c.dspark.as_ref()) {
            (Some(w), Some(d)) => (w, d),
            _ => return Err(ModelError::Input("this model has no DSpark drafter".into())),
        };
        for (state, anchor) in items {
            if state.pos == 0 || state.dspark_window.iter().any(Option::is_none) {
                return Err(ModelError::Input(
                    "drafting needs at least one context token".into(),
                ));
            }
            if *anchor as usize >= c.vocab_size {
                return Err(ModelError::Input(format!(
                    "anchor {anchor} outside the vocabulary"
                )));
            }
        }
        if items.is_empty() {
            return Ok(Vec::new());
        }
        let bsz = ds.block_size;
        let n = items.len();
        let rows = n * bsz;
        let (h, d, v) = (c.num_heads, c.head_dim, c.vocab_size);
        let eps = c.rms_norm_eps as f32;
        let pos: Vec<i64> = items
            .iter()
            .flat_map(|(st, _)| (0..bsz).map(move |i| (st.pos + i) as i64))
            .collect();
        let mut ids = Vec::with_capacity(rows);
        for (_, anchor) in items {
            ids.push(*anchor);
            ids.extend(std::iter::repeat_n(ds.noise_token_id as u32, bsz - 1));
        }
        let ids_t = be.upload_i64(&ids.iter().map(|&t| t as i64).collect::<Vec<_>>(), &[rows])?;
        let mut x = self.broadcast_streams(&be.gather_rows(&self.w.embed, &ids_t)?, rows)?;
        let mut pre = self.one_hot_pre(rows)?;
        let mut ctx = Ctx {
            segs: Vec::new(),
            states: Vec::new(),
            pos: pos.clone(),
            ids: ids.clone(),
            shared_topk: None,
            candidates: Vec::new(),
            trace: None,
            replay: false,
            skip_compress: None,
            ep: None,
        };
        for (j, sw) in dw.stages.iter().enumerate() {
            let ma = self.hc(&x, &sw.hc_attn)?;
            let xin = be.rms_norm(&be.hc_collapse(&x, &pre)?, Some(&sw.attn_norm), eps)?;
            // attention: ratio-0 table, keys = each block's context window + its block rows
            let aw = &sw.attn;
            let qr = be.rms_norm(&self.mm(&xin, &aw.wq_a)?, Some(&aw.q_norm), eps)?;
            let q = be.rope(
                &be.reshape(&self.mm(&qr, &aw.wq_b)?, &[rows, h, d])?,
                &pos,
                &self.f_main,
                false,
            )?;
            let kv = be.rope(
                &be.rms_norm(&self.mm(&xin, &aw.wkv)?, Some(&aw.kv_norm), eps)?,
                &pos,
                &self.f_main,
                false,
            )?;
            let kv = self.cache_quant(kv, FakeQuant::Fp8 { block: 32 })?;
            let mut parts = Vec::with_capacity(n + 1);
            let mut wins = Vec::with_capacity(n);
            let mut off = 0;
            for (state, _) in items {
                let w = state.dspark_window[j]
                    .as_ref()
                    .ok_or_else(|| ModelError::Input("missing drafter context".into()))?;
                let len = w.shape()[0];
                wins.push((off, len));
                off += len;
                parts.push(w);
            }
            parts.push(&kv);
            let keys = be.concat(&parts, 0)?;
            // Row r of block s reads its window, then its block's rows; shorter lists pad.
            let width = wins.iter().map(|w| w.1).max().unwrap_or(0) + bsz;
            let mut idx = vec![-1i64; rows * width];
            for (s, &(wo, wl)) in wins.iter().enumerate() {
                let keys_of: Vec<i64> = (wo..wo + wl)
                    .chain(off + s * bsz..off + (s + 1) * bsz)
                    .map(|k| k as i64)
                    .collect();
                for r in 0..bsz {
                    let at = (s * bsz + r) * width;
                    idx[at..at + keys_of.len()].copy_from_slice(&keys_of);
                }
            }
            let idx = be.upload_i64(&idx, &[rows, width])?;
            let o = be.sparse_attention(&q, &keys, &idx, &aw.sink, 1.0 / (d as f32).sqrt())?;
            let o = be.rope(&o, &pos, &self.f_main, true)?;
            let g = c.o_groups;
            let z = be.grouped_matmul(&be.reshape(&o, &[rows, g, h * d / g])?, &aw.wo_a)?;
            let a = self.mm(&be.reshape(&z, &[rows, g * c.o_lora_rank])?, &aw.wo_b)?;
            x = be.hc_expand(&x, &a, &ma.post, &ma.comb)?;
            let mf = self.hc(&x, &sw.hc_ffn)?;
            let fin = be.rms_norm(&be.hc_collapse(&x, &ma.pre)?, Some(&sw.ffn_norm), eps)?;
            let fo = self.moe(&mut ctx, &fin, &sw.ffn, ds.num_experts_per_tok, None)?;
            x = be.hc_expand(&x, &fo, &mf.post, &mf.comb)?;
            pre = mf.pre;
        }
        let hid = be.hc_collapse(&x, &pre)?;
        // Only the leading `depth` rows of each block go on: `kept` rows from here.
        let depth = depth.clamp(1, bsz);
        let hid = if depth < bsz {
            let keep: Vec<i64> = (0..n)
                .flat_map(|s| (0..depth).map(move |i| (s * bsz + i) as i64))
                .collect();
            be.gather_rows(&hid, &be.upload_i64(&keep, &[n * depth])?)?
        } else {
            hid
        };
        let (bsz, rows) = (depth, n * depth);
        let base = self.mm(&be.rms_norm(&hid, Some(&dw.norm), eps)?, &self.w.head)?;
        let mut logits = be.download_f32(&base)?;
        let base_host = if full { logits.clone() } else { Vec::new() };
        // The Markov correction: position i of every block at once, from each block's
        // previous token (its anchor, then its own draft).
        let mut prev: Vec<u32> = items.iter().map(|&(_, a)| a).collect();
        let mut inputs = vec![0u32; rows];
        let mut drafted = vec![0u32; rows];
        for i in 0..bsz {
            let prev_t =
                be.upload_i64(&prev.iter().map(|&t| t as i64).collect::<Vec<_>>(), &[n])?;
            let m = be.gather_rows(&dw.markov_embed, &prev_t)?; // [n, r]
            let corr = be.download_f32(&self.mm(&m, &dw.markov_head)?)?;
            for s in 0..n {
                let r = s * bsz + i;
                inputs[r] = prev[s];
                let row = &mut logits[r * v..(r + 1) * v];
                for (o, cval) in row.iter_mut().zip(&corr[s * v..(s + 1) * v]) {
                    *o += cval;
                }
                prev[s] = argmax(row) as u32;
                drafted[r] = prev[s];
            }
        }
        let inputs_t = be.upload_i64(
            &inputs.iter().map(|&t| t as i64).collect::<Vec<_>>(),
            &[rows],
        )?;
        let mcat = be.gather_rows(&dw.markov_embed, &inputs_t)?;
        let conf = be.download_f32(&self.mm(&be.concat(&[&hid, &mcat], 1)?, &dw.confidence)?)?;
        let hid_host = be.download_f32(&hid)?;
        let dm = hid_host.len() / rows;
        let mut out = Vec::with_capacity(n);
        for s in 0..n {
            let rr = s * bsz..(s + 1) * bsz;
            let (lg, base_s) = if full {
                (
                    logits[rr.start * v..rr.end * v].to_vec(),
                    base_host[rr.start * v..rr.end * v].to_vec(),
                )
            } else {
                (Vec::new(), Vec::new())
            };
            let draft_probs = if full {
                drafted[rr.clone()]
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| {
                        let row = &lg[i * v..(i + 1) * v];
                        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let z: f64 = row.iter().map(|&x| ((x - m) as f64).exp()).sum();
                        (((row[t as usize] - m) as f64).exp() / z) as f32
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let cl = conf[rr.clone()].to_vec();
            out.push(Draft {
                draft_probs,
                base_logits: base_s,
                logits: lg,
                draft_ids: drafted[rr.clone()].to_vec(),
                confidence: cl.iter().map(|&z| 1.0 / (1.0 + (-z).exp())).collect(),
                confidence_logit: cl,
                head_hidden: hid_host[rr.start * dm..rr.end * dm].to_vec(),
            });
        }
        Ok(out)
    }
}

impl Draft {
    /// The first `n` confidences as the planner reads them: probabilities in `[0, 1]`, a
    /// non-finite value (a diverged drafter) read as 0.
    pub fn planner_confidences(&self, n: usize) -> Vec<f64> {
        self.confidence[..n.min(self.confidence.len())]
            .iter()
            .map(|&c| {
                if c.is_finite() {
                    f64::from(c).clamp(0.0, 1.0)
                } else {
                    0.0
                }
            })
            .collect()
    }
}

/// Index of the largest value (lowest index on ties).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}
