//! Chained block hashes: `hash(parent, token ids, tagged extra keys)` with a seeded 128-bit hash.
//!
//! The default algorithm is XXH3-128 (fast, not cryptographic); SHA-256 (truncated to 128 bits)
//! is selectable where an adversary could try to craft collisions. Token ids are hashed in
//! little-endian order so hashes are the same on every machine (they also name files in the
//! persistent store).

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::xxh3_128_with_seed;

/// The 128-bit hash of one full block and, through its parent, of the whole prefix before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u128);

impl BlockHash {
    /// The hash as 32 lowercase hex digits (used as a file name by the persistent store).
    pub fn to_hex(self) -> String {
        format!("{:032x}", self.0)
    }

    /// Parses 32 hex digits written by [`BlockHash::to_hex`].
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 32 {
            return None;
        }
        u128::from_str_radix(s, 16).ok().map(BlockHash)
    }
}

/// Which hash function builds the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashAlgo {
    /// XXH3-128 with a seed: fast (well above 1 G tokens/s on one core), not collision-resistant
    /// against an adversary; the token-equality check on hit guards against accidents.
    #[default]
    Xxh3_128,
    /// SHA-256 over the seed and the same bytes, truncated to 128 bits.
    Sha256,
}

/// A multimodal item (image, audio clip) whose placeholder tokens lie in the prompt.
///
/// Blocks that overlap the item include its content hash and its start offset in their hash,
/// so two prompts with the same placeholder ids but different images never share blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MultiModalItem {
    /// Hash of the item's content, computed by the caller.
    pub hash: u128,
    /// Index of the item's first placeholder token in the prompt.
    pub start: usize,
    /// Number of placeholder tokens.
    pub len: usize,
}

/// Extra keys that make otherwise equal token blocks distinct.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraKeys {
    /// LoRA / adapter id, hashed into every block.
    pub adapter: Option<u64>,
    /// Per-tenant cache salt, hashed into the first block (and so, by chaining, into all).
    pub cache_salt: Option<Vec<u8>>,
    /// Multimodal items, hashed into each block they overlap.
    pub multimodal: Vec<MultiModalItem>,
}

impl ExtraKeys {
    /// No extra keys.
    pub fn none() -> Self {
        Self::default()
    }

    /// True when no key is set (the common text-only case).
    pub fn is_empty(&self) -> bool {
        self.adapter.is_none() && self.cache_salt.is_none() && self.multimodal.is_empty()
    }
}

// Tags keep each field's bytes in its own domain so that no two different inputs share an encoding.
const TAG_ROOT: u8 = 0x01;
const TAG_PARENT: u8 = 0x02;
const TAG_ADAPTER: u8 = 0x10;
const TAG_SALT: u8 = 0x11;
const TAG_MM: u8 = 0x12;

/// Builds chained block hashes. Holds a scratch buffer so hashing does not allocate.
#[derive(Debug, Clone)]
pub struct BlockHasher {
    algo: HashAlgo,
    seed: u64,
    buf: Vec<u8>,
    /// Little-endian copy of the tokens, used only on big-endian targets.
    le: Vec<u8>,
}

impl BlockHasher {
    /// A hasher with the given algorithm and seed (use the same seed across restarts to reuse
    /// persisted blocks; a different seed gives an unrelated chain).
    pub fn new(algo: HashAlgo, seed: u64) -> Self {
        Self {
            algo,
            seed,
            buf: Vec::new(),
            le: Vec::new(),
        }
    }

    /// The algorithm in use.
    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    /// Hash of one block given its parent (None for the first block), its token ids, the
    /// block's start position in the sequence and the request's extra keys.
    pub fn hash_block(
        &mut self,
        parent: Option<BlockHash>,
        tokens: &[u32],
        block_start: usize,
        keys: &ExtraKeys,
    ) -> BlockHash {
        if self.text_fast_path(keys) {
            return self.hash_text_block(parent, tokens);
        }
        self.hash_block_general(parent, tokens, block_start, keys)
    }

    /// True when blocks with `keys` take [`BlockHasher::hash_text_block`] (XXH3, no extra keys):
    /// callers hashing many blocks of one sequence decide it once.
    #[inline]
    pub(crate) fn text_fast_path(&self, keys: &ExtraKeys) -> bool {
        self.text_fast_path_for(keys.is_empty())
    }

    /// [`BlockHasher::text_fast_path`] given whether the keys are empty (for callers that
    /// keep that flag where reading it costs no extra cache line).
    pub(crate) fn text_fast_path_for(&self, keys_empty: bool) -> bool {
        self.algo == HashAlgo::Xxh3_128 && keys_empty
    }

