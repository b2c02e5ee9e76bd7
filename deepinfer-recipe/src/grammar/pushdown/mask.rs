//! Mask caches: the stack-independent classification of each DFA state and
//! the cached resolutions of its stack-dependent tokens.

use std::sync::Arc;

use regex_automata::util::primitives::StateID;

use super::RESOLVED_PER_STATE;
use super::compile::CompiledPushdown;
use super::stack::{Arena, BOTTOM, Config, Dedup, UNKNOWN, frames_match};
use super::walk::{Outcome, Track, Walk};

/// Mask classification of one DFA state, stack below unknown.
#[derive(Debug)]
pub(super) struct Classified {
    /// Tokens accepted whatever the stack.
    pub(super) accepted: Vec<u32>,
    /// Positions in `vocab.sorted` of tokens that depend on the stack.
    pub(super) uncertain: Vec<u32>,
    /// Whether `accepted` has any token.
    pub(super) any: bool,
}

/// Uncertain tokens resolved against a stack whose top frames are `frames`.
#[derive(Debug)]
pub(super) struct Resolved {
    frames: Vec<StateID>,
    /// The walk saw the stack end right below `frames`.
    bottom: bool,
    pub(super) accepted: Vec<u32>,
}

impl CompiledPushdown {
    fn sorted_token(&self, position: usize) -> (u32, &[u8]) {
        let (id, start, len, _) = self.vocab.sorted[position];
        (
            id,
            &self.vocab.bytes[start as usize..(start + len) as usize],
        )
    }

    /// The stack-independent classification of `state` (cached).
    pub(super) fn classified(&self, state: StateID) -> Arc<Classified> {
        if let Ok(cache) = self.classes.lock()
            && let Some(found) = cache.get(&state)
        {
            return Arc::clone(found);
        }
        let rule = self.info(state).map_or(0, |i| i.rule as usize);
        let below = if self.returns[rule].is_empty() {
            BOTTOM
        } else {
            UNKNOWN
        };
        let start = Config {
            state,
            below,
            approx: false,
        };
        let mut accepted = vec![0u32; self.vocab.mask_words()];
        let mut uncertain = Vec::new();
        let tokens = self
            .vocab
            .sorted
            .iter()
            .enumerate()
            .map(|(p, &(_, start, len, common))| {
                let bytes = &self.vocab.bytes[start as usize..(start + len) as usize];
                (p, bytes, Some(common as usize))
            });
        self.walk(
            &mut Arena::default(),
            &mut Track::default(),
            &mut Walk::default(),
            start,
            tokens,
            |position, outcome| match outcome {
                Outcome::Accepted => {
                    let id = self.vocab.sorted[position].0;
                    accepted[id as usize / 32] |= 1 << (id % 32);
                }
                Outcome::Uncertain => uncertain.push(position as u32),
                Outcome::Rejected => {}
            },
        );
        let classified = Arc::new(Classified {
            any: accepted.iter().any(|&w| w != 0),
            accepted,
            uncertain,
        });
        if let Ok(mut cache) = self.classes.lock() {
            cache.insert(state, Arc::clone(&classified));
        }
        classified
    }

    /// The uncertain tokens of `config`'s state that its real stack accepts.
    pub(super) fn resolve(
        &self,
        arena: &mut Arena,
        buffers: &mut Walk,
        config: Config,
        classified: &Classified,
    ) -> Arc<Resolved> {
        if let Ok(cache) = self.resolved.lock()
            && let Some(entries) = cache.get(&config.state)
        {
            for entry in entries {
                if frames_match(arena, config.below, &entry.frames, entry.bottom) {
                    return Arc::clone(entry);
                }
            }
        }
        let depth = arena.depth(config.below) as usize;
        let mut track = Track {
            chain: vec![BOTTOM; depth + 1],
            min_popped: u32::MAX,
            bottom: false,
            dedup: Dedup::default(),
        };
        let mut node = config.below;
        while node < UNKNOWN {
            let (_, below, d) = arena.nodes[node as usize];
            track.chain[d as usize] = node;
            node = below;
        }
        let watermark = arena.nodes.len();
        let mut accepted = Vec::new();
        let tokens = classified.uncertain.iter().map(|&p| {
            let (_, bytes) = self.sorted_token(p as usize);
            (p as usize, bytes, None)
        });
        self.walk(
            arena,
            &mut track,
            buffers,
            config,
            tokens,
            |position, outcome| {
                if matches!(outcome, Outcome::Accepted) {
                    accepted.push(self.vocab.sorted[position].0);
                }
            },
        );
        arena.truncate(watermark);
        // Frames looked at: from the top's caller down to the shallowest
        // popped one (all of them when the walk saw the bottom).
        let lowest = if track.bottom {
            1
        } else {
            track.min_popped.max(1) as usize
        };
        let mut frames = Vec::new();
        if track.bottom || track.min_popped != u32::MAX {
            for d in (lowest..=depth).rev() {
                frames.push(arena.nodes[track.chain[d] as usize].0);
            }
        }
        let resolved = Arc::new(Resolved {
            frames,
            bottom: track.bottom,
            accepted,
        });
        if let Ok(mut cache) = self.resolved.lock() {
            let entries = cache.entry(config.state).or_default();
            if entries.len() < RESOLVED_PER_STATE {
                entries.push(Arc::clone(&resolved));
            }
        }
        resolved
    }
}
