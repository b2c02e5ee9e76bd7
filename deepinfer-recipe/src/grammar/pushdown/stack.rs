//! Parse configurations and their interned stacks of return states.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use regex_automata::util::primitives::StateID;

use super::SCAN_DEDUP;

/// A multiplicative hasher for the small integer keys (state ids, frame
/// nodes) of the matcher's hot maps; SipHash costs more than the lookups.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u32(u32::from(byte));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0.rotate_left(29) ^ u64::from(n)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

pub(super) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Stack bottom: nothing below this frame.
pub(super) const BOTTOM: u32 = u32::MAX;
/// Unknown context (mask classification): any caller may be below.
pub(super) const UNKNOWN: u32 = u32::MAX - 1;

/// One parse: the current DFA state and the chain of return states below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Config {
    pub(super) state: StateID,
    pub(super) below: u32,
    /// Reached by guessing a caller (classification only).
    pub(super) approx: bool,
}

/// Membership of a configuration list being built: a scan while it is
/// short, a hash set once it is long (see [`SCAN_DEDUP`]).
#[derive(Debug, Default)]
pub(super) struct Dedup {
    set: std::collections::HashSet<Config, BuildHasherDefault<IdHasher>>,
    /// Entries of the list already in `set`.
    synced: usize,
}

impl Dedup {
    /// Start on a new list (free when the last list stayed short).
    #[inline]
    pub(super) fn reset(&mut self) {
        if self.synced > 0 {
            self.set.clear();
            self.synced = 0;
        }
    }

    /// Push `config` onto `list` unless it is there.
    #[inline]
    pub(super) fn add(&mut self, list: &mut Vec<Config>, config: Config) {
        if list.len() < SCAN_DEDUP {
            if !list.contains(&config) {
                list.push(config);
            }
            return;
        }
        while let Some(&known) = list.get(self.synced) {
            self.set.insert(known);
            self.synced += 1;
        }
        if self.set.insert(config) {
            list.push(config);
            self.synced += 1;
        }
    }
}

/// Interned stack frames: (return state, frame below, depth).
#[derive(Debug, Clone, Default)]
pub(super) struct Arena {
    pub(super) nodes: Vec<(StateID, u32, u32)>,
    intern: IdMap<(StateID, u32), u32>,
}

impl Arena {
    pub(super) fn depth(&self, below: u32) -> u32 {
        if below >= UNKNOWN {
            0
        } else {
            self.nodes[below as usize].2
        }
    }

    pub(super) fn push(&mut self, state: StateID, below: u32) -> u32 {
        if let Some(&node) = self.intern.get(&(state, below)) {
            return node;
        }
        let node = self.nodes.len() as u32;
        let depth = self.depth(below) + 1;
        self.nodes.push((state, below, depth));
        self.intern.insert((state, below), node);
        node
    }

    pub(super) fn truncate(&mut self, len: usize) {
        for (state, below, _) in self.nodes.drain(len..) {
            self.intern.remove(&(state, below));
        }
    }
}

/// Whether the stack under `below` starts with return states `frames` (and
/// ends right after them when `bottom`).
pub(super) fn frames_match(arena: &Arena, below: u32, frames: &[StateID], bottom: bool) -> bool {
    let mut node = below;
    for &frame in frames {
        if node >= UNKNOWN || arena.nodes[node as usize].0 != frame {
            return false;
        }
        node = arena.nodes[node as usize].1;
    }
    !bottom || node == BOTTOM
}