    /// [`BlockHasher::hash_block`] for the common case (XXH3, no extra keys): the same bytes as
    /// the general path, with the header built on the stack instead of in the scratch vector.
    #[inline(never)]
    pub(crate) fn hash_text_block(
        &mut self,
        parent: Option<BlockHash>,
        tokens: &[u32],
    ) -> BlockHash {
        let th = xxh3_128_with_seed(token_bytes_le(tokens, &mut self.le), self.seed);
        let mut head = [0u8; 41];
        let n = match parent {
            None => {
                head[0] = TAG_ROOT;
                1
            }
            Some(p) => {
                head[0] = TAG_PARENT;
                head[1..17].copy_from_slice(&p.0.to_le_bytes());
                17
            }
        };
        head[n..n + 8].copy_from_slice(&(tokens.len() as u64).to_le_bytes());
        head[n + 8..n + 24].copy_from_slice(&th.to_le_bytes());
        BlockHash(xxh3_128_with_seed(&head[..n + 24], self.seed))
    }

    fn hash_block_general(
        &mut self,
        parent: Option<BlockHash>,
        tokens: &[u32],
        block_start: usize,
        keys: &ExtraKeys,
    ) -> BlockHash {
        let buf = &mut self.buf;
        buf.clear();
        match parent {
            None => buf.push(TAG_ROOT),
            Some(p) => {
                buf.push(TAG_PARENT);
                buf.extend_from_slice(&p.0.to_le_bytes());
            }
        }
        buf.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
        match self.algo {
            HashAlgo::Xxh3_128 => {
                // Hash the token ids in place (no copy), then the short header with that digest:
                // H(tag, parent, len, H_seed(tokens), keys).
                let th = xxh3_128_with_seed(token_bytes_le(tokens, &mut self.le), self.seed);
                buf.extend_from_slice(&th.to_le_bytes());
                if !keys.is_empty() {
                    encode_keys(buf, tokens.len(), block_start, keys);
                }
                BlockHash(xxh3_128_with_seed(buf, self.seed))
            }
            HashAlgo::Sha256 => {
                if !keys.is_empty() {
                    encode_keys(buf, tokens.len(), block_start, keys);
                }
                let mut h = Sha256::new();
                h.update(self.seed.to_le_bytes());
                h.update(&buf[..]);
                h.update(token_bytes_le(tokens, &mut self.le));
                let d = h.finalize();
                let mut first = [0u8; 16];
                first.copy_from_slice(&d[..16]);
                BlockHash(u128::from_le_bytes(first))
            }
        }
    }

    /// Hashes of every *full* block of `tokens` (a trailing partial block gets no hash), chained
    /// from the start. Appends to `out`.
    pub fn hash_chain(
        &mut self,
        tokens: &[u32],
        block_size: usize,
        keys: &ExtraKeys,
        out: &mut Vec<BlockHash>,
    ) {
        if block_size == 0 {
            return;
        }
        let mut parent = None;
        for (i, chunk) in tokens.chunks_exact(block_size).enumerate() {
            let h = self.hash_block(parent, chunk, i * block_size, keys);
            out.push(h);
            parent = Some(h);
        }
    }
}

/// The token ids as little-endian bytes: the tokens' own memory on little-endian targets,
/// else a converted copy in `scratch`.
fn token_bytes_le<'a>(tokens: &'a [u32], scratch: &'a mut Vec<u8>) -> &'a [u8] {
    #[cfg(target_endian = "little")]
    {
        let _ = scratch;
        // SAFETY: u32 has no padding and every byte pattern is a valid u8; the slice covers
        // exactly the tokens' memory and lives as long as `tokens`. On a little-endian target
        // that memory is the little-endian encoding.
        unsafe {
            std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens))
        }
    }
    #[cfg(not(target_endian = "little"))]
    {
        scratch.clear();
        for t in tokens {
            scratch.extend_from_slice(&t.to_le_bytes());
        }
        scratch
    }
}

