//! Lookup across cache tiers: given a chain of block hashes, the longest contiguous run that is
//! available somewhere, and where each block of it lives, so the engine can prefetch.

use crate::disk_store::PersistentStore;
use crate::hash::BlockHash;
use crate::manager::BlockManager;
use crate::pool::BlockPool;
use crate::window_store::WindowStateStore;

/// Where a cached block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// The device block pool.
    Device,
    /// Host memory (for engines that keep an offloaded block pool there).
    Host,
    /// The persistent store.
    Disk,
}

/// Anything that can say whether it holds a block.
pub trait BlockLocator {
    /// True when the block cached under `hash` is held here.
    fn has_block(&self, hash: BlockHash) -> bool;
}

impl BlockLocator for BlockPool {
    fn has_block(&self, hash: BlockHash) -> bool {
        self.contains(hash)
    }
}

impl BlockLocator for BlockManager {
    fn has_block(&self, hash: BlockHash) -> bool {
        self.pool().contains(hash)
    }
}

impl BlockLocator for PersistentStore {
    fn has_block(&self, hash: BlockHash) -> bool {
        self.contains(hash)
    }
}

impl<V> BlockLocator for WindowStateStore<V> {
    fn has_block(&self, hash: BlockHash) -> bool {
        self.contains(hash)
    }
}

/// The answer of [`lookup_tiers`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TierRun {
    /// For each block of the longest contiguous run from the start of the chain, the fastest
    /// tier holding it.
    pub locations: Vec<Tier>,
    /// The longest prefix of the run (in blocks) whose window state is available, if any.
    pub window_state_blocks: Option<usize>,
}

impl TierRun {
    /// Blocks in the run.
    pub fn len(&self) -> usize {
        self.locations.len()
    }

    /// True when not even the first block is cached anywhere.
    pub fn is_empty(&self) -> bool {
        self.locations.is_empty()
    }

    /// Blocks of the run held by `tier`.
    pub fn count(&self, tier: Tier) -> usize {
        self.locations.iter().filter(|&&t| t == tier).count()
    }
}

/// Walks `chain` from its start and asks each tier, fastest first, for each block; stops at the
/// first block held by none. If `window_states` is given, also reports the longest run prefix
/// whose window state (keyed by the hash of its last block) it holds.
pub fn lookup_tiers(
    chain: &[BlockHash],
    tiers: &[(Tier, &dyn BlockLocator)],
    window_states: Option<&dyn BlockLocator>,
) -> TierRun {
    let mut run = TierRun::default();
    for &h in chain {
        match tiers.iter().find(|(_, loc)| loc.has_block(h)) {
            Some(&(tier, _)) => run.locations.push(tier),
            None => break,
        }
    }
    if let Some(ws) = window_states {
        run.window_state_blocks = (1..=run.locations.len())
            .rev()
            .find(|&n| ws.has_block(chain[n - 1]));
    }
    run
}

/// Usage of every tier at one moment, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierUsage {
    /// Device pool block counts.
    pub device: crate::pool::PoolUsage,
    /// Host window-state store, if the engine has one.
    pub host_window: Option<crate::window_store::StoreUsage>,
    /// Persistent store, if the engine has one.
    pub disk: Option<crate::window_store::StoreUsage>,
}

impl TierUsage {
    /// Collects the usage of the tiers given.
    pub fn collect<V>(
        device: &BlockManager,
        host_window: Option<&WindowStateStore<V>>,
        disk: Option<&PersistentStore>,
    ) -> Self {
        Self {
            device: device.usage(),
            host_window: host_window.map(WindowStateStore::usage),
            disk: disk.map(PersistentStore::usage),
        }
    }
}
