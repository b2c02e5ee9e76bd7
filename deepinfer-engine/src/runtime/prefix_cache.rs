//! The model states of cached prompt prefixes, in `deepinfer-kv`'s host and persistent tiers.
//!
//! `deepinfer-kv` decides *which* prompt tokens a request may reuse (whole blocks, the hit
//! rule); the model's exact state at the end of such a prefix (window rows, open compressor
//! rows, the Engram look-back, the drafter's windows and the global entries) is what lets the
//! forward resume there. States are kept at block-aligned prefix lengths, keyed by kv's
//! chained block hash of the prefix (seeded with the model's state identity, so states of
//! different models, backends or cache formats never share a key), and the tokens are
//! compared on every hit, so a collision cannot leak a state.
//!
//! - **Host tier**: a [`WindowStateStore`] bounded in bytes and entries, least recently used
//!   out.
//! - **Persistent tier** (optional): every state put in the host tier is also written, as
//!   bytes ([`Model::encode_state`]), to a [`PersistentStore`] by a writer thread (atomic,
//!   checksummed files; lifetimes per traffic class; LRU reclaim over its capacity). A later
//!   process with the same identity finds a returning prompt's prefix there; a damaged,
//!   truncated, expired or foreign file is a miss and the prefix is recomputed.
//!
//! When a request resumes at position `p`, the longest state at or below `p` is cloned and
//! the tokens between it and `p` are replayed in the same forward call; without one the
//! whole prefix is replayed. Either way the state is exact.

use crate::model::state_bytes;
use crate::{Model, SeqState};
use deepinfer_kernels::Backend;
use deepinfer_kv::{
    BlockHash, BlockHasher, ExtraKeys, HashAlgo, PersistentStore, PersistentStoreConfig, Tier,
    TrafficClass, WindowStateStore,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

struct Entry<T> {
    tokens: Vec<u32>,
    state: SeqState<T>,
}

/// Where the persistent tier lives and how large it may grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DiskTierConfig {
    pub dir: PathBuf,
    pub capacity_bytes: u64,
}

/// Counters of the persistent tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DiskCounters {
    /// States written.
    pub writes: u64,
    /// Writes that failed (the state stays in the host tier only).
    pub write_errors: u64,
    /// States loaded from disk.
    pub loads: u64,
    /// Files found but unusable (damaged, foreign, not matching the tokens).
    pub rejected: u64,
}

type WriteJob = (BlockHash, TrafficClass, Vec<u8>);

struct DiskTier {
    store: Arc<Mutex<PersistentStore>>,
    identity: u64,
    tx: Option<mpsc::Sender<WriteJob>>,
    writer: Option<JoinHandle<()>>,
    writes: Arc<AtomicU64>,
    write_errors: Arc<AtomicU64>,
    loads: u64,
    rejected: u64,
}

