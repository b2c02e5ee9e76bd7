//! Compiling [`Rules`] into a [`CompiledPushdown`]: the DFA, per-state
//! facts (calls, productive states, left recursion) and the empty caches.

use std::sync::{Arc, Mutex};

use regex_automata::dfa::{Automaton, StartKind, dense};
use regex_automata::util::primitives::{PatternID, StateID};
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind, util::syntax};

use super::mask::{Classified, Resolved};
use super::matcher::PushdownMatcher;
use super::rules::Rules;
use super::stack::IdMap;
use super::{CALL_BYTE, GOOD, MAX_RULES, PLAIN};
use crate::grammar::vocab::GrammarVocab;
use crate::grammar::{GrammarError, Matcher};

#[derive(Debug, Clone, Default)]
pub(super) struct StateInfo {
    pub(super) rule: u32,
    pub(super) accepting: bool,
    /// Can still reach an accepting state of its rule (text and productive calls).
    good: bool,
    /// Can reach an accepting state without reading text.
    pub(super) eps_accept: bool,
    /// Calls possible here: (rule, return state).
    pub(super) calls: Vec<(u32, StateID)>,
}

/// A compiled recursive grammar with its mask caches.
pub struct CompiledPushdown {
    pub(super) dfa: dense::DFA<Vec<u32>>,
    pub(super) vocab: Arc<GrammarVocab>,
    stride2: usize,
    pub(super) starts: Vec<StateID>,
    info: Vec<StateInfo>,
    /// Per state index: [`GOOD`] and [`PLAIN`] bits (hot-loop copy of `info`).
    flags: Vec<u8>,
    /// Return states of each rule's call sites.
    pub(super) returns: Vec<Vec<StateID>>,
    pub(super) max_depth: usize,
    pub(super) classes: Mutex<IdMap<StateID, Arc<Classified>>>,
    pub(super) resolved: Mutex<IdMap<StateID, Vec<Arc<Resolved>>>>,
}

impl std::fmt::Debug for CompiledPushdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledPushdown")
            .field("rules", &self.starts.len())
            .field("states", &self.info.len())
            .field("dfa_bytes", &self.dfa.memory_usage())
            .field("max_depth", &self.max_depth)
            .finish_non_exhaustive()
    }
}

fn compile_error(error: impl std::fmt::Display) -> GrammarError {
    GrammarError::Compile(error.to_string())
}

