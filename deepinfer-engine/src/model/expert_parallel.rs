//! The expert-parallel forward: attention is data-parallel (each rank runs its own
//! sequences) and ranks meet at every MoE layer, where each (token row, routing slot) is
//! dispatched to the rank that holds its routed expert, computed there, and combined back.
//!
//! Every rank calls [`Model::forward_ep`] once per step, in lockstep: a rank with no
//! sequences passes an empty batch and still joins each layer's exchange. Results come back
//! in a fixed order and the weighted sum over a row's slots is taken in slot order on the
//! row's own rank, exactly as the single-rank `moe_experts` takes it, so with batch-invariant
//! kernels a rank's logits are bit-identical to the single-rank forward of its sequences.
//! Each rank computes only the routed experts an [`ExpertPlacement`] gives it (an expert may
//! have replicas on several ranks: each source rank spreads its rows for that expert over the
//! replicas in turn); the dense weights and the shared expert run on every rank.

use super::{BatchItem, Logits, Model, ModelError};
use deepinfer_kernels::{Backend, Communicator, ExpertWeights, TensorInfo, combine, dispatch};

type R<T> = Result<T, ModelError>;

/// One rank's side of an expert-parallel group.
pub struct ExpertParallel<'a> {
    /// This rank's end of the group's communicator.
    pub comm: &'a mut dyn Communicator,
    /// Where every routed expert of every layer has its replicas (the same on every rank).
    pub placement: &'a ExpertPlacement,
}

/// The ranks holding a replica of each routed expert, per layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertPlacement {
    ranks: usize,
    /// `[layer][expert]`: the ranks holding a replica.
    layers: Vec<Vec<Vec<usize>>>,
}

impl ExpertPlacement {
    /// `experts` routed experts of each of `layers` layers split over `ranks` ranks in
    /// contiguous runs (rank `r` holds experts `r·E/N ..`), one replica each.
    pub fn contiguous(layers: usize, experts: usize, ranks: usize) -> Self {
        let owners = contiguous_owners(experts, ranks);
        ExpertPlacement {
            ranks,
            layers: vec![owners.iter().map(|&r| vec![r]).collect(); layers],
        }
    }

    /// A placement from the replica ranks of every expert of every layer. Errors when an
    /// expert has no replica, a rank is outside `0..ranks`, or the layers differ in experts.
    pub fn from_replicas(ranks: usize, layers: Vec<Vec<Vec<usize>>>) -> Result<Self, ModelError> {
        let experts = layers.first().map_or(0, Vec::len);
        for (l, layer) in layers.iter().enumerate() {
            if layer.len() != experts {
                return Err(ModelError::Input(format!(
                    "layer {l} places {} experts, layer 0 {experts}",
                    layer.len()
                )));
            }
            for (e, reps) in layer.iter().enumerate() {
                if reps.is_empty() || reps.iter().any(|&r| r >= ranks) {
                    return Err(ModelError::Input(format!(
                        "layer {l}, expert {e}: replicas {reps:?} for {ranks} ranks"
                    )));
                }
            }
        }
        Ok(ExpertPlacement { ranks, layers })
    }

    /// Ranks in the group.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The ranks holding expert `e` of layer `l` (empty when out of range).
    pub fn replicas(&self, l: usize, e: usize) -> &[usize] {
        self.layers
            .get(l)
            .and_then(|x| x.get(e))
            .map_or(&[], Vec::as_slice)
    }
}

/// `experts` routed experts split over `ranks` ranks in contiguous runs (rank `r` holds
/// experts `r·E/N ..`), the placement without redundancy.
pub fn contiguous_owners(experts: usize, ranks: usize) -> Vec<usize> {
    (0..experts)
        .map(|e| e * ranks.max(1) / experts.max(1))
        .collect()
}

fn comm_err(e: deepinfer_kernels::CommError) -> ModelError {
    ModelError::Input(format!("expert-parallel exchange: {e}"))
}