fn encode_keys(buf: &mut Vec<u8>, n_tokens: usize, block_start: usize, keys: &ExtraKeys) {
    if let Some(a) = keys.adapter {
        buf.push(TAG_ADAPTER);
        buf.extend_from_slice(&a.to_le_bytes());
    }
    if block_start == 0
        && let Some(salt) = &keys.cache_salt
    {
        buf.push(TAG_SALT);
        buf.extend_from_slice(&(salt.len() as u64).to_le_bytes());
        buf.extend_from_slice(salt);
    }
    let block_end = block_start + n_tokens;
    for item in &keys.multimodal {
        let item_end = item.start.saturating_add(item.len);
        if item.start < block_end && item_end > block_start {
            buf.push(TAG_MM);
            buf.extend_from_slice(&item.hash.to_le_bytes());
            buf.extend_from_slice(&(item.start as u64).to_le_bytes());
            buf.extend_from_slice(&(item.len as u64).to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_parent_seed_and_keys() {
        let toks: Vec<u32> = (0..8).collect();
        let mut h = BlockHasher::new(HashAlgo::Xxh3_128, 7);
        let a = h.hash_block(None, &toks, 0, &ExtraKeys::none());
        let b = h.hash_block(Some(a), &toks, 8, &ExtraKeys::none());
        assert_ne!(a, b);
        let mut h2 = BlockHasher::new(HashAlgo::Xxh3_128, 8);
        assert_ne!(a, h2.hash_block(None, &toks, 0, &ExtraKeys::none()));
        let salted = ExtraKeys {
            cache_salt: Some(b"tenant".to_vec()),
            ..ExtraKeys::default()
        };
        assert_ne!(a, h.hash_block(None, &toks, 0, &salted));
        let adapter = ExtraKeys {
            adapter: Some(3),
            ..ExtraKeys::default()
        };
        assert_ne!(a, h.hash_block(None, &toks, 0, &adapter));
        // Same inputs, same hash.
        assert_eq!(a, h.hash_block(None, &toks, 0, &ExtraKeys::none()));
    }

    #[test]
    fn multimodal_item_only_affects_overlapping_blocks() {
        let toks: Vec<u32> = vec![5; 12];
        let keys = ExtraKeys {
            multimodal: vec![MultiModalItem {
                hash: 99,
                start: 5,
                len: 2,
            }],
            ..ExtraKeys::default()
        };
        let mut h = BlockHasher::new(HashAlgo::Xxh3_128, 0);
        let mut with = Vec::new();
        let mut without = Vec::new();
        h.hash_chain(&toks, 4, &keys, &mut with);
        h.hash_chain(&toks, 4, &ExtraKeys::none(), &mut without);
        assert_eq!(with.len(), 3);
        assert_eq!(with[0], without[0]);
        assert_ne!(with[1], without[1]);
        // Chained: the third block differs because its parent does.
        assert_ne!(with[2], without[2]);
    }

    #[test]
    fn sha256_differs_from_xxh3_and_is_stable() {
        let toks: Vec<u32> = (0..16).collect();
        let mut x = BlockHasher::new(HashAlgo::Xxh3_128, 1);
        let mut s = BlockHasher::new(HashAlgo::Sha256, 1);
        let hs = s.hash_block(None, &toks, 0, &ExtraKeys::none());
        assert_ne!(x.hash_block(None, &toks, 0, &ExtraKeys::none()), hs);
        assert_eq!(hs, s.hash_block(None, &toks, 0, &ExtraKeys::none()));
        assert_eq!(BlockHash::from_hex(&hs.to_hex()), Some(hs));
    }

    /// The documented encoding, built by hand: `H(tag, parent, len, H_seed(tokens))`.
    #[test]
    fn text_only_hash_is_the_documented_encoding() {
        let toks: Vec<u32> = (100..116).collect();
        let seed = 5;
        let th = xxh3_128_with_seed(token_bytes_le(&toks, &mut Vec::new()), seed);
        let mut h = BlockHasher::new(HashAlgo::Xxh3_128, seed);
        let mut root = vec![TAG_ROOT];
        root.extend_from_slice(&16u64.to_le_bytes());
        root.extend_from_slice(&th.to_le_bytes());
        let a = h.hash_block(None, &toks, 0, &ExtraKeys::none());
        assert_eq!(a, BlockHash(xxh3_128_with_seed(&root, seed)));
        let mut child = vec![TAG_PARENT];
        child.extend_from_slice(&a.0.to_le_bytes());
        child.extend_from_slice(&16u64.to_le_bytes());
        child.extend_from_slice(&th.to_le_bytes());
        assert_eq!(
            h.hash_block(Some(a), &toks, 16, &ExtraKeys::none()),
            BlockHash(xxh3_128_with_seed(&child, seed))
        );
    }

    #[test]
    fn partial_block_has_no_hash() {
        let toks: Vec<u32> = (0..10).collect();
        let mut out = Vec::new();
        BlockHasher::new(HashAlgo::Xxh3_128, 0).hash_chain(&toks, 4, &ExtraKeys::none(), &mut out);
        assert_eq!(out.len(), 2);
    }
}
