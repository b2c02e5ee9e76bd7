//! Model-state snapshots for prefix hits.
//!
//! `deepinfer-kv` decides *which* prompt tokens a request may reuse (whole blocks, the hit
//! rule); the model keeps its cache state per sequence ([`SeqState`]), so the engine keeps
//! copies of that state at block-aligned prefix lengths, keyed by a hash chain over the
//! blocks' token ids (the tokens are compared on a hit, so a collision cannot leak state).
//! When a request resumes at position `p` the longest snapshot at or below `p` is cloned and
//! the tokens between it and `p` are replayed in the same forward call; without a snapshot
//! the whole prefix is replayed. Either way the state is exact.

use crate::SeqState;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

struct Entry<T> {
    tokens: Vec<u32>,
    state: SeqState<T>,
    last_used: u64,
}

/// Bounded LRU store of per-prefix model states.
pub(crate) struct PrefixStates<T> {
    block: usize,
    capacity: usize,
    map: HashMap<u64, Entry<T>>,
    tick: u64,
}

/// Hash after each full block of `tokens` (`out[k]` covers `tokens[..(k + 1) * block]`).
fn chain(tokens: &[u32], block: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(tokens.len() / block);
    let mut h = 0u64;
    for blk in tokens.chunks_exact(block) {
        // DefaultHasher::new() has fixed keys: the same chain in every run.
        let mut s = DefaultHasher::new();
        h.hash(&mut s);
        blk.hash(&mut s);
        h = s.finish();
        out.push(h);
    }
    out
}

impl<T: Clone> PrefixStates<T> {
    /// A store keyed on `block`-token boundaries holding at most `capacity` states.
    pub(crate) fn new(block: usize, capacity: usize) -> Self {
        Self {
            block: block.max(1),
            capacity,
            map: HashMap::new(),
            tick: 0,
        }
    }

    /// Keep `state`, keyed by the tokens it consumed (ignored unless block-aligned).
    pub(crate) fn insert(&mut self, state: SeqState<T>) {
        let tokens = &state.history[..state.pos.min(state.history.len())];
        if self.capacity == 0
            || tokens.is_empty()
            || tokens.len() != state.pos
            || !tokens.len().is_multiple_of(self.block)
        {
            return;
        }
        let Some(&key) = chain(tokens, self.block).last() else {
            return;
        };
        self.tick += 1;
        if let Some(e) = self.map.get_mut(&key) {
            e.last_used = self.tick;
            return;
        }
        if self.map.len() >= self.capacity
            && let Some((&old, _)) = self.map.iter().min_by_key(|(_, e)| e.last_used)
        {
            self.map.remove(&old);
        }
        let tokens = tokens.to_vec();
        self.map.insert(
            key,
            Entry {
                tokens,
                state,
                last_used: self.tick,
            },
        );
    }

    /// The longest stored state for a block-aligned prefix of `tokens`.
    pub(crate) fn lookup(&mut self, tokens: &[u32]) -> Option<SeqState<T>> {
        let hashes = chain(tokens, self.block);
        self.tick += 1;
        for (k, h) in hashes.iter().enumerate().rev() {
            let len = (k + 1) * self.block;
            if let Some(e) = self.map.get_mut(h)
                && e.tokens == tokens[..len]
            {
                e.last_used = self.tick;
                // No room in the global pool for the copy: replay instead.
                return e.state.try_clone().ok();
            }
        }
        None
    }

    /// Drop the least recently used state; false when none is held.
    pub(crate) fn evict_lru(&mut self) -> bool {
        match self.map.iter().min_by_key(|(_, e)| e.last_used) {
            Some((&k, _)) => {
                self.map.remove(&k);
                true
            }
            None => false,
        }
    }

    /// States held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state that consumed `tokens`.
    fn st(tokens: &[u32]) -> SeqState<u8> {
        let mut s = SeqState::new(1, 0);
        s.pos = tokens.len();
        s.history = tokens.to_vec();
        s
    }

    #[test]
    fn longest_aligned_prefix_wins_and_tokens_are_checked() {
        let mut p = PrefixStates::new(4, 8);
        let toks: Vec<u32> = (0..12).collect();
        p.insert(st(&toks[..4]));
        p.insert(st(&toks[..8]));
        p.insert(st(&toks[..6])); // not aligned: ignored
        assert_eq!(p.len(), 2);
        assert_eq!(p.lookup(&toks[..11]).map(|s| s.pos), Some(8));
        assert_eq!(p.lookup(&toks[..7]).map(|s| s.pos), Some(4));
        let other: Vec<u32> = (100..112).collect();
        assert!(p.lookup(&other).is_none());
    }

    #[test]
    fn capacity_evicts_least_recently_used() {
        let mut p = PrefixStates::new(2, 2);
        p.insert(st(&[1, 2]));
        p.insert(st(&[3, 4]));
        assert!(p.lookup(&[1, 2]).is_some());
        p.insert(st(&[5, 6]));
        assert_eq!(p.len(), 2);
        assert!(p.lookup(&[3, 4]).is_none());
        assert!(p.lookup(&[1, 2]).is_some());
    }
}
