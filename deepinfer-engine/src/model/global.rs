//! The global state (compressed entries and indexer keys) in paged blocks.
//!
//! A block holds the entries of `block_tokens` consecutive token positions
//! (`block_tokens / ratio` entries of a layer with compression ratio `ratio`). A sequence's
//! [`GlobalTable`] reads and writes its entries block by block in one of two stores:
//!
//! - **the engine's pool**, a [`GlobalCache`] indexed by the block ids of the sequence's
//!   `deepinfer-kv` block table, the scheduler's. The scheduler owns the ids (allocation,
//!   sharing by reference count, copy-on-write of a forked tail, the prefix cache's hash
//!   chains); the cache only holds the tensors at those ids. A block the scheduler shares is
//!   full and never written again: a table writes only past its `present` positions (entries
//!   a prefix hit found in the pool) and only into blocks its sequence owns alone.
//! - **its own blocks**, for a state outside an engine (scoring, calibration) and for a
//!   detached snapshot kept in a slower cache tier ([`GlobalTable::detached`]).
//!
//! A clone of a pool table is a rollback point: it names the same blocks and remembers how
//! many entries it held, so restoring it forgets what was written since.

use super::ModelError;
use deepinfer_kernels::{Backend, TensorInfo};
use deepinfer_kv::BlockId;
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

/// `[part][layer]` tensors of one block.
type BlockRows<T> = [Vec<Option<T>>; 2];

/// The engine's pool of global-state blocks, addressed by the scheduler's `deepinfer-kv`
/// block ids. Tensors are made as blocks fill and replaced when a block id is reused, so the
/// pool never holds more than `num_blocks` blocks.
#[derive(Debug)]
pub struct GlobalCache<T> {
    num_blocks: usize,
    block_tokens: usize,
    /// `[part][layer][block id]`: the rows written into that block.
    blocks: [Vec<Vec<Option<T>>>; 2],
}

impl<T: Clone> GlobalCache<T> {
    /// A pool of `num_blocks` blocks of `block_tokens` positions for layers with the given
    /// compression `ratios` (0 for a layer without global state). `block_tokens` must be a
    /// multiple of every nonzero ratio.
    pub fn new(num_blocks: usize, block_tokens: usize, ratios: &[usize]) -> R<Self> {
        check_block_tokens(block_tokens, ratios)?;
        let layers = ratios.len();
        Ok(GlobalCache {
            num_blocks,
            block_tokens,
            blocks: [vec![Vec::new(); layers], vec![Vec::new(); layers]],
        })
    }

    /// Positions per block.
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Block ids the pool addresses (`0..num_blocks`).
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
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

    /// Copy block `src` to `dst` in every part and layer (the copy-on-write of a forked
    /// sequence's partly filled last block; the kv `CopyOp` of a step plan).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId) -> R<()> {
        self.check_id(src)?;
        self.check_id(dst)?;
        for layer in self.blocks.iter_mut().flatten() {
            let t = layer.get(src as usize).cloned().flatten();
            *slot(layer, dst) = t;
        }
        Ok(())
    }

    fn check_id(&self, id: BlockId) -> R<()> {
        if (id as usize) < self.num_blocks {
            Ok(())
        } else {
            Err(ModelError::Input(format!(
                "global block {id} is outside the pool of {} blocks",
                self.num_blocks
            )))
        }
    }
}

fn slot<T>(layer: &mut Vec<Option<T>>, id: BlockId) -> &mut Option<T> {
    let i = id as usize;
    if layer.len() <= i {
        layer.resize_with(i + 1, || None);
    }
    &mut layer[i]
}

fn check_block_tokens(block_tokens: usize, ratios: &[usize]) -> R<()> {
    match ratios
        .iter()
        .find(|&&r| r > 0 && !block_tokens.is_multiple_of(r))
    {
        _ if block_tokens == 0 => Err(ModelError::Input(
            "a global block needs at least one position".into(),
        )),
        Some(r) => Err(ModelError::Input(format!(
            "global block of {block_tokens} positions is not a multiple of ratio {r}"
        ))),
        None => Ok(()),
    }
}

pub(crate) fn lock_cache<T>(m: &Mutex<GlobalCache<T>>) -> MutexGuard<'_, GlobalCache<T>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A model's shared global cache.
pub type SharedGlobalCache<T> = Arc<Mutex<GlobalCache<T>>>;

#[derive(Debug, Clone)]
enum Store<T> {
    /// The table's own blocks, by logical block index.
    Own {
        block_tokens: usize,
        blocks: Vec<BlockRows<T>>,
    },
    /// Blocks of the engine's pool at the sequence's block ids; positions below `present`
    /// already hold their entries (a prefix hit) and are not written again.
    Pool {
        cache: SharedGlobalCache<T>,
        ids: Vec<BlockId>,
        present: usize,
    },
}

