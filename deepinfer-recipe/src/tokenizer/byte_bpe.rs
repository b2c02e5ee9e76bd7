//! A byte-level BPE encoder for the DeepSeek vocabulary: the DeepSeek
//! pre-tokenizer ([`super::pretokenize`]) plus merges applied directly to
//! bytes, with a per-thread word cache.
//!
//! The `tokenizers` pipeline allocates several objects per pre-token and
//! shares one locked word cache between threads, which made encoding slow
//! (about 7 µs per token) and kept parallel encoding from scaling. This
//! encoder gives the same ids (merges by lowest rank, then leftmost, as
//! `tokenizers` does) and is used only when the tokenizer's configuration is
//! exactly the one it implements; anything else goes through `tokenizers`.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use super::pretokenize::{DeepSeekSplitter, SplitCaches};

/// Words longer than this are not cached (they rarely repeat).
const CACHE_MAX_WORD: usize = 64;
/// The per-thread cache is cleared when it holds this many words.
const CACHE_CAPACITY: usize = 1 << 16;
/// Words up to this many bytes are merged with a plain scan, longer ones
/// with a heap.
const SCAN_MAX: usize = 24;

/// A small multiplicative hasher (FxHash style) for ids and short words.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

const FX_K: u64 = 0x517c_c1b7_2722_0a95;

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(FX_K);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }

    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type FxBuild = BuildHasherDefault<FxHasher>;

/// A merge: its rank (lower merges first) and the id it produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Merge {
    rank: u32,
    id: u32,
}

/// The fields of a serialized `tokenizers` BPE model this encoder reads.
#[derive(serde::Deserialize)]
struct BpeJson<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    dropout: Option<f64>,
    unk_token: Option<String>,
    continuing_subword_prefix: Option<String>,
    end_of_word_suffix: Option<String>,
    byte_fallback: Option<bool>,
    ignore_merges: Option<bool>,
    #[serde(borrow)]
    vocab: HashMap<Cow<'a, str>, u32, FxBuild>,
    #[serde(borrow)]
    merges: Vec<(Cow<'a, str>, Cow<'a, str>)>,
}

/// Distinguishes encoders so a thread's cache never serves another one.
static NEXT_ENCODER: AtomicU64 = AtomicU64::new(1);

/// Byte-level BPE with the DeepSeek pre-tokenizer.
#[derive(Debug)]
pub(crate) struct ByteBpe {
    serial: u64,
    byte_ids: [u32; 256],
    merges: HashMap<u64, Merge, FxBuild>,
    splitter: DeepSeekSplitter,
}

/// Per-thread state: search caches, word cache, merge scratch.
struct Scratch {
    serial: u64,
    caches: SplitCaches,
    words: HashMap<Box<[u8]>, Box<[u32]>, FxBuild>,
    symbols: Vec<u32>,
}

thread_local! {
    static SCRATCH: RefCell<Option<Scratch>> = const { RefCell::new(None) };
}

fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// The GPT-2 byte-to-character map of byte-level BPE.
pub(crate) fn byte_level_chars() -> [char; 256] {
    let printable = |b: u32| {
        (u32::from('!')..=u32::from('~')).contains(&b)
            || (0xA1..=0xAC).contains(&b)
            || (0xAE..=0xFF).contains(&b)
    };
    let mut map = ['\0'; 256];
    let mut shifted = 0u32;
    for (byte, slot) in map.iter_mut().enumerate() {
        let byte = byte as u32;
        let code = if printable(byte) {
            byte
        } else {
            shifted += 1;
            255 + shifted
        };
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    map
}

impl ByteBpe {
    /// Build from a `tokenizers` model serialized to JSON (`{"type": "BPE",
    /// "vocab": {...}, "merges": [[left, right], ...]}`). `None` when the
    /// model is not a plain byte-level BPE this encoder reproduces exactly.
    pub(crate) fn from_model_json(json: &str) -> Option<Self> {
        let model: BpeJson<'_> = serde_json::from_str(json).ok()?;
        // Options that change the algorithm: only their neutral values.
        if model.kind != "BPE"
            || model.dropout.is_some_and(|p| p > 0.0)
            || model.unk_token.is_some()
            || model.continuing_subword_prefix.is_some()
            || model.end_of_word_suffix.is_some()
            || model.byte_fallback == Some(true)
            || model.ignore_merges == Some(true)
        {
            return None;
        }
        let vocab = model.vocab;
        let id_of = |token: &str| vocab.get(token).copied();
        let chars = byte_level_chars();
        let mut byte_ids = [0u32; 256];
        for (slot, c) in byte_ids.iter_mut().zip(chars) {
            *slot = id_of(c.encode_utf8(&mut [0; 4]))?;
        }
        let mut merges = HashMap::with_capacity_and_hasher(model.merges.len(), FxBuild::default());
        let mut joined = String::new();
        for (rank, (left, right)) in model.merges.iter().enumerate() {
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let merge = Merge {
                rank: rank as u32,
                id: id_of(&joined)?,
            };
            merges
                .entry(pair_key(id_of(left)?, id_of(right)?))
                .or_insert(merge);
        }
        Some(Self {
            serial: NEXT_ENCODER.fetch_add(1, Ordering::Relaxed),
            byte_ids,
            merges,
            splitter: DeepSeekSplitter::new().ok()?,
        })
    }

    /// Append the ids of `text` to `ids`.
    pub(crate) fn encode_into(&self, text: &str, ids: &mut Vec<u32>) {
        SCRATCH.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.as_ref().is_none_or(|s| s.serial != self.serial) {
                *slot = Some(Scratch {
                    serial: self.serial,
                    caches: self.splitter.caches(),
                    words: HashMap::with_capacity_and_hasher(1024, FxBuild::default()),
                    symbols: Vec::new(),
                });
            }
            let Some(scratch) = slot.as_mut() else {
                return;
            };
            let Scratch {
                caches,
                words,
                symbols,
                ..
            } = scratch;
            self.splitter.for_each_piece(caches, text, &mut |piece| {
                let bytes = piece.as_bytes();
                if bytes.len() == 1 {
                    ids.push(self.byte_ids[bytes[0] as usize]);
                    return;
                }
                if bytes.len() <= CACHE_MAX_WORD {
                    if let Some(hit) = words.get(bytes) {
                        ids.extend_from_slice(hit);
                        return;
                    }
                    let start = ids.len();
                    self.merge_word(bytes, symbols, ids);
                    if words.len() >= CACHE_CAPACITY {
                        words.clear();
                    }
                    words.insert(bytes.into(), ids[start..].into());
                } else {
                    self.merge_word(bytes, symbols, ids);
                }
            });
        });
    }

    fn merge(&self, left: u32, right: u32) -> Option<Merge> {
        self.merges.get(&pair_key(left, right)).copied()
    }

    /// Apply the merges to one pre-token's bytes.
    fn merge_word(&self, bytes: &[u8], symbols: &mut Vec<u32>, ids: &mut Vec<u32>) {
        symbols.clear();
        symbols.extend(bytes.iter().map(|&b| self.byte_ids[b as usize]));
        if symbols.len() <= SCAN_MAX {
            // Lowest rank first; among equal ranks the leftmost.
            loop {
                let mut best: Option<(Merge, usize)> = None;
                for at in 0..symbols.len().saturating_sub(1) {
                    if let Some(merge) = self.merge(symbols[at], symbols[at + 1])
                        && best.is_none_or(|(b, _)| merge.rank < b.rank)
                    {
                        best = Some((merge, at));
                    }
                }
                let Some((merge, at)) = best else { break };
                symbols[at] = merge.id;
                symbols.remove(at + 1);
            }
            ids.extend_from_slice(symbols);
        } else {
            self.merge_long(symbols, ids);
        }
    }

    /// The heap version of the merge loop for long words (linear-ish instead
    /// of quadratic).
    fn merge_long(&self, symbols: &[u32], ids: &mut Vec<u32>) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let n = symbols.len();
        let mut id: Vec<u32> = symbols.to_vec();
        let mut alive = vec![true; n];
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut next: Vec<usize> = (1..=n).collect();
        let mut heap = BinaryHeap::new();
        for at in 0..n - 1 {
            if let Some(merge) = self.merge(id[at], id[at + 1]) {
                heap.push(Reverse((merge.rank, at, merge.id)));
            }
        }
        while let Some(Reverse((rank, at, merged))) = heap.pop() {
            if !alive[at] || next[at] >= n {
                continue;
            }
            let right = next[at];
            // Stale entry: the pair at `at` changed since it was queued.
            if self
                .merge(id[at], id[right])
                .is_none_or(|m| m.rank != rank || m.id != merged)
            {
                continue;
            }
            id[at] = merged;
            alive[right] = false;
            next[at] = next[right];
            if next[at] < n {
                prev[next[at]] = at;
            }
            if prev[at] < n
                && let Some(m) = self.merge(id[prev[at]], id[at])
            {
                heap.push(Reverse((m.rank, prev[at], m.id)));
            }
            if next[at] < n
                && let Some(m) = self.merge(id[at], id[next[at]])
            {
                heap.push(Reverse((m.rank, at, m.id)));
            }
        }
        let mut at = 0;
        while at < n {
            ids.push(id[at]);
            at = next[at];
        }
    }
}
