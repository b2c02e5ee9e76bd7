//! Reading bytes: the closure over calls and returns, one byte step, and
//! the trie walk of a sorted token list.

use regex_automata::dfa::Automaton;

use super::compile::CompiledPushdown;
use super::stack::{Arena, BOTTOM, Config, Dedup, UNKNOWN};
use super::{CALL_BYTE, PLAIN};

/// What the context-dependent walk looked at below its start.
#[derive(Debug, Default)]
pub(super) struct Track {
    /// Frame nodes of the start stack by depth (index 0 unused).
    pub(super) chain: Vec<u32>,
    /// Shallowest start frame popped into (`u32::MAX`: none).
    pub(super) min_popped: u32,
    pub(super) bottom: bool,
    /// Scratch of `closure` and `step`.
    pub(super) dedup: Dedup,
}

/// Reusable trie-walk buffers.
#[derive(Debug, Default)]
pub(super) struct Walk {
    levels: Vec<Vec<Config>>,
    closed: Vec<Vec<Config>>,
    closed_ok: Vec<bool>,
}

pub(super) enum Outcome {
    Accepted,
    Uncertain,
    Rejected,
}

impl CompiledPushdown {
    /// Add the configurations reachable without reading text (calls and
    /// returns) to `set`, into `out`.
    pub(super) fn closure(
        &self,
        arena: &mut Arena,
        track: &mut Track,
        set: &[Config],
        out: &mut Vec<Config>,
    ) {
        out.clear();
        out.extend_from_slice(set);
        let Track {
            chain,
            min_popped,
            bottom,
            dedup,
        } = track;
        dedup.reset();
        let mut i = 0;
        while i < out.len() {
            let config = out[i];
            i += 1;
            let Some(info) = self.info(config.state) else {
                continue;
            };
            for &(rule, ret) in &info.calls {
                let below = arena.push(ret, config.below);
                dedup.add(
                    out,
                    Config {
                        state: self.starts[rule as usize],
                        below,
                        approx: config.approx,
                    },
                );
            }
            if !info.accepting {
                continue;
            }
            match config.below {
                BOTTOM => *bottom = true,
                UNKNOWN => {
                    for &ret in &self.returns[info.rule as usize] {
                        dedup.add(
                            out,
                            Config {
                                state: ret,
                                below: UNKNOWN,
                                approx: true,
                            },
                        );
                    }
                }
                node => {
                    let (state, below, depth) = arena.nodes[node as usize];
                    if chain.get(depth as usize) == Some(&node) {
                        *min_popped = (*min_popped).min(depth);
                    }
                    dedup.add(
                        out,
                        Config {
                            state,
                            below,
                            approx: config.approx,
                        },
                    );
                }
            }
        }
    }

    /// Read one text byte from closed configurations.
    pub(super) fn step(
        &self,
        closed: &[Config],
        byte: u8,
        out: &mut Vec<Config>,
        dedup: &mut Dedup,
    ) {
        out.clear();
        dedup.reset();
        if byte == CALL_BYTE {
            return;
        }
        for config in closed {
            let next = self.dfa.next_state(config.state, byte);
            if self.good(next) {
                dedup.add(
                    out,
                    Config {
                        state: next,
                        ..*config
                    },
                );
            }
        }
    }

    /// Walk `tokens` (sorted by bytes, so shared prefixes are read once)
    /// from `start`, reporting each token's outcome.
    pub(super) fn walk<'t>(
        &self,
        arena: &mut Arena,
        track: &mut Track,
        buffers: &mut Walk,
        start: Config,
        tokens: impl Iterator<Item = (usize, &'t [u8], Option<usize>)>,
        mut emit: impl FnMut(usize, Outcome),
    ) {
        let Walk {
            levels,
            closed,
            closed_ok,
        } = buffers;
        if levels.is_empty() {
            levels.push(Vec::new());
            closed.push(Vec::new());
            closed_ok.push(false);
        }
        levels[0].clear();
        levels[0].push(start);
        closed_ok[0] = false;
        let mut prev: &[u8] = &[];
        let mut valid = 0usize;
        for (key, bytes, known) in tokens {
            // Bytes shared with the previous token (given for the whole
            // sorted vocabulary, computed for subsets).
            let common =
                known.unwrap_or_else(|| bytes.iter().zip(prev).take_while(|(a, b)| a == b).count());
            prev = bytes;
            let mut level = valid.min(common);
            if levels.len() <= bytes.len() {
                levels.resize(bytes.len() + 1, Vec::new());
                closed.resize(bytes.len() + 1, Vec::new());
                closed_ok.resize(bytes.len() + 1, false);
            }
            while level < bytes.len() && !levels[level].is_empty() {
                let (done, rest) = levels.split_at_mut(level + 1);
                let here = &done[level];
                let next = &mut rest[0];
                // One configuration with no call or return to take: read the
                // byte like a plain DFA (most of the vocabulary goes here).
                if let [single] = here.as_slice()
                    && self.flags(single.state) & PLAIN != 0
                {
                    next.clear();
                    let state = self.dfa.next_state(single.state, bytes[level]);
                    if bytes[level] != CALL_BYTE && self.good(state) {
                        next.push(Config { state, ..*single });
                    }
                } else {
                    if !closed_ok[level] {
                        self.closure(arena, track, here, &mut closed[level]);
                        closed_ok[level] = true;
                    }
                    self.step(&closed[level], bytes[level], next, &mut track.dedup);
                }
                closed_ok[level + 1] = false;
                level += 1;
            }
            valid = level;
            let end = &levels[level];
            let outcome = if level < bytes.len() || end.is_empty() {
                Outcome::Rejected
            } else if end.iter().any(|c| !c.approx) {
                Outcome::Accepted
            } else {
                Outcome::Uncertain
            };
            emit(key, outcome);
        }
    }
}
