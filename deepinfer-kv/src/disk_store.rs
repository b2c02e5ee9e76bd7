//! The persistent block store: one file per block in a directory (a local SSD, or a distributed
//! file system such as 3FS mounted there).
//!
//! - Writes are atomic: a temporary file is written and fsynced, then renamed into place (and the
//!   directory fsynced), so a crash leaves either the old state or the new block, plus at worst a
//!   leftover temporary file that the next open deletes.
//! - Every read verifies the file's checksum; a corrupt or truncated block is a miss, is deleted
//!   and is never served.
//! - Each block belongs to a traffic class with its own lifetime (agent 3 days, chat 7 days by
//!   default), counted from when it was written; expired blocks are misses and are deleted.
//! - Over capacity, the least recently used blocks are reclaimed.
//! - After a crash the index is rebuilt by scanning the directory (headers and sizes are checked
//!   then; checksums on the next read).
//!
//! File layout (little-endian): magic `DIKVBLK1`, hash (16 B), class (1 B), 7 B zero, written-at
//! seconds (8 B), payload length (8 B), XXH3-64 checksum of the preceding 48 header bytes and the
//! payload (8 B), then the payload.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use xxhash_rust::xxh3::Xxh3;

use crate::clock::{Clock, SystemClock};
use crate::error::{KvError, Result};
use crate::hash::BlockHash;
use crate::pool::HashIndex;
use crate::window_store::StoreUsage;

const MAGIC: &[u8; 8] = b"DIKVBLK1";
const HEADER: usize = 56;
const EXT: &str = "kvb";
const TMP_MARK: &str = ".tmp-";

/// Traffic class of a stored block; each class has its own lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrafficClass(pub u8);

impl TrafficClass {
    /// Agent traffic (default lifetime 3 days).
    pub const AGENT: TrafficClass = TrafficClass(0);
    /// Chat traffic (default lifetime 7 days).
    pub const CHAT: TrafficClass = TrafficClass(1);
}

/// Settings of a [`PersistentStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistentStoreConfig {
    /// The directory holding the block files.
    pub dir: PathBuf,
    /// Most bytes (headers included) kept before least recently used blocks are reclaimed.
    pub capacity_bytes: u64,
    /// Lifetime in seconds per traffic class.
    pub lifetimes: HashMap<TrafficClass, u64>,
    /// Lifetime of classes not listed in `lifetimes`.
    pub default_lifetime_secs: u64,
}

impl PersistentStoreConfig {
    /// Agent blocks live 3 days, chat blocks and others 7 days.
    pub fn new(dir: impl Into<PathBuf>, capacity_bytes: u64) -> Self {
        const DAY: u64 = 24 * 3600;
        Self {
            dir: dir.into(),
            capacity_bytes,
            lifetimes: HashMap::from([
                (TrafficClass::AGENT, 3 * DAY),
                (TrafficClass::CHAT, 7 * DAY),
            ]),
            default_lifetime_secs: 7 * DAY,
        }
    }

    /// The lifetime of `class` in seconds.
    pub fn lifetime(&self, class: TrafficClass) -> u64 {
        self.lifetimes
            .get(&class)
            .copied()
            .unwrap_or(self.default_lifetime_secs)
    }
}

/// Counters of a [`PersistentStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PersistentStats {
    /// Reads that returned a verified block.
    pub hits: u64,
    /// Reads that found nothing usable.
    pub misses: u64,
    /// Blocks found corrupt or truncated (on read or at recovery) and deleted.
    pub corrupt: u64,
    /// Blocks deleted because their lifetime ended.
    pub expired: u64,
    /// Blocks reclaimed to stay under capacity.
    pub reclaimed: u64,
    /// Leftover temporary files deleted when opening.
    pub temp_files_removed: u64,
}

#[derive(Debug, Clone, Copy)]
struct DiskEntry {
    bytes: u64,
    class: TrafficClass,
    written_at: u64,
    tick: u64,
}

