//! Regex constraints as a dense DFA over token bytes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use regex_automata::dfa::{Automaton, StartKind, dense};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind, util::syntax};

use super::vocab::GrammarVocab;
use super::{CompiledGrammar, GrammarError, Matcher};

/// A compiled regex constraint with per-state mask cache.
pub struct CompiledRegex {
    dfa: dense::DFA<Vec<u32>>,
    vocab: Arc<GrammarVocab>,
    start: StateID,
    masks: Mutex<HashMap<StateID, Arc<Vec<u32>>>>,
}

impl std::fmt::Debug for CompiledRegex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledRegex")
            .field("dfa_bytes", &self.dfa.memory_usage())
            .finish_non_exhaustive()
    }
}

impl CompiledRegex {
    /// Compile `pattern` (the whole output must match it) for `vocab`.
    pub fn new(
        pattern: &str,
        vocab: Arc<GrammarVocab>,
        size_limit: usize,
    ) -> Result<Self, GrammarError> {
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .match_kind(MatchKind::All)
                    .start_kind(StartKind::Anchored)
                    .dfa_size_limit(Some(size_limit))
                    .determinize_size_limit(Some(size_limit)),
            )
            .syntax(syntax::Config::new().utf8(false).unicode(true))
            .build(pattern)
            .map_err(|error| GrammarError::Compile(error.to_string()))?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|error| GrammarError::Compile(error.to_string()))?;
        let compiled = Self {
            dfa,
            vocab,
            start,
            masks: Mutex::new(HashMap::new()),
        };
        let first = compiled.mask(start);
        if first.iter().all(|&w| w == 0) && !compiled.accepting(start) {
            return Err(GrammarError::Unsatisfiable);
        }
        Ok(compiled)
    }

    fn accepting(&self, state: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(state))
    }

    fn dead(&self, state: StateID) -> bool {
        self.dfa.is_dead_state(state) || self.dfa.is_quit_state(state)
    }

    /// Whether the bytes read so far can still be completed. The DFA reports
    /// a match one byte late, so a state that only carries the delayed match
    /// of a shorter prefix is not dead yet leads nowhere: the prefix is
    /// viable only if it is itself complete or some next byte keeps the DFA
    /// alive (live NFA states always reach a match). Only match states can
    /// be in that position; any other live state is viable.
    fn viable(&self, state: StateID) -> bool {
        !self.dead(state)
            && (!self.dfa.is_match_state(state)
                || self.accepting(state)
                || (0..=255u8).any(|byte| !self.dead(self.dfa.next_state(state, byte))))
    }

    fn step(&self, state: StateID, bytes: &[u8]) -> Option<StateID> {
        let mut state = state;
        for &byte in bytes {
            state = self.dfa.next_state(state, byte);
            if self.dead(state) {
                return None;
            }
        }
        self.viable(state).then_some(state)
    }

    /// Allowed plain tokens from `state` (end of sequence not included).
    fn mask(&self, state: StateID) -> Arc<Vec<u32>> {
        if let Ok(cache) = self.masks.lock()
            && let Some(mask) = cache.get(&state)
        {
            return Arc::clone(mask);
        }
        let vocab = &self.vocab;
        let mut mask = vec![0u32; vocab.mask_words()];
        // stack[k]: state after the first k bytes of the current token.
        let mut stack: Vec<StateID> = vec![state];
        let mut dead_from: Option<u32> = None;
        let mut viable: HashMap<StateID, bool> = HashMap::new();
        for &(id, start, len, common) in &vocab.sorted {
            if let Some(depth) = dead_from {
                if common >= depth {
                    continue;
                }
                dead_from = None;
            }
            stack.truncate(stack.len().min(common as usize + 1));
            let token = &vocab.bytes[start as usize..(start + len) as usize];
            let mut alive = true;
            while stack.len() <= token.len() {
                let k = stack.len() - 1;
                let next = self.dfa.next_state(stack[k], token[k]);
                if self.dead(next) {
                    dead_from = Some(k as u32 + 1);
                    alive = false;
                    break;
                }
                stack.push(next);
            }
            let end = stack[token.len().min(stack.len() - 1)];
            let mut viable_end = || {
                !self.dfa.is_match_state(end)
                    || *viable.entry(end).or_insert_with(|| self.viable(end))
            };
            if alive && viable_end() {
                mask[id as usize / 32] |= 1 << (id % 32);
            }
        }
        let mask = Arc::new(mask);
        if let Ok(mut cache) = self.masks.lock() {
            cache.insert(state, Arc::clone(&mask));
        }
        mask
    }
}

/// A shareable handle to a [`CompiledRegex`] (matchers share its mask cache).
#[derive(Debug, Clone)]
pub struct RegexGrammar(pub Arc<CompiledRegex>);

impl CompiledGrammar for RegexGrammar {
    fn matcher(&self) -> Box<dyn Matcher> {
        Box::new(RegexMatcher::new(Arc::clone(&self.0)))
    }
}

/// Matches tokens against a [`CompiledRegex`].
#[derive(Debug)]
pub struct RegexMatcher {
    compiled: Arc<CompiledRegex>,
    /// State after each accepted token (first: the start state).
    states: Vec<StateID>,
    /// Number of end-of-sequence tokens accepted (at the end of `states`).
    finished: usize,
}

impl RegexMatcher {
    /// A matcher sharing `compiled` (and its mask cache).
    pub fn new(compiled: Arc<CompiledRegex>) -> Self {
        Self {
            states: vec![compiled.start],
            compiled,
            finished: 0,
        }
    }

    fn state(&self) -> StateID {
        self.states[self.states.len() - 1]
    }
}

impl Matcher for RegexMatcher {
    fn fill_bitmask(&mut self, mask: &mut [u32]) -> Result<(), GrammarError> {
        mask.fill(0);
        if self.finished > 0 {
            return Ok(());
        }
        let allowed = self.compiled.mask(self.state());
        for (out, word) in mask.iter_mut().zip(allowed.iter()) {
            *out = *word;
        }
        let mut any = allowed.iter().any(|&w| w != 0);
        if self.compiled.accepting(self.state()) {
            any |= self.compiled.vocab.allow_eos(mask);
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
        if self.compiled.vocab.eos.contains(&token) {
            if self.compiled.accepting(self.state()) {
                self.finished += 1;
                self.states.push(self.state());
                return Ok(());
            }
            return Err(GrammarError::Rejected(token));
        }
        let bytes = self
            .compiled
            .vocab
            .token(token)
            .ok_or(GrammarError::Rejected(token))?;
        let next = self
            .compiled
            .step(self.state(), bytes)
            .ok_or(GrammarError::Rejected(token))?;
        self.states.push(next);
        Ok(())
    }

    fn rollback(&mut self, count: usize) -> Result<(), GrammarError> {
        if count >= self.states.len() {
            return Err(GrammarError::Rollback(count));
        }
        for _ in 0..count {
            self.states.pop();
            self.finished = self.finished.saturating_sub(1);
        }
        Ok(())
    }

    fn is_complete(&self) -> bool {
        self.finished > 0 || self.compiled.accepting(self.state())
    }
}