/// One sequence's global state: where its blocks are and how many entries each layer holds
/// per part.
#[derive(Debug, Clone)]
pub struct GlobalTable<T> {
    ratios: Arc<[usize]>,
    store: Store<T>,
    counts: [Vec<usize>; 2],
}

impl<T: Clone + TensorInfo> GlobalTable<T> {
    /// An empty table with its own blocks of `block_tokens` positions, for layers with the
    /// given compression `ratios`.
    pub fn new(ratios: Arc<[usize]>, block_tokens: usize) -> R<Self> {
        check_block_tokens(block_tokens, &ratios)?;
        let layers = ratios.len();
        Ok(GlobalTable {
            ratios,
            store: Store::Own {
                block_tokens,
                blocks: Vec::new(),
            },
            counts: [vec![0; layers], vec![0; layers]],
        })
    }

    /// Entries layer `layer` holds in `part`.
    pub fn count(&self, part: GlobalPart, layer: usize) -> usize {
        self.counts[part as usize].get(layer).copied().unwrap_or(0)
    }

    /// The pool block ids the table reads and writes (empty for a table with its own
    /// blocks).
    pub fn block_ids(&self) -> &[BlockId] {
        match &self.store {
            Store::Pool { ids, .. } => ids,
            Store::Own { .. } => &[],
        }
    }

    /// Set the entries each layer holds, `[part][layer]` (a state resumed at a position whose
    /// entries are already in the pool; see `Model::windowless_state`).
    pub(crate) fn set_counts(&mut self, counts: [Vec<usize>; 2]) {
        self.counts = counts;
    }

    /// Whether the table reads and writes the engine's pool.
    pub fn in_pool(&self) -> bool {
        matches!(self.store, Store::Pool { .. })
    }

    /// Move the table onto `cache` at the sequence's block table `ids`, where the entries of
    /// the first `present` positions already are (the scheduler's prefix hit; they are never
    /// written again). The counts stay: a state resumed from a snapshot replays its tokens
    /// up to `present` reading the pool's entries.
    pub fn attach(&mut self, cache: SharedGlobalCache<T>, ids: &[BlockId], present: usize) {
        self.store = Store::Pool {
            cache,
            ids: ids.to_vec(),
            present,
        };
    }

    /// The sequence's block table grew or changed (a new step's plan): read and write these
    /// ids from now on.
    pub fn set_block_ids(&mut self, new: &[BlockId]) {
        if let Store::Pool { ids, .. } = &mut self.store {
            ids.clear();
            ids.extend_from_slice(new);
        }
    }

    fn per_block(&self, layer: usize) -> R<usize> {
        let bt = match &self.store {
            Store::Own { block_tokens, .. } => *block_tokens,
            Store::Pool { cache, .. } => lock_cache(cache).block_tokens,
        };
        match self.ratios.get(layer) {
            Some(&r) if r > 0 => Ok(bt / r),
            _ => Err(ModelError::Input(format!(
                "layer {layer} keeps no global state"
            ))),
        }
    }

    /// Append `rows` (`[n, ..]`) after the layer's existing entries of `part`.
    pub fn append<B: Backend<Tensor = T>>(
        &mut self,
        be: &B,
        part: GlobalPart,
        layer: usize,
        rows: T,
    ) -> R<()> {
        let n = rows.shape()[0];
        if n == 0 {
            return Ok(());
        }
        let per_block = self.per_block(layer)?;
        let first = self.count(part, layer);
        // Entries a prefix hit found in the pool are already there.
        let skip = match &self.store {
            Store::Pool { present, .. } => {
                (present / self.ratios[layer]).saturating_sub(first).min(n)
            }
            Store::Own { .. } => 0,
        };
        let mut done = skip;
        while done < n {
            let e = first + done;
            let (b, off) = (e / per_block, e % per_block);
            let take = (per_block - off).min(n - done);
            let piece = if take == n {
                rows.clone()
            } else {
                be.narrow(&rows, 0, done, take)?
            };
            self.write(be, part, layer, b, off, piece)?;
            done += take;
        }
        self.counts[part as usize][layer] = first + n;
        Ok(())
    }

