#![doc = include_str!("../README.md")]

mod clock;
mod disk_store;
mod error;
mod events;
mod hash;
mod hit_rule;
mod layout;
mod manager;
mod pool;
mod prefetch;
#[cfg(feature = "testing")]
pub mod testing;
mod tiers;
mod window_store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use disk_store::{PersistentStats, PersistentStore, PersistentStoreConfig, TrafficClass};
pub use error::{KvError, Result};
pub use events::{CacheStats, KvEvent};
pub use hash::{BlockHash, BlockHasher, ExtraKeys, HashAlgo, MultiModalItem};
pub use hit_rule::{HitPlan, HitRule};
pub use layout::{KvLayout, LayoutPart};
pub use manager::{
    AllocateOptions, Allocation, BlockManager, BlockManagerConfig, CopyOp, PrefixMatch, SeqHandle,
    SequenceUsage, Slot,
};
pub use pool::{BlockId, BlockPool, PoolUsage};
pub use tiers::{BlockLocator, Tier, TierRun, TierUsage, lookup_tiers};
pub use window_store::{StoreUsage, WindowStateStore};

/// The crate's version, as packaged.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