/// A directory of checksummed block files with expiry and LRU reclaim.
#[derive(Debug)]
pub struct PersistentStore {
    cfg: PersistentStoreConfig,
    clock: Arc<dyn Clock>,
    index: HashIndex<DiskEntry>,
    order: BTreeMap<u64, BlockHash>,
    bytes: u64,
    tick: u64,
    stats: PersistentStats,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn io_err(path: &Path, e: std::io::Error) -> KvError {
    KvError::Io {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

struct Header {
    hash: BlockHash,
    class: TrafficClass,
    written_at: u64,
    payload_len: u64,
    checksum: u64,
}

fn encode_header(
    hash: BlockHash,
    class: TrafficClass,
    written_at: u64,
    payload: &[u8],
) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0..8].copy_from_slice(MAGIC);
    h[8..24].copy_from_slice(&hash.0.to_le_bytes());
    h[24] = class.0;
    h[32..40].copy_from_slice(&written_at.to_le_bytes());
    h[40..48].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    let sum = checksum(&h[..48], payload);
    h[48..56].copy_from_slice(&sum.to_le_bytes());
    h
}

fn checksum(header48: &[u8], payload: &[u8]) -> u64 {
    let mut x = Xxh3::new();
    x.update(header48);
    x.update(payload);
    x.digest()
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn decode_header(b: &[u8]) -> Option<Header> {
    if b.len() < HEADER || &b[0..8] != MAGIC || b[25..32].iter().any(|&x| x != 0) {
        return None;
    }
    let mut h = [0u8; 16];
    h.copy_from_slice(&b[8..24]);
    Some(Header {
        hash: BlockHash(u128::from_le_bytes(h)),
        class: TrafficClass(b[24]),
        written_at: u64_at(b, 32),
        payload_len: u64_at(b, 40),
        checksum: u64_at(b, 48),
    })
}

impl PersistentStore {
    /// Opens (creating if needed) the store in `cfg.dir` with the system clock, recovering the
    /// index by scanning the directory.
    pub fn open(cfg: PersistentStoreConfig) -> Result<Self> {
        Self::open_with_clock(cfg, Arc::new(SystemClock))
    }

    /// Opens the store with an injected clock.
    pub fn open_with_clock(cfg: PersistentStoreConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        let unwritable = |e: std::io::Error| KvError::UnwritableDirectory {
            path: cfg.dir.clone(),
            reason: e.to_string(),
        };
        fs::create_dir_all(&cfg.dir).map_err(unwritable)?;
        // Probe that we can create, sync and delete a file here.
        let probe = cfg
            .dir
            .join(format!(".probe{TMP_MARK}{}", std::process::id()));
        File::create(&probe)
            .and_then(|f| f.sync_all())
            .and_then(|_| fs::remove_file(&probe))
            .map_err(unwritable)?;
        let mut store = Self {
            cfg,
            clock,
            index: HashIndex::default(),
            order: BTreeMap::new(),
            bytes: 0,
            tick: 0,
            stats: PersistentStats::default(),
        };
        store.recover()?;
        Ok(store)
    }

    fn path_of(&self, hash: BlockHash) -> PathBuf {
        self.cfg.dir.join(format!("{}.{EXT}", hash.to_hex()))
    }

    fn recover(&mut self) -> Result<()> {
        let now = self.clock.now_secs();
        let dir = self.cfg.dir.clone();
        let mut found = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| io_err(&dir, e))? {
            let entry = entry.map_err(|e| io_err(&dir, e))?;
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if name.contains(TMP_MARK) {
                // An interrupted write: never renamed into place, so never valid.
                let _ = fs::remove_file(&path);
                self.stats.temp_files_removed += 1;
                continue;
            }
            let Some(hash) = name
                .strip_suffix(&format!(".{EXT}"))
                .and_then(BlockHash::from_hex)
            else {
                continue; // Not ours: leave it alone.
            };
            let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
            let mut head = [0u8; HEADER];
            let ok_header = File::open(&path)
                .and_then(|mut f| f.read_exact(&mut head))
                .ok()
                .and_then(|_| decode_header(&head))
                .filter(|h| {
                    h.hash == hash && h.payload_len.checked_add(HEADER as u64) == Some(size)
                });
            match ok_header {
                None => {
                    let _ = fs::remove_file(&path);
                    self.stats.corrupt += 1;
                }
                Some(h) if self.expired(h.class, h.written_at, now) => {
                    let _ = fs::remove_file(&path);
                    self.stats.expired += 1;
                }
                Some(h) => found.push((h.written_at, hash, h.class, size)),
            }
        }
        // Oldest writes become the least recently used.
        found.sort();
        for (written_at, hash, class, bytes) in found {
            self.insert_index(hash, class, written_at, bytes);
        }
        self.reclaim(0);
        Ok(())
    }

    fn expired(&self, class: TrafficClass, written_at: u64, now: u64) -> bool {
        now.saturating_sub(written_at) >= self.cfg.lifetime(class)
    }

    fn insert_index(&mut self, hash: BlockHash, class: TrafficClass, written_at: u64, bytes: u64) {
        self.tick += 1;
        self.order.insert(self.tick, hash);
        self.bytes += bytes;
        self.index.insert(
            hash,
            DiskEntry {
                bytes,
                class,
                written_at,
                tick: self.tick,
            },
        );
    }

    fn forget(&mut self, hash: BlockHash) -> Option<DiskEntry> {
        let e = self.index.remove(&hash)?;
        self.order.remove(&e.tick);
        self.bytes -= e.bytes;
        Some(e)
    }

    fn delete(&mut self, hash: BlockHash) {
        self.forget(hash);
        let _ = fs::remove_file(self.path_of(hash));
    }

    /// Reclaims least recently used blocks until `extra` more bytes fit.
    fn reclaim(&mut self, extra: u64) {
        while self.bytes + extra > self.cfg.capacity_bytes {
            let Some((_, victim)) = self.order.first_key_value().map(|(k, v)| (*k, *v)) else {
                break;
            };
            self.delete(victim);
            self.stats.reclaimed += 1;
        }
    }

    /// Byte counts (bytes include file headers).
    pub fn usage(&self) -> StoreUsage {
        StoreUsage {
            entries: self.index.len(),
            bytes: self.bytes,
            capacity: self.cfg.capacity_bytes,
            evictions: self.stats.reclaimed,
        }
    }

    /// Counters.
    pub fn stats(&self) -> PersistentStats {
        self.stats
    }

    /// The configuration.
    pub fn config(&self) -> &PersistentStoreConfig {
        &self.cfg
    }

    /// True when an unexpired block is indexed under `hash` (no I/O; the checksum is verified
    /// when it is read).
    pub fn contains(&self, hash: BlockHash) -> bool {
        let now = self.clock.now_secs();
        self.index
            .get(&hash)
            .is_some_and(|e| !self.expired(e.class, e.written_at, now))
    }

    /// Writes `payload` under `hash` atomically, replacing any older copy, then reclaims least
    /// recently used blocks if over capacity.
    pub fn put(&mut self, hash: BlockHash, class: TrafficClass, payload: &[u8]) -> Result<()> {
        let size = (HEADER + payload.len()) as u64;
        if size > self.cfg.capacity_bytes {
            return Err(KvError::EntryTooLarge {
                size,
                capacity: self.cfg.capacity_bytes,
            });
        }
        let now = self.clock.now_secs();
        let header = encode_header(hash, class, now, payload);
        let path = self.path_of(hash);
        let tmp = self.cfg.dir.join(format!(
            "{}.{EXT}{TMP_MARK}{}-{}",
            hash.to_hex(),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> std::io::Result<()> {
            let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(&header)?;
            f.write_all(payload)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            // Make the rename durable; not every platform can open a directory, so best effort.
            if let Ok(d) = File::open(&self.cfg.dir) {
                let _ = d.sync_all();
            }
            Ok(())
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(match e.kind() {
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::NotFound => {
                    KvError::UnwritableDirectory {
                        path: self.cfg.dir.clone(),
                        reason: e.to_string(),
                    }
                }
                _ => io_err(&tmp, e),
            });
        }
        self.forget(hash);
        self.reclaim(size);
        self.insert_index(hash, class, now, size);
        Ok(())
    }

    /// Reads and verifies the block under `hash`. A missing, expired, truncated or corrupt block
    /// is a miss (`Ok(None)`); the bad file is deleted.
    pub fn get(&mut self, hash: BlockHash) -> Result<Option<Vec<u8>>> {
        let Some(e) = self.index.get(&hash).copied() else {
            self.stats.misses += 1;
            return Ok(None);
        };
        if self.expired(e.class, e.written_at, self.clock.now_secs()) {
            self.delete(hash);
            self.stats.expired += 1;
            self.stats.misses += 1;
            return Ok(None);
        }
        let path = self.path_of(hash);
        let mut bytes = Vec::new();
        match File::open(&path).and_then(|mut f| f.read_to_end(&mut bytes)) {
            Ok(_) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                // Deleted behind our back (another process reclaimed it).
                self.forget(hash);
                self.stats.misses += 1;
                return Ok(None);
            }
            Err(err) => return Err(io_err(&path, err)),
        }
        let valid = decode_header(&bytes).filter(|h| {
            h.hash == hash
                && h.payload_len.checked_add(HEADER as u64) == Some(bytes.len() as u64)
                && h.checksum == checksum(&bytes[..48], &bytes[HEADER..])
        });
        if valid.is_none() {
            self.delete(hash);
            self.stats.corrupt += 1;
            self.stats.misses += 1;
            return Ok(None);
        }
        // Most recently used now.
        if let Some(entry) = self.index.get_mut(&hash) {
            self.order.remove(&entry.tick);
            self.tick += 1;
            entry.tick = self.tick;
            self.order.insert(self.tick, hash);
        }
        self.stats.hits += 1;
        bytes.drain(..HEADER);
        Ok(Some(bytes))
    }

    /// Deletes the block under `hash`. Returns whether it was indexed.
    pub fn remove(&mut self, hash: BlockHash) -> bool {
        let had = self.index.contains_key(&hash);
        self.delete(hash);
        had
    }

    /// Deletes every expired block now. Returns how many.
    pub fn purge_expired(&mut self) -> usize {
        let now = self.clock.now_secs();
        let dead: Vec<BlockHash> = self
            .index
            .iter()
            .filter(|(_, e)| self.expired(e.class, e.written_at, now))
            .map(|(h, _)| *h)
            .collect();
        for &h in &dead {
            self.delete(h);
        }
        self.stats.expired += dead.len() as u64;
        dead.len()
    }
}