    /// Put `piece` at entry offset `off` of logical block `b` (keeping the block's first
    /// `off` rows).
    fn write<B: Backend<Tensor = T>>(
        &mut self,
        be: &B,
        part: GlobalPart,
        layer: usize,
        b: usize,
        off: usize,
        piece: T,
    ) -> R<()> {
        let (p, layers) = (part as usize, self.ratios.len());
        let join = |old: Option<&T>| -> R<T> {
            if off == 0 {
                return Ok(piece.clone());
            }
            let old = old
                .filter(|t| t.shape()[0] >= off)
                .ok_or_else(|| ModelError::Input(format!("global block {b} is short")))?;
            let old = if old.shape()[0] == off {
                old.clone()
            } else {
                be.narrow(old, 0, 0, off)?
            };
            Ok(be.concat(&[&old, &piece], 0)?)
        };
        match &mut self.store {
            Store::Own { blocks, .. } => {
                if blocks.len() <= b {
                    blocks.resize_with(b + 1, || [vec![None; layers], vec![None; layers]]);
                }
                let s = &mut blocks[b][p][layer];
                *s = Some(join(s.as_ref())?);
            }
            Store::Pool { cache, ids, .. } => {
                let id = *ids.get(b).ok_or_else(|| {
                    ModelError::Input(format!(
                        "global block {b} is not in the sequence's block table ({} blocks)",
                        ids.len()
                    ))
                })?;
                let mut g = lock_cache(cache);
                g.check_id(id)?;
                let s = slot(&mut g.blocks[p][layer], id);
                *s = Some(join(s.as_ref())?);
            }
        }
        Ok(())
    }

    /// The layer's entries of `part` as one contiguous tensor, read through the blocks
    /// (`None` when it holds none).
    pub fn gather<B: Backend<Tensor = T>>(
        &self,
        be: &B,
        part: GlobalPart,
        layer: usize,
    ) -> R<Option<T>> {
        let count = self.count(part, layer);
        if count == 0 {
            return Ok(None);
        }
        let per_block = self.per_block(layer)?;
        let nblocks = count.div_ceil(per_block);
        let p = part as usize;
        let mut pieces = Vec::with_capacity(nblocks);
        let guard = match &self.store {
            Store::Pool { cache, .. } => Some(lock_cache(cache)),
            Store::Own { .. } => None,
        };
        for b in 0..nblocks {
            let rows = per_block.min(count - b * per_block);
            let t = match (&self.store, &guard) {
                (Store::Own { blocks, .. }, _) => blocks.get(b).and_then(|r| r[p][layer].as_ref()),
                (Store::Pool { ids, .. }, Some(g)) => ids
                    .get(b)
                    .and_then(|&id| g.blocks[p][layer].get(id as usize))
                    .and_then(Option::as_ref),
                _ => None,
            };
            let t = t
                .filter(|t| t.shape()[0] >= rows)
                .ok_or_else(|| ModelError::Input(format!("global block {b} missing")))?;
            pieces.push(if t.shape()[0] == rows {
                t.clone()
            } else {
                be.narrow(t, 0, 0, rows)?
            });
        }
        drop(guard);
        if pieces.len() == 1 {
            return Ok(pieces.pop());
        }
        let refs: Vec<&T> = pieces.iter().collect();
        Ok(Some(be.concat(&refs, 0)?))
    }

    /// A copy with its own blocks (sharing the tensors, not the pool's block ids): a snapshot
    /// that stays valid after the scheduler gives its blocks to other sequences.
    pub fn detached(&self) -> Self {
        let Store::Pool { cache, ids, .. } = &self.store else {
            return self.clone();
        };
        let g = lock_cache(cache);
        let layers = self.ratios.len();
        let blocks = ids
            .iter()
            .map(|&id| {
                let at = |p: usize| -> Vec<Option<T>> {
                    (0..layers)
                        .map(|l| g.blocks[p][l].get(id as usize).cloned().flatten())
                        .collect()
                };
                [at(0), at(1)]
            })
            .collect();
        GlobalTable {
            ratios: self.ratios.clone(),
            store: Store::Own {
                block_tokens: g.block_tokens,
                blocks,
            },
            counts: self.counts.clone(),
        }
    }

    /// Write this table's entries of the logical pool blocks `(index, id)` into `cache` at
    /// `id` (a prefix brought back from a slower tier into blocks the scheduler imported).
    /// Every named block must be full in this table.
    pub fn write_blocks<B: Backend<Tensor = T>>(
        &self,
        be: &B,
        cache: &SharedGlobalCache<T>,
        blocks: &[(usize, BlockId)],
    ) -> R<()> {
        let bt = lock_cache(cache).block_tokens;
        for part in [GlobalPart::Entries, GlobalPart::IndexKeys] {
            for layer in 0..self.ratios.len() {
                let r = self.ratios[layer];
                if r == 0 {
                    continue;
                }
                let Some(all) = self.gather(be, part, layer)? else {
                    continue;
                };
                let per = bt / r;
                let mut g = lock_cache(cache);
                for &(index, id) in blocks {
                    g.check_id(id)?;
                    if (index + 1) * per > all.shape()[0] {
                        return Err(ModelError::Input(format!(
                            "the state holds no full block {index} to import"
                        )));
                    }
                    let t = be.narrow(&all, 0, index * per, per)?;
                    *slot(&mut g.blocks[part as usize][layer], id) = Some(t);
                }
            }
        }
        Ok(())
    }
}
