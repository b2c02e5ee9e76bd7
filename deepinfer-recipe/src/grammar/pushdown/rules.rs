//! [`Rules`]: a grammar as rule bodies with call markers.

use super::CALL_BYTE;

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
    pub(super) bodies: Vec<String>,
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
