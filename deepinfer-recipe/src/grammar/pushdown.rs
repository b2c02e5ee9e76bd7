//! Pushdown matching for grammars with true recursion.
//!
//! A grammar is a list of [`Rules`]; rule 0 is the start. Each rule body is a
//! byte-level regular expression in which a call to a rule is written as the
//! marker bytes `0xFE hi lo` ([`Rules::call`]); `0xFE` never occurs in UTF-8
//! text. All bodies compile to one dense DFA with an anchored start per rule,
//! so the DFA transition over a call marker gives the call site's return
//! state. A matcher state is a small set of stacks (one per live parse: "call
//! or read on", "return or read on"), each a chain of return states topped by
//! the current DFA state. Only rules that take part in recursion need to be
//! rules; everything else is inlined into their bodies by the front ends
//! (EBNF, JSON schema), so the automaton stays a DFA between calls.
//!
//! Mask fill follows XGrammar's adaptive token mask cache. For each DFA state
//! the vocabulary is walked once with the stack below unknown: tokens read
//! inside the current rule (calls included) are accepted or rejected whatever
//! the stack and are cached as a bitmask; the rest ("uncertain": accepted
//! only on a path that returns into a caller, which the walk can only guess)
//! are re-walked against the real stack. Those re-walks are cached too, keyed
//! by the state and the return states they actually looked at, so a matcher
//! deep in a document rarely walks tokens at all.
//!
//! Nesting is bounded only by an explicit cap ([`DEFAULT_MAX_DEPTH`],
//! configurable): a token that would leave every parse deeper than the cap is
//! refused with [`GrammarError::DepthLimit`]. The mask itself is the exact
//! grammar mask, so reaching the cap is an error, never silent steering.
//! Left-recursive rules (a rule that can call itself before reading any text)
//! are rejected with [`GrammarError::Unsupported`]. Ambiguity is bounded the
//! same way: a token after which more than [`MAX_LIVE_PARSES`] parses would
//! be live is refused with [`GrammarError::TooAmbiguous`].

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};

use regex_automata::dfa::{Automaton, StartKind, dense};
use regex_automata::util::primitives::{PatternID, StateID};
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind, util::syntax};

use super::vocab::GrammarVocab;
use super::{CompiledGrammar, GrammarError, Matcher};

/// The byte that starts a rule-call marker in rule bodies.
pub const CALL_BYTE: u8 = 0xFE;

/// Most rules in one grammar (a call marker holds a 16-bit rule index).
pub const MAX_RULES: usize = 1 << 16;

/// Default stack-depth cap (nesting of recursive rules) of the backend.
pub const DEFAULT_MAX_DEPTH: usize = 256;

/// State flag: can still complete its rule.
const GOOD: u8 = 1;
/// State flag: no call and no return possible (its closure is itself).
const PLAIN: u8 = 2;

/// Most cached stack-dependent resolutions per DFA state.
const RESOLVED_PER_STATE: usize = 64;

/// Most live parses after a token. A matcher keeps one stack per parse, and
/// in an ambiguous grammar (`r ::= root root | ""` under `root ::= "b" r r`)
/// their number grows geometrically with the output; past this many, the
/// token is refused with [`GrammarError::TooAmbiguous`] instead of letting
/// each step cost more than the last.
pub const MAX_LIVE_PARSES: usize = 4096;

/// Configuration lists up to this long are deduplicated by a scan; longer
/// ones through a hash set (the scan is quadratic in the list).
const SCAN_DEDUP: usize = 32;

