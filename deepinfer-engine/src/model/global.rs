//! The global state (compressed entries and indexer keys) in paged blocks.
//!
//! A model owns one [`GlobalCache`]: per layer and per part (entries, indexer keys), a pool of
//! blocks indexed by block id, each block holding the entries of `block_tokens` consecutive
//! token positions (`block_tokens / ratio` entries of a layer with compression ratio `ratio`).
//! The block ids come from a `deepinfer_kv::BlockManager`: every sequence's [`GlobalTable`] is
//! one kv sequence whose tokens are the positions its compressors have pooled so far, so the
//! kv block table is the sequence's block table here.
//!
//! Cloning a table (the runtime snapshots states for rollback and prefix reuse) forks the kv
//! sequence: full blocks are shared by reference count, the partly filled last block is copied
//! (the kv `CopyOp`). Dropping a table frees its kv sequence, so no block outlives the states
//! that reference it. Only a table's exclusive last block is ever written, so shared blocks
//! never change under a snapshot.

use super::ModelError;
use deepinfer_kernels::{Backend, TensorInfo};
use deepinfer_kv::{AllocateOptions, BlockId, BlockManager, BlockManagerConfig};
use std::sync::{Arc, Mutex, MutexGuard};

type R<T> = Result<T, ModelError>;

/// Which global part a tensor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalPart {
    /// Compressed KV entries `[T, d]`.
    Entries = 0,
    /// Indexer keys `[T, di]`.
    IndexKeys = 1,
}

/// A per-model pool of global-state blocks, addressed by `deepinfer-kv` block ids.
#[derive(Debug)]
pub struct GlobalCache<T> {
    kv: BlockManager,
    block_tokens: usize,
    ratios: Vec<usize>,
    /// `[part][layer][block id]`: the rows written into that block so far.
    blocks: [Vec<Vec<Option<T>>>; 2],
    next_seq: u64,
}

impl<T: Clone> GlobalCache<T> {
    /// A pool of `num_blocks` blocks of `block_tokens` positions for layers with the given
    /// compression `ratios` (0 for a layer without global state). `block_tokens` must be a
    /// multiple of every nonzero ratio.
    pub fn new(num_blocks: usize, block_tokens: usize, ratios: &[usize]) -> R<Self> {
        if let Some(&r) = ratios
            .iter()
            .find(|&&r| r > 0 && !block_tokens.is_multiple_of(r))
        {
            return Err(ModelError::Input(format!(
                "global block of {block_tokens} positions is not a multiple of ratio {r}"
            )));
        }
        let mut cfg = BlockManagerConfig::new(num_blocks, block_tokens);
        cfg.enable_prefix_caching = false;
        let kv = BlockManager::new(cfg).map_err(kv_err)?;
        let layers = ratios.len();
        Ok(GlobalCache {
            kv,
            block_tokens,
            ratios: ratios.to_vec(),
            blocks: [vec![Vec::new(); layers], vec![Vec::new(); layers]],
            next_seq: 0,
        })
    }

    /// Positions per block.
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// The kv block manager that hands out the block ids.
    pub fn block_manager(&self) -> &BlockManager {
        &self.kv
    }

    /// Blocks currently referenced by some sequence.
    pub fn used_blocks(&self) -> usize {
        self.kv.usage().used
    }

    /// Block tensors currently held (all parts and layers).
    pub fn held_tensors(&self) -> usize {
        self.blocks
            .iter()
            .flatten()
            .flatten()
            .filter(|t| t.is_some())
            .count()
    }

    fn per_block(&self, layer: usize) -> R<usize> {
        match self.ratios.get(layer) {
            Some(&r) if r > 0 => Ok(self.block_tokens / r),
            _ => Err(ModelError::Input(format!(
                "layer {layer} keeps no global state"
            ))),
        }
    }
}

fn kv_err(e: deepinfer_kv::KvError) -> ModelError {
    match e {
        deepinfer_kv::KvError::OutOfBlocks { needed, available } => {
            ModelError::GlobalCacheFull { needed, available }
        }
        e => ModelError::Input(format!("global cache blocks: {e}")),
    }
}