impl CompiledPushdown {
    /// Compile `rules` for `vocab`; `max_depth` caps the stack depth.
    pub fn new(
        rules: &Rules,
        vocab: Arc<GrammarVocab>,
        size_limit: usize,
        max_depth: usize,
    ) -> Result<Self, GrammarError> {
        if rules.is_empty() {
            return Err(GrammarError::Compile("the grammar has no rules".into()));
        }
        if rules.len() > MAX_RULES {
            return Err(GrammarError::Unsupported(format!(
                "{} recursive rules (at most {MAX_RULES})",
                rules.len()
            )));
        }
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .match_kind(MatchKind::All)
                    .start_kind(StartKind::Anchored)
                    .starts_for_each_pattern(true)
                    .dfa_size_limit(Some(size_limit))
                    .determinize_size_limit(Some(size_limit)),
            )
            .syntax(syntax::Config::new().utf8(false).unicode(true))
            .build_many(&rules.bodies)
            .map_err(compile_error)?;
        let starts = (0..rules.len())
            .map(|rule| {
                let pattern = PatternID::new(rule).map_err(compile_error)?;
                dfa.start_state(&start::Config::new().anchored(Anchored::Pattern(pattern)))
                    .map_err(compile_error)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut compiled = Self {
            stride2: dfa.stride2(),
            dfa,
            vocab,
            starts,
            info: Vec::new(),
            flags: Vec::new(),
            returns: vec![Vec::new(); rules.len()],
            max_depth,
            classes: Mutex::new(IdMap::default()),
            resolved: Mutex::new(IdMap::default()),
        };
        let edges = compiled.explore(rules.len())?;
        let productive = compiled.mark_good(&edges);
        if !productive[0] {
            return Err(GrammarError::Unsatisfiable);
        }
        for info in &mut compiled.info {
            info.calls.retain(|&(rule, _)| productive[rule as usize]);
        }
        let good: Vec<bool> = compiled.info.iter().map(|i| i.good).collect();
        let stride2 = compiled.stride2;
        for info in &mut compiled.info {
            info.calls
                .retain(|&(_, ret)| good.get(ret.as_usize() >> stride2) == Some(&true));
        }
        for info in &compiled.info {
            for &(rule, ret) in &info.calls {
                let returns = &mut compiled.returns[rule as usize];
                if !returns.contains(&ret) {
                    returns.push(ret);
                }
            }
        }
        compiled.mark_eps_accept();
        compiled.flags = compiled
            .info
            .iter()
            .map(|info| {
                let plain = info.calls.is_empty() && !info.accepting;
                (u8::from(info.good) * GOOD) | (u8::from(plain) * PLAIN)
            })
            .collect();
        compiled.check_left_recursion(rules)?;
        let mut matcher = PushdownMatcher::new(Arc::new(compiled));
        let mut mask = vec![0u32; matcher.compiled.vocab.mask_words()];
        matcher.fill_bitmask(&mut mask)?;
        Arc::try_unwrap(matcher.compiled)
            .map_err(|_| GrammarError::Compile("pushdown grammar still shared".into()))
    }

    fn index(&self, state: StateID) -> usize {
        state.as_usize() >> self.stride2
    }

    pub(super) fn info(&self, state: StateID) -> Option<&StateInfo> {
        self.info.get(self.index(state))
    }

    pub(super) fn flags(&self, state: StateID) -> u8 {
        self.flags.get(self.index(state)).copied().unwrap_or(0)
    }

    pub(super) fn good(&self, state: StateID) -> bool {
        self.flags(state) & GOOD != 0
    }

    fn dead(&self, state: StateID) -> bool {
        self.dfa.is_dead_state(state) || self.dfa.is_quit_state(state)
    }

    /// Visit every state reachable from the rule starts; record calls and
    /// accepting states; return the text edges (by state index).
    fn explore(&mut self, rules: usize) -> Result<Vec<Vec<u32>>, GrammarError> {
        let mut seen: Vec<bool> = Vec::new();
        let mut edges: Vec<Vec<u32>> = Vec::new();
        let mut queue: Vec<StateID> = Vec::new();
        let visit = |this: &mut Self,
                     seen: &mut Vec<bool>,
                     queue: &mut Vec<StateID>,
                     state: StateID,
                     rule: u32| {
            let index = this.index(state);
            if index >= seen.len() {
                seen.resize(index + 1, false);
                this.info.resize(index + 1, StateInfo::default());
            }
            if !seen[index] {
                seen[index] = true;
                this.info[index].rule = rule;
                this.info[index].accepting =
                    this.dfa.is_match_state(this.dfa.next_eoi_state(state));
                queue.push(state);
            }
        };
        for rule in 0..rules {
            let start = self.starts[rule];
            visit(self, &mut seen, &mut queue, start, rule as u32);
        }
        while let Some(state) = queue.pop() {
            let index = self.index(state);
            let rule = self.info[index].rule;
            let mut targets = Vec::new();
            for byte in 0..=255u8 {
                if byte == CALL_BYTE {
                    continue;
                }
                let next = self.dfa.next_state(state, byte);
                if !self.dead(next) {
                    targets.push(self.index(next) as u32);
                    visit(self, &mut seen, &mut queue, next, rule);
                }
            }
            targets.sort_unstable();
            targets.dedup();
            if edges.len() <= index {
                edges.resize(index + 1, Vec::new());
            }
            edges[index] = targets;
            let marker = self.dfa.next_state(state, CALL_BYTE);
            if self.dead(marker) {
                continue;
            }
            let mut calls = Vec::new();
            for high in 0..=255u8 {
                let half = self.dfa.next_state(marker, high);
                if self.dead(half) {
                    continue;
                }
                for low in 0..=255u8 {
                    let ret = self.dfa.next_state(half, low);
                    if self.dead(ret) {
                        continue;
                    }
                    let callee = (usize::from(high) << 8) | usize::from(low);
                    if callee >= rules {
                        return Err(GrammarError::Compile(format!(
                            "call to rule {callee}, which does not exist"
                        )));
                    }
                    calls.push((callee as u32, ret));
                    visit(self, &mut seen, &mut queue, ret, rule);
                }
            }
            self.info[index].calls = calls;
        }
        edges.resize(self.info.len(), Vec::new());
        Ok(edges)
    }

    /// Mark states that can still complete their rule, iterating with the
    /// set of productive rules (those whose start can complete) to a fixed
    /// point. Returns the productive rules.
    fn mark_good(&mut self, edges: &[Vec<u32>]) -> Vec<bool> {
        let count = self.info.len();
        let mut reverse_text: Vec<Vec<u32>> = vec![Vec::new(); count];
        let mut reverse_call: Vec<Vec<(u32, u32)>> = vec![Vec::new(); count];
        for (from, targets) in edges.iter().enumerate() {
            for &to in targets {
                reverse_text[to as usize].push(from as u32);
            }
        }
        for (from, info) in self.info.iter().enumerate() {
            for &(rule, ret) in &info.calls {
                reverse_call[self.index(ret)].push((from as u32, rule));
            }
        }
        let mut productive = vec![false; self.starts.len()];
        loop {
            let mut good = vec![false; count];
            let mut stack: Vec<usize> = (0..count).filter(|&i| self.info[i].accepting).collect();
            for &i in &stack {
                good[i] = true;
            }
            while let Some(to) = stack.pop() {
                for &from in &reverse_text[to] {
                    if !good[from as usize] {
                        good[from as usize] = true;
                        stack.push(from as usize);
                    }
                }
                for &(from, rule) in &reverse_call[to] {
                    if productive[rule as usize] && !good[from as usize] {
                        good[from as usize] = true;
                        stack.push(from as usize);
                    }
                }
            }
            let next: Vec<bool> = self.starts.iter().map(|&s| good[self.index(s)]).collect();
            if next == productive {
                for (info, good) in self.info.iter_mut().zip(good) {
                    info.good = good;
                }
                return productive;
            }
            productive = next;
        }
    }

    fn mark_eps_accept(&mut self) {
        for info in &mut self.info {
            info.eps_accept = info.accepting;
        }
        loop {
            let mut changed = false;
            for i in 0..self.info.len() {
                if self.info[i].eps_accept {
                    continue;
                }
                let reach = self.info[i].calls.iter().any(|&(rule, ret)| {
                    self.info(self.starts[rule as usize])
                        .is_some_and(|s| s.eps_accept)
                        && self.info(ret).is_some_and(|r| r.eps_accept)
                });
                if reach {
                    self.info[i].eps_accept = true;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
    }

    /// Rules each rule can call before reading text; a cycle is left
    /// recursion, which would grow the stack without reading anything.
    fn check_left_recursion(&self, rules: &Rules) -> Result<(), GrammarError> {
        let nullable = |rule: usize| self.info(self.starts[rule]).is_some_and(|i| i.eps_accept);
        let mut left: Vec<Vec<usize>> = Vec::with_capacity(self.starts.len());
        for &start in &self.starts {
            let mut seen = vec![start];
            let mut stack = vec![start];
            let mut callees = Vec::new();
            while let Some(state) = stack.pop() {
                let Some(info) = self.info(state) else {
                    continue;
                };
                for &(rule, ret) in &info.calls {
                    if !callees.contains(&(rule as usize)) {
                        callees.push(rule as usize);
                    }
                    if nullable(rule as usize) && !seen.contains(&ret) {
                        seen.push(ret);
                        stack.push(ret);
                    }
                }
            }
            left.push(callees);
        }
        // Depth-first search for a cycle: 0 new, 1 on the path, 2 done.
        let mut color = vec![0u8; left.len()];
        for root in 0..left.len() {
            if color[root] != 0 {
                continue;
            }
            let mut path = vec![(root, 0usize)];
            color[root] = 1;
            while let Some(top) = path.last_mut() {
                let rule = top.0;
                if let Some(&callee) = left[rule].get(top.1) {
                    top.1 += 1;
                    match color[callee] {
                        0 => {
                            color[callee] = 1;
                            path.push((callee, 0));
                        }
                        1 => {
                            return Err(GrammarError::Unsupported(format!(
                                "rule `{}` is left-recursive (it can reach itself before \
                                 reading any text)",
                                rules.name(callee)
                            )));
                        }
                        _ => {}
                    }
                } else {
                    color[rule] = 2;
                    path.pop();
                }
            }
        }
        Ok(())
    }
}