impl DiskTier {
    fn open(cfg: &DiskTierConfig, identity: u64) -> Result<Self, deepinfer_kv::KvError> {
        let store = Arc::new(Mutex::new(PersistentStore::open(
            PersistentStoreConfig::new(&cfg.dir, cfg.capacity_bytes),
        )?));
        let (tx, rx) = mpsc::channel::<WriteJob>();
        let (writes, write_errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (s, w, e) = (store.clone(), writes.clone(), write_errors.clone());
        // Files are written off the step loop: an fsync per state would stall every step.
        let writer = std::thread::Builder::new()
            .name("deepinfer-kv-disk".into())
            .spawn(move || {
                for (hash, class, bytes) in rx {
                    let mut st = s.lock().unwrap_or_else(|p| p.into_inner());
                    match st.put(hash, class, &bytes) {
                        Ok(()) => w.fetch_add(1, Ordering::Relaxed),
                        Err(err) => {
                            tracing::warn!("kv cache dir: {err}");
                            e.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
            .map_err(|e| deepinfer_kv::KvError::Io {
                path: cfg.dir.clone(),
                reason: format!("writer thread: {e}"),
            })?;
        Ok(Self {
            store,
            identity,
            tx: Some(tx),
            writer: Some(writer),
            writes,
            write_errors,
            loads: 0,
            rejected: 0,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PersistentStore> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until every queued state is on disk.
    fn flush(&mut self) {
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        self.flush();
    }
}

/// The prefix states of one engine: host tier, optional persistent tier.
pub(crate) struct PrefixCache<T> {
    block: usize,
    hasher: BlockHasher,
    host: WindowStateStore<Entry<T>>,
    max_entries: usize,
    disk: Option<DiskTier>,
    chain: Vec<BlockHash>,
}

impl<T: Clone + deepinfer_kernels::TensorInfo> PrefixCache<T> {
    /// States keyed on `block`-token boundaries; the host tier holds at most `max_entries`
    /// states and `host_bytes` bytes (0 of either: no caching). `identity` seeds the keys
    /// (see [`Model::state_identity`]); `disk` adds the persistent tier.
    pub(crate) fn new(
        block: usize,
        host_bytes: u64,
        max_entries: usize,
        identity: u64,
        disk: Option<&DiskTierConfig>,
    ) -> Result<Self, deepinfer_kv::KvError> {
        Ok(Self {
            block: block.max(1),
            hasher: BlockHasher::new(HashAlgo::Xxh3_128, identity),
            host: WindowStateStore::new(if max_entries == 0 { 0 } else { host_bytes }),
            max_entries,
            disk: disk.map(|d| DiskTier::open(d, identity)).transpose()?,
            chain: Vec::new(),
        })
    }

    fn hash_chain(&mut self, tokens: &[u32]) {
        self.chain.clear();
        self.hasher
            .hash_chain(tokens, self.block, &ExtraKeys::none(), &mut self.chain);
    }

    /// Keep `state` (ignored unless it ends on a block boundary), keyed by the tokens it
    /// consumed; also queue it for the persistent tier under traffic `class`.
    pub(crate) fn insert<B: Backend<Tensor = T>>(
        &mut self,
        model: &Model<B>,
        state: SeqState<T>,
        class: TrafficClass,
    ) {
        let len = state.pos;
        if self.max_entries == 0
            || len == 0
            || state.history.len() < len
            || !len.is_multiple_of(self.block)
        {
            return;
        }
        let tokens = state.history[..len].to_vec();
        self.hash_chain(&tokens);
        let Some(&key) = self.chain.last() else {
            return;
        };
        if let Some(disk) = &self.disk
            && !disk.lock().contains(key)
            && let Some(tx) = &disk.tx
        {
            match model.encode_state(&state, disk.identity) {
                Ok(bytes) => {
                    let _ = tx.send((key, class, bytes));
                }
                Err(e) => tracing::warn!("kv cache dir: cannot encode a state: {e}"),
            }
        }
        if self.host.get(key).is_some() {
            return;
        }
        self.put_host(key, tokens, state);
    }

    fn put_host(&mut self, key: BlockHash, tokens: Vec<u32>, state: SeqState<T>) {
        while self.host.usage().entries >= self.max_entries && self.host.pop_lru().is_some() {}
        let bytes = state_bytes(&state);
        // A state larger than the whole host tier is simply not kept.
        let _ = self.host.insert(key, Entry { tokens, state }, bytes);
    }

    /// The longest host-tier state for a block-aligned prefix of `tokens` (a detached
    /// snapshot: its global entries in blocks of its own).
    pub(crate) fn lookup(&mut self, tokens: &[u32]) -> Option<SeqState<T>> {
        self.hash_chain(tokens);
        for k in (0..self.chain.len()).rev() {
            let len = (k + 1) * self.block;
            if let Some(e) = self.host.get(self.chain[k])
                && e.tokens == tokens[..len]
            {
                return Some(e.state.clone());
            }
        }
        None
    }

    /// The longest block-aligned prefix of `tokens` with a state in some tier, and the tier
    /// (`Host`, or `Disk` when a longer one was on disk: it is loaded into the host tier).
    pub(crate) fn reach<B: Backend<Tensor = T>>(
        &mut self,
        model: &Model<B>,
        tokens: &[u32],
    ) -> Option<(usize, Tier)> {
        if self.max_entries == 0 {
            return None;
        }
        self.hash_chain(tokens);
        let chain = std::mem::take(&mut self.chain);
        let mut found = None;
        for k in (0..chain.len()).rev() {
            let len = (k + 1) * self.block;
            if self
                .host
                .get(chain[k])
                .is_some_and(|e| e.tokens == tokens[..len])
            {
                found = Some((len, Tier::Host));
                break;
            }
            if let Some(state) = self.load(model, chain[k], &tokens[..len]) {
                self.put_host(chain[k], tokens[..len].to_vec(), state);
                found = Some((len, Tier::Disk));
                break;
            }
        }
        self.chain = chain;
        found
    }

    /// The state on disk under `key`, if it is there, intact, of this model, and for exactly
    /// `tokens`.
    fn load<B: Backend<Tensor = T>>(
        &mut self,
        model: &Model<B>,
        key: BlockHash,
        tokens: &[u32],
    ) -> Option<SeqState<T>> {
        let disk = self.disk.as_mut()?;
        let bytes = {
            let mut store = disk.lock();
            if !store.contains(key) {
                return None;
            }
            store.get(key).ok().flatten()?
        };
        match model.decode_state(&bytes, disk.identity) {
            Ok(st) if st.pos == tokens.len() && st.history[..st.pos] == *tokens => {
                disk.loads += 1;
                Some(st)
            }
            Ok(_) => {
                disk.rejected += 1;
                None
            }
            Err(e) => {
                tracing::warn!("kv cache dir: unusable state: {e}");
                disk.rejected += 1;
                disk.lock().remove(key);
                None
            }
        }
    }

    /// Drop the least recently used host state; false when none is held.
    pub(crate) fn evict_lru(&mut self) -> bool {
        self.host.pop_lru().is_some()
    }

    /// Host states held.
    pub(crate) fn len(&self) -> usize {
        self.host.usage().entries
    }

    /// Bytes the host tier holds.
    pub(crate) fn host_bytes(&self) -> u64 {
        self.host.usage().bytes
    }

    /// The persistent tier's counters (all 0 without one).
    pub(crate) fn disk_counters(&self) -> DiskCounters {
        self.disk
            .as_ref()
            .map_or_else(DiskCounters::default, |d| DiskCounters {
                writes: d.writes.load(Ordering::Relaxed),
                write_errors: d.write_errors.load(Ordering::Relaxed),
                loads: d.loads,
                rejected: d.rejected,
            })
    }

    /// Waits until every state queued for the persistent tier is written; later states are
    /// kept on the host only.
    pub(crate) fn flush(&mut self) {
        if let Some(d) = &mut self.disk {
            d.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deepinfer_kernels::CpuBackend;

    /// A state that consumed `tokens`.
    fn st(tokens: &[u32]) -> SeqState<deepinfer_kernels::CpuTensor> {
        let global = crate::model::GlobalTable::new(vec![0usize].into(), 32).unwrap();
        let mut s = SeqState::with_global(1, 0, global);
        s.pos = tokens.len();
        s.history = tokens.to_vec();
        s
    }

    fn model() -> Model<CpuBackend> {
        crate::runtime::load_default(CpuBackend::new()).unwrap()
    }

    #[test]
    fn longest_aligned_prefix_wins_and_tokens_are_checked() {
        let m = model();
        let mut p = PrefixCache::new(4, 1 << 20, 8, 0, None).unwrap();
        let toks: Vec<u32> = (0..12).collect();
        p.insert(&m, st(&toks[..4]), TrafficClass::CHAT);
        p.insert(&m, st(&toks[..8]), TrafficClass::CHAT);
        p.insert(&m, st(&toks[..6]), TrafficClass::CHAT); // not aligned: ignored
        assert_eq!(p.len(), 2);
        assert_eq!(p.lookup(&toks[..11]).map(|s| s.pos), Some(8));
        assert_eq!(p.lookup(&toks[..7]).map(|s| s.pos), Some(4));
        assert_eq!(p.reach(&m, &toks[..11]), Some((8, Tier::Host)));
        let other: Vec<u32> = (100..112).collect();
        assert!(p.lookup(&other).is_none());
        assert!(p.reach(&m, &other).is_none());
    }

    #[test]
    fn entry_capacity_evicts_least_recently_used() {
        let m = model();
        let mut p = PrefixCache::new(2, 1 << 20, 2, 0, None).unwrap();
        p.insert(&m, st(&[1, 2]), TrafficClass::CHAT);
        p.insert(&m, st(&[3, 4]), TrafficClass::CHAT);
        assert!(p.lookup(&[1, 2]).is_some());
        p.insert(&m, st(&[5, 6]), TrafficClass::CHAT);
        assert_eq!(p.len(), 2);
        assert!(p.lookup(&[3, 4]).is_none());
        assert!(p.lookup(&[1, 2]).is_some());
    }

    #[test]
    fn byte_capacity_bounds_the_host_tier() {
        let m = model();
        let one = state_bytes(&st(&[1, 2]));
        let mut p = PrefixCache::new(2, 2 * one, 100, 0, None).unwrap();
        for t in 0..5 {
            p.insert(&m, st(&[t, t]), TrafficClass::CHAT);
        }
        assert_eq!(p.len(), 2);
        assert!(p.host_bytes() <= 2 * one);
    }
}