pub(crate) fn lock_cache<T>(m: &Mutex<GlobalCache<T>>) -> MutexGuard<'_, GlobalCache<T>> {
    lock(m)
}

fn lock<T>(m: &Mutex<GlobalCache<T>>) -> MutexGuard<'_, GlobalCache<T>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A model's shared global cache.
pub type SharedGlobalCache<T> = Arc<Mutex<GlobalCache<T>>>;

/// One sequence's view of the global state: its kv sequence (block table) and the number of
/// entries each layer holds per part.
#[derive(Debug)]
pub struct GlobalTable<T> {
    cache: Option<SharedGlobalCache<T>>,
    seq: Option<u64>,
    counts: [Vec<usize>; 2],
}

impl<T: Clone> GlobalTable<T> {
    /// An empty table over `cache` (`None`: a state that cannot hold global entries).
    pub fn new(layers: usize, cache: Option<SharedGlobalCache<T>>) -> Self {
        GlobalTable {
            cache,
            seq: None,
            counts: [vec![0; layers], vec![0; layers]],
        }
    }

    /// Entries layer `layer` holds in `part`.
    pub fn count(&self, part: GlobalPart, layer: usize) -> usize {
        self.counts[part as usize].get(layer).copied().unwrap_or(0)
    }

    /// The sequence's block ids (from `deepinfer-kv`); empty before the first entry.
    pub fn block_ids(&self) -> Vec<BlockId> {
        match (&self.cache, self.seq) {
            (Some(c), Some(s)) => lock(c)
                .kv
                .block_table(s)
                .map(<[_]>::to_vec)
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    fn cache(&self) -> R<&SharedGlobalCache<T>> {
        self.cache.as_ref().ok_or_else(|| {
            ModelError::Input(
                "this state has no global cache (make states with Model::new_state)".into(),
            )
        })
    }

    /// Append `rows` (`[n, ..]`) after the layer's existing entries of `part`.
    pub fn append<B: Backend<Tensor = T>>(
        &mut self,
        be: &B,
        part: GlobalPart,
        layer: usize,
        rows: T,
    ) -> R<()>
    where
        T: TensorInfo,
    {
        let n = rows.shape()[0];
        if n == 0 {
            return Ok(());
        }
        let cache = self.cache()?.clone();
        let mut g = lock(&cache);
        let per_block = g.per_block(layer)?;
        let first = self.count(part, layer);
        let need = (first + n) * g.ratios[layer];
        // The kv sequence covers the positions pooled so far (the furthest layer's).
        match self.seq {
            None => {
                let id = g.next_seq;
                g.next_seq += 1;
                g.kv.allocate(id, &vec![0; need], AllocateOptions::default())
                    .map_err(kv_err)?;
                self.seq = Some(id);
            }
            Some(s) => {
                let have = g.kv.tokens(s).map_err(kv_err)?.len();
                if have < need {
                    let mut slots = Vec::new();
                    g.kv.append(s, &vec![0; need - have], &mut slots)
                        .map_err(kv_err)?;
                }
            }
        }
        let seq = self.seq.unwrap_or_default();
        let table = g.kv.block_table(seq).map_err(kv_err)?.to_vec();
        let mut done = 0;
        while done < n {
            let e = first + done;
            let (b, off) = (e / per_block, e % per_block);
            let take = (per_block - off).min(n - done);
            let id = *table
                .get(b)
                .ok_or_else(|| ModelError::Input(format!("global block {b} not allocated")))?;
            let piece = if take == n {
                rows.clone()
            } else {
                be.narrow(&rows, 0, done, take)?
            };
            let slots = &mut g.blocks[part as usize][layer];
            if slots.len() <= id as usize {
                slots.resize(id as usize + 1, None);
            }
            let new = if off == 0 {
                piece
            } else {
                // Only an exclusive block is written: shared ones belong to snapshots too.
                if g.kv.pool().ref_count(id).map_err(kv_err)? != 1 {
                    return Err(ModelError::Input(format!(
                        "global block {id} is shared and cannot be written"
                    )));
                }
                let old = g.blocks[part as usize][layer][id as usize]
                    .as_ref()
                    .filter(|t| t.shape()[0] >= off)
                    .ok_or_else(|| ModelError::Input(format!("global block {id} is short")))?;
                let old = if old.shape()[0] == off {
                    old.clone()
                } else {
                    be.narrow(old, 0, 0, off)?
                };
                be.concat(&[&old, &piece], 0)?
            };
            g.blocks[part as usize][layer][id as usize] = Some(new);
            done += take;
        }
        self.counts[part as usize][layer] = first + n;
        Ok(())
    }

    /// The layer's entries of `part` as one contiguous tensor, read through the block table
    /// (`None` when it holds none).
    pub fn gather<B: Backend<Tensor = T>>(
        &self,
        be: &B,
        part: GlobalPart,
        layer: usize,
    ) -> R<Option<T>>
    where
        T: TensorInfo,
    {
        let count = self.count(part, layer);
        if count == 0 {
            return Ok(None);
        }
        let g = lock(self.cache()?);
        let per_block = g.per_block(layer)?;
        let table =
            g.kv.block_table(self.seq.unwrap_or_default())
                .map_err(kv_err)?;
        let mut pieces = Vec::with_capacity(count.div_ceil(per_block));
        for b in 0..count.div_ceil(per_block) {
            let rows = per_block.min(count - b * per_block);
            let t = table
                .get(b)
                .and_then(|&id| g.blocks[part as usize][layer].get(id as usize))
                .and_then(Option::as_ref)
                .filter(|t| t.shape()[0] >= rows)
                .ok_or_else(|| ModelError::Input(format!("global block {b} missing")))?;
            pieces.push(if t.shape()[0] == rows {
                t.clone()
            } else {
                be.narrow(t, 0, 0, rows)?
            });
        }
        if pieces.len() == 1 {
            return Ok(pieces.pop());
        }
        let refs: Vec<&T> = pieces.iter().collect();
        Ok(Some(be.concat(&refs, 0)?))
    }
}

impl<T: Clone> GlobalTable<T> {
    /// A snapshot of the table: forks the kv sequence (full blocks shared by reference count,
    /// the partly filled last block copied). Fails with [`ModelError::GlobalCacheFull`] when
    /// the pool has no free block for that copy; nothing changes then.
    pub fn try_clone(&self) -> R<Self> {
        let mut seq = None;
        if let (Some(c), Some(s)) = (&self.cache, self.seq) {
            let mut g = lock(c);
            let id = g.next_seq;
            let copy = g.kv.fork(s, id).map_err(kv_err)?;
            g.next_seq += 1;
            if let Some(op) = copy {
                for part in g.blocks.iter_mut() {
                    for layer in part.iter_mut() {
                        let src = layer.get(op.src as usize).cloned().flatten();
                        if layer.len() <= op.dst as usize {
                            layer.resize(op.dst as usize + 1, None);
                        }
                        layer[op.dst as usize] = src;
                    }
                }
            }
            seq = Some(id);
        }
        Ok(GlobalTable {
            cache: self.cache.clone(),
            seq,
            counts: self.counts.clone(),
        })
    }
}

impl<T: Clone> Clone for GlobalTable<T> {
    /// [`GlobalTable::try_clone`], for code that sized the pool itself.
    ///
    /// Panics if the block pool has no free block left for the copy; the runtime uses
    /// [`GlobalTable::try_clone`] (through [`crate::SeqState::try_clone`]) and never panics.
    fn clone(&self) -> Self {
        #[allow(clippy::expect_used)]
        self.try_clone()
            .expect("global cache block pool exhausted while snapshotting a sequence")
    }
}

impl<T> Drop for GlobalTable<T> {
    fn drop(&mut self) {
        if let (Some(c), Some(s)) = (&self.cache, self.seq) {
            let mut g = c.lock().unwrap_or_else(|p| p.into_inner());
            let table = g.kv.block_table(s).map(<[_]>::to_vec).unwrap_or_default();
            let _ = g.kv.free(s);
            // Blocks no sequence holds any more give their tensors back.
            for id in table {
                if g.kv.pool().ref_count(id) == Ok(0) {
                    for part in g.blocks.iter_mut() {
                        for layer in part.iter_mut() {
                            if let Some(slot) = layer.get_mut(id as usize) {
                                *slot = None;
                            }
                        }
                    }
                }
            }
        }
    }
}
