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

mod compile;
mod mask;
mod matcher;
mod rules;
mod stack;
mod walk;

pub use compile::CompiledPushdown;
pub use matcher::{PushdownGrammar, PushdownMatcher};
pub use rules::Rules;

#[cfg(doc)]
use super::GrammarError;

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

/// A constraint lowered for the backend: one regex (the DFA path) or rules
/// (the pushdown path, only when something recurses).
#[derive(Debug, Clone)]
pub(crate) enum Lowered {
    Regex(String),
    Rules(Rules),
}