/// A context-free grammar as rules whose bodies are byte regexes with call
/// markers. Rule 0 is the start rule.
///
/// ```
/// use std::sync::Arc;
/// use deepinfer_recipe::grammar::{
///     CompiledPushdown, GrammarVocab, Matcher, PushdownMatcher, Rules,
/// };
///
/// // Balanced parentheses around an `x`: rule `nest` calls itself.
/// let mut rules = Rules::new();
/// let start = rules.declare("start");
/// let nest = rules.declare("nest");
/// rules.define(start, Rules::call(nest));
/// rules.define(nest, format!(r"\({}\)|x", Rules::call(nest)));
/// // Tokens `(` `)` `x`, and end of sequence (id 3).
/// let tokens = vec![Some(b"(".to_vec()), Some(b")".to_vec()), Some(b"x".to_vec()), None];
/// let vocab = Arc::new(GrammarVocab::new(tokens, &[3], &[]));
/// let compiled = Arc::new(CompiledPushdown::new(&rules, vocab, 1 << 20, 64)?);
/// let mut matcher = PushdownMatcher::new(compiled);
/// for token in [0, 0, 2, 1] {
///     matcher.accept(token)?;
/// }
/// let mut mask = [0u32; 1];
/// matcher.fill_bitmask(&mut mask)?;
/// assert_eq!(mask[0], 0b0010); // only `)`: one more level to close
/// matcher.accept(1)?;
/// assert!(matcher.is_complete());
/// # Ok::<(), deepinfer_recipe::grammar::GrammarError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    names: Vec<String>,
    bodies: Vec<String>,
}

impl Rules {
    /// No rules yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reserve a rule (its body is empty until [`Rules::define`]); returns
    /// its index, the first one being the start rule.
    pub fn declare(&mut self, name: impl Into<String>) -> usize {
        self.names.push(name.into());
        self.bodies.push(String::new());
        self.names.len() - 1
    }

    /// Set the body (a regex; calls written with [`Rules::call`]) of `rule`.
    pub fn define(&mut self, rule: usize, body: String) {
        if let Some(slot) = self.bodies.get_mut(rule) {
            *slot = body;
        }
    }

    /// The regex fragment that calls `rule`.
    pub fn call(rule: usize) -> String {
        format!(
            "(?-u:\\x{CALL_BYTE:02X}\\x{:02X}\\x{:02X})",
            (rule >> 8) & 0xFF,
            rule & 0xFF
        )
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.bodies.len()
    }

    /// Whether there are no rules.
    pub fn is_empty(&self) -> bool {
        self.bodies.is_empty()
    }

    /// Name of `rule` (for error messages).
    pub fn name(&self, rule: usize) -> &str {
        self.names.get(rule).map_or("?", String::as_str)
    }
}

/// A multiplicative hasher for the small integer keys (state ids, frame
/// nodes) of the matcher's hot maps; SipHash costs more than the lookups.
#[derive(Debug, Default, Clone, Copy)]
struct IdHasher(u64);

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

type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Stack bottom: nothing below this frame.
const BOTTOM: u32 = u32::MAX;
/// Unknown context (mask classification): any caller may be below.
const UNKNOWN: u32 = u32::MAX - 1;

/// One parse: the current DFA state and the chain of return states below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Config {
    state: StateID,
    below: u32,
    /// Reached by guessing a caller (classification only).
    approx: bool,
}

/// Membership of a configuration list being built: a scan while it is
/// short, a hash set once it is long (see [`SCAN_DEDUP`]).
#[derive(Debug, Default)]
struct Dedup {
    set: std::collections::HashSet<Config, BuildHasherDefault<IdHasher>>,
    /// Entries of the list already in `set`.
    synced: usize,
}

impl Dedup {
    /// Start on a new list (free when the last list stayed short).
    #[inline]
    fn reset(&mut self) {
        if self.synced > 0 {
            self.set.clear();
            self.synced = 0;
        }
    }

