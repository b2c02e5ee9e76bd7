//! The matcher over a [`CompiledPushdown`] and its shareable grammar handle.

use std::sync::Arc;

use super::MAX_LIVE_PARSES;
use super::compile::CompiledPushdown;
use super::stack::{Arena, BOTTOM, Config, UNKNOWN};
use super::walk::{Track, Walk};
use crate::grammar::{CompiledGrammar, GrammarError, Matcher};

/// A shareable handle to a [`CompiledPushdown`] (matchers share its caches).
#[derive(Debug, Clone)]
pub struct PushdownGrammar(pub Arc<CompiledPushdown>);

impl CompiledGrammar for PushdownGrammar {
    fn matcher(&self) -> Box<dyn Matcher> {
        Box::new(PushdownMatcher::new(Arc::clone(&self.0)))
    }
}

/// Matches tokens against a [`CompiledPushdown`].
#[derive(Debug)]
pub struct PushdownMatcher {
    pub(super) compiled: Arc<CompiledPushdown>,
    arena: Arena,
    /// Parses after each accepted token (first: the start), and whether the
    /// output is complete there.
    history: Vec<(Vec<Config>, bool)>,
    /// Number of end-of-sequence tokens accepted (at the end of `history`).
    finished: usize,
    buffers: Walk,
    scratch: Vec<Config>,
}

impl PushdownMatcher {
    /// A matcher at the start of the output, sharing `compiled`'s caches.
    pub fn new(compiled: Arc<CompiledPushdown>) -> Self {
        let start = Config {
            state: compiled.starts[0],
            below: BOTTOM,
            approx: false,
        };
        let mut matcher = Self {
            compiled,
            arena: Arena::default(),
            history: Vec::new(),
            finished: 0,
            buffers: Walk::default(),
            scratch: Vec::new(),
        };
        let complete = matcher.completable(&start);
        matcher.history.push((vec![start], complete));
        matcher
    }

    /// Deepest stack among the live parses (1 at top level).
    pub fn depth(&self) -> usize {
        self.current()
            .iter()
            .map(|c| self.arena.depth(c.below) as usize + 1)
            .max()
            .unwrap_or(0)
    }

    fn current(&self) -> &[Config] {
        self.history.last().map_or(&[], |(set, _)| set.as_slice())
    }

    /// Every frame can finish without reading text.
    fn completable(&self, config: &Config) -> bool {
        let eps = |state| {
            self.compiled
                .info(state)
                .is_some_and(|info| info.eps_accept)
        };
        if !eps(config.state) {
            return false;
        }
        let mut node = config.below;
        while node < UNKNOWN {
            let (state, below, _) = self.arena.nodes[node as usize];
            if !eps(state) {
                return false;
            }
            node = below;
        }
        true
    }
}

impl Matcher for PushdownMatcher {
    fn fill_bitmask(&mut self, mask: &mut [u32]) -> Result<(), GrammarError> {
        if self.finished > 0 {
            mask.fill(0);
            return Ok(());
        }
        let compiled = Arc::clone(&self.compiled);
        let count = self.current().len();
        if count == 0 {
            mask.fill(0);
        }
        let mut any = false;
        for index in 0..count {
            let config = self.current()[index];
            let classified = compiled.classified(config.state);
            let words = mask.len().min(classified.accepted.len());
            if index == 0 {
                // The first parse's cached mask is copied, not merged.
                let (head, tail) = mask.split_at_mut(words);
                head.copy_from_slice(&classified.accepted[..words]);
                tail.fill(0);
            } else {
                for (out, word) in mask.iter_mut().zip(&classified.accepted) {
                    *out |= *word;
                }
            }
            any |= classified.any;
            if classified.uncertain.is_empty() {
                continue;
            }
            let resolved =
                compiled.resolve(&mut self.arena, &mut self.buffers, config, &classified);
            for &id in &resolved.accepted {
                if let Some(word) = mask.get_mut(id as usize / 32) {
                    *word |= 1 << (id % 32);
                    any = true;
                }
            }
        }
        if self.is_complete() {
            any |= compiled.vocab.allow_eos(mask);
        }
        if any {
            Ok(())
        } else {
            Err(GrammarError::Unsatisfiable)
        }
    }

    fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        if self.finished > 0 {
            return Err(GrammarError::Rejected(token));
        }
        let compiled = Arc::clone(&self.compiled);
        if compiled.vocab.eos.contains(&token) {
            if self.is_complete() {
                self.finished += 1;
                let last = self.history.last().cloned().unwrap_or_default();
                self.history.push(last);
                return Ok(());
            }
            return Err(GrammarError::Rejected(token));
        }
        let bytes = compiled
            .vocab
            .token(token)
            .ok_or(GrammarError::Rejected(token))?;
        let mut set = self.current().to_vec();
        let mut track = Track::default();
        for &byte in bytes {
            compiled.closure(&mut self.arena, &mut track, &set, &mut self.scratch);
            compiled.step(&self.scratch, byte, &mut set, &mut track.dedup);
            if set.is_empty() {
                return Err(GrammarError::Rejected(token));
            }
        }
        let cap = compiled.max_depth;
        set.retain(|c| (self.arena.depth(c.below) as usize) < cap);
        if set.is_empty() {
            return Err(GrammarError::DepthLimit(cap));
        }
        if set.len() > MAX_LIVE_PARSES {
            return Err(GrammarError::TooAmbiguous(MAX_LIVE_PARSES));
        }
        let complete = set.iter().any(|c| self.completable(c));
        self.history.push((set, complete));
        Ok(())
    }

    fn rollback(&mut self, count: usize) -> Result<(), GrammarError> {
        if count >= self.history.len() {
            return Err(GrammarError::Rollback(count));
        }
        for _ in 0..count {
            self.history.pop();
            self.finished = self.finished.saturating_sub(1);
        }
        Ok(())
    }

    fn is_complete(&self) -> bool {
        self.finished > 0 || self.history.last().is_some_and(|(_, complete)| *complete)
    }
}