impl ExpertParallel<'_> {
    fn check(&self, layers: usize, experts: usize) -> R<()> {
        let world = self.comm.world();
        let p = self.placement;
        if p.ranks != world {
            return Err(ModelError::Input(format!(
                "a placement over {} ranks in a group of {world}",
                p.ranks
            )));
        }
        if p.layers.len() != layers || p.layers.iter().any(|l| l.len() != experts) {
            return Err(ModelError::Input(format!(
                "the placement covers {} layer(s) of {} experts, the model has {layers} of {experts}",
                p.layers.len(),
                p.layers.first().map_or(0, Vec::len)
            )));
        }
        Ok(())
    }

    /// The routed-expert output `[S, D]` of this rank's rows `x` with routing `idx` / `wts`
    /// (`[S, k]`), computed across the group.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn routed<B: Backend>(
        &mut self,
        layer: usize,
        be: &B,
        x: &B::Tensor,
        idx: &B::Tensor,
        wts: &B::Tensor,
        experts: &[ExpertWeights<'_, B::Tensor>],
        limit: f32,
    ) -> R<B::Tensor> {
        let (s, d) = (x.shape()[0], x.shape()[1]);
        let k = idx.shape().get(1).copied().unwrap_or(0);
        let iv = be.download_i64(idx)?;
        let wv = be.download_f32(wts)?;
        let xv = be.download_f32(x)?;
        // Each used (row, slot): the expert id, then the row.
        let width = d + 1;
        let mut rows = Vec::new();
        let mut dest = Vec::new();
        // Rows for an expert go to its replicas in turn.
        let mut turn = vec![0usize; experts.len()];
        for r in 0..s {
            for j in 0..k {
                let e = iv[r * k + j];
                if e < 0 {
                    continue;
                }
                let reps = self.placement.replicas(layer, e as usize);
                let t = turn.get_mut(e as usize).ok_or_else(|| {
                    ModelError::Input(format!("routed expert {e} outside the layer's experts"))
                })?;
                let owner = *reps.get(*t % reps.len().max(1)).ok_or_else(|| {
                    ModelError::Input(format!("routed expert {e} of layer {layer} has no replica"))
                })?;
                *t += 1;
                dest.push(owner);
                rows.push(e as f32);
                rows.extend_from_slice(&xv[r * d..(r + 1) * d]);
            }
        }
        let (recv, plan) = dispatch(self.comm, &rows, width, &dest).map_err(comm_err)?;
        let n = recv.len() / width;
        let y = if n == 0 {
            Vec::new()
        } else {
            let ids: Vec<i64> = recv.chunks(width).map(|c| c[0] as i64).collect();
            let me = self.comm.rank();
            if let Some(&bad) = ids
                .iter()
                .find(|&&e| !self.placement.replicas(layer, e as usize).contains(&me))
            {
                return Err(ModelError::Input(format!(
                    "rank {} was sent expert {bad}, which it does not hold",
                    self.comm.rank()
                )));
            }
            let xr: Vec<f32> = recv.chunks(width).flat_map(|c| c[1..].to_vec()).collect();
            // One slot of weight 1 per row: `moe_experts` gives each row its expert's output
            // as is (0 + 1·y = y).
            let out = be.moe_experts(
                &be.upload_f32(&xr, &[n, d])?,
                &be.upload_i64(&ids, &[n, 1])?,
                &be.upload_f32(&vec![1.0; n], &[n, 1])?,
                experts,
                limit,
            )?;
            be.download_f32(&out)?
        };
        let back = combine(self.comm, &y, d, &plan).map_err(comm_err)?;
        // The weighted sum over each row's slots, in slot order, as `moe_experts` takes it.
        let mut out = vec![0.0f32; s * d];
        let mut at = 0;
        for r in 0..s {
            let o = &mut out[r * d..(r + 1) * d];
            for j in 0..k {
                if iv[r * k + j] < 0 {
                    continue;
                }
                let w = wv[r * k + j];
                for (ov, yv) in o.iter_mut().zip(&back[at * d..(at + 1) * d]) {
                    *ov += w * yv;
                }
                at += 1;
            }
        }
        Ok(be.upload_f32(&out, &[s, d])?)
    }

    /// A layer's exchange for a rank without rows of its own: it sends nothing and still
    /// serves its experts for the others.
    fn idle_layer<B: Backend>(
        &mut self,
        layer: usize,
        be: &B,
        experts: &[ExpertWeights<'_, B::Tensor>],
        d: usize,
        limit: f32,
    ) -> R<()> {
        let x = be.upload_f32(&[], &[0, d])?;
        let idx = be.upload_i64(&[], &[0, 1])?;
        let w = be.upload_f32(&[], &[0, 1])?;
        self.routed(layer, be, &x, &idx, &w, experts, limit)
            .map(|_| ())
    }
}