    /// Push `config` onto `list` unless it is there.
    #[inline]
    fn add(&mut self, list: &mut Vec<Config>, config: Config) {
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
struct Arena {
    nodes: Vec<(StateID, u32, u32)>,
    intern: IdMap<(StateID, u32), u32>,
}

impl Arena {
    fn depth(&self, below: u32) -> u32 {
        if below >= UNKNOWN {
            0
        } else {
            self.nodes[below as usize].2
        }
    }

    fn push(&mut self, state: StateID, below: u32) -> u32 {
        if let Some(&node) = self.intern.get(&(state, below)) {
            return node;
        }
        let node = self.nodes.len() as u32;
        let depth = self.depth(below) + 1;
        self.nodes.push((state, below, depth));
        self.intern.insert((state, below), node);
        node
    }

    fn truncate(&mut self, len: usize) {
        for (state, below, _) in self.nodes.drain(len..) {
            self.intern.remove(&(state, below));
        }
    }
}

#[derive(Debug, Clone, Default)]
struct StateInfo {
    rule: u32,
    accepting: bool,
    /// Can still reach an accepting state of its rule (text and productive calls).
    good: bool,
    /// Can reach an accepting state without reading text.
    eps_accept: bool,
    /// Calls possible here: (rule, return state).
    calls: Vec<(u32, StateID)>,
}

/// Mask classification of one DFA state, stack below unknown.
#[derive(Debug)]
struct Classified {
    /// Tokens accepted whatever the stack.
    accepted: Vec<u32>,
    /// Positions in `vocab.sorted` of tokens that depend on the stack.
    uncertain: Vec<u32>,
    /// Whether `accepted` has any token.
    any: bool,
}

/// Uncertain tokens resolved against a stack whose top frames are `frames`.
#[derive(Debug)]
struct Resolved {
    frames: Vec<StateID>,
    /// The walk saw the stack end right below `frames`.
    bottom: bool,
    accepted: Vec<u32>,
}

/// What the context-dependent walk looked at below its start.
#[derive(Debug, Default)]
struct Track {
    /// Frame nodes of the start stack by depth (index 0 unused).
    chain: Vec<u32>,
    /// Shallowest start frame popped into (`u32::MAX`: none).
    min_popped: u32,
    bottom: bool,
    /// Scratch of `closure` and `step`.
    dedup: Dedup,
}

/// Reusable trie-walk buffers.
#[derive(Debug, Default)]
struct Walk {
    levels: Vec<Vec<Config>>,
    closed: Vec<Vec<Config>>,
    closed_ok: Vec<bool>,
}

enum Outcome {
    Accepted,
    Uncertain,
    Rejected,
}

/// A compiled recursive grammar with its mask caches.
pub struct CompiledPushdown {
    dfa: dense::DFA<Vec<u32>>,
    vocab: Arc<GrammarVocab>,
    stride2: usize,
    starts: Vec<StateID>,
    info: Vec<StateInfo>,
    /// Per state index: [`GOOD`] and [`PLAIN`] bits (hot-loop copy of `info`).
    flags: Vec<u8>,
    /// Return states of each rule's call sites.
    returns: Vec<Vec<StateID>>,
    max_depth: usize,
    classes: Mutex<IdMap<StateID, Arc<Classified>>>,
    resolved: Mutex<IdMap<StateID, Vec<Arc<Resolved>>>>,
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

    fn info(&self, state: StateID) -> Option<&StateInfo> {
        self.info.get(self.index(state))
    }

    fn flags(&self, state: StateID) -> u8 {
        self.flags.get(self.index(state)).copied().unwrap_or(0)
    }

    fn good(&self, state: StateID) -> bool {
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

    /// Add the configurations reachable without reading text (calls and
    /// returns) to `set`, into `out`.
    fn closure(&self, arena: &mut Arena, track: &mut Track, set: &[Config], out: &mut Vec<Config>) {
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
    fn step(&self, closed: &[Config], byte: u8, out: &mut Vec<Config>, dedup: &mut Dedup) {
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
    fn walk<'t>(
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

    fn sorted_token(&self, position: usize) -> (u32, &[u8]) {
        let (id, start, len, _) = self.vocab.sorted[position];
        (
            id,
            &self.vocab.bytes[start as usize..(start + len) as usize],
        )
    }

    /// The stack-independent classification of `state` (cached).
    fn classified(&self, state: StateID) -> Arc<Classified> {
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
    fn resolve(
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

/// Whether the stack under `below` starts with return states `frames` (and
/// ends right after them when `bottom`).
fn frames_match(arena: &Arena, below: u32, frames: &[StateID], bottom: bool) -> bool {
    let mut node = below;
    for &frame in frames {
        if node >= UNKNOWN || arena.nodes[node as usize].0 != frame {
            return false;
        }
        node = arena.nodes[node as usize].1;
    }
    !bottom || node == BOTTOM
}

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
    compiled: Arc<CompiledPushdown>,
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

/// A constraint lowered for the backend: one regex (the DFA path) or rules
/// (the pushdown path, only when something recurses).
#[derive(Debug, Clone)]
pub(crate) enum Lowered {
    Regex(String),
    Rules(Rules),
}