impl<B: Backend> Model<B>
where
    B::Tensor: Clone,
{
    /// [`Model::forward`] as one rank of an expert-parallel group (see the module docs).
    /// `items` may be empty: the rank then serves its experts for the others and returns no
    /// logits. Every rank of the group must call it for the same step. Not available with
    /// the decoder-side bounded replay (its layers run twice on some rows).
    pub fn forward_ep(
        &self,
        items: &mut [BatchItem<'_, B::Tensor>],
        which: Logits,
        ep: &mut ExpertParallel<'_>,
    ) -> R<Vec<Vec<f32>>> {
        ep.check(self.cfg.num_layers, self.cfg.n_routed_experts)?;
        if self.decoder_replay {
            return Err(ModelError::Input(
                "the expert-parallel forward does not run with decoder-side bounded replay".into(),
            ));
        }
        if items.is_empty() {
            let lim = self.cfg.swiglu_limit as f32;
            for (l, lw) in self.w.layers.iter().enumerate() {
                let experts = expert_list(&lw.ffn.experts);
                ep.idle_layer(l, &self.be, &experts, self.cfg.hidden_size, lim)?;
            }
            return Ok(Vec::new());
        }
        super::sync::check_host_read("Model::forward_ep (logits to the host)")?;
        let (h, rows) = self.forward_hidden_ep(items, ep)?;
        self.head_logits(&h, rows, which)
    }
}

/// The routed experts of a layer as `moe_experts` takes them.
pub(crate) fn expert_list<T>(experts: &[(T, T, T)]) -> Vec<ExpertWeights<'_, T>> {
    experts
        .iter()
        .map(|(g, u, d)| ExpertWeights {
            gate: g,
            up: u,
            down: d,
        })
        .collect()
}

impl<B: Backend> Model<B>
where
    B::Tensor: Clone,
{
    /// The batch as in-process expert-parallel ranks (one thread per rank of `placement`):
    /// item `i` runs on rank `i mod ranks`, each routed expert where `placement` puts it,
    /// and the logits come back in item order (bit-identical to
    /// [`Model::forward`] with batch-invariant kernels). The rank threads use the kernels'
    /// thread pool, so the caller must not be one of that pool's threads (it would wait on
    /// ranks that need it): that is an error.
    pub fn forward_expert_parallel(
        &self,
        items: Vec<BatchItem<'_, B::Tensor>>,
        which: Logits,
        placement: &ExpertPlacement,
    ) -> R<Vec<Vec<f32>>> {
        let ranks = placement.ranks();
        if ranks == 0 {
            return Err(ModelError::Input("a placement over 0 ranks".into()));
        }
        if rayon::current_thread_index().is_some() {
            return Err(ModelError::Input(
                "the expert-parallel forward cannot run on a thread of rayon's pool".into(),
            ));
        }
        let n = items.len();
        let mut per: Vec<Vec<BatchItem<'_, B::Tensor>>> = (0..ranks).map(|_| Vec::new()).collect();
        for (i, it) in items.into_iter().enumerate() {
            per[i % ranks].push(it);
        }
        let comms =
            deepinfer_kernels::LocalGroup::ranks(ranks, std::time::Duration::from_secs(600));
        let outs: Vec<R<Vec<Vec<f32>>>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .zip(per.iter_mut())
                .map(|(mut comm, mine)| {
                    s.spawn(move || {
                        let mut ep = ExpertParallel {
                            comm: &mut comm,
                            placement,
                        };
                        self.forward_ep(mine, which, &mut ep)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(ModelError::Input("an expert-parallel rank panicked".into()))
                    })
                })
                .collect()
        });
        let mut by_rank = Vec::with_capacity(ranks);
        for o in outs {
            by_rank.push(o?.into_iter());
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(by_rank[i % ranks].next().ok_or_else(|| {
                ModelError::Input("an expert-parallel rank returned too few rows".into())
            })?);
        }
        Ok(out)
    }
}
