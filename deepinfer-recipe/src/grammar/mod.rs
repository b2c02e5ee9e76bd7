//! Structured outputs: a grammar backend trait, token-bitmask matchers, and a
//! compile cache with a time limit.
//!
//! Two backends implement [`GrammarBackend`]:
//! - [`RegexBackend`], pure Rust, always built, the default.
//! - `XGrammarBackend` (the `xgrammar-rs` binding of the C++ xgrammar
//!   library), behind the cargo feature `xgrammar`, off by default. It needs
//!   CMake and a `clang++` (the crate README gives the steps and a `g++`
//!   shim), and its cold build takes about 15 minutes on two cores, half of
//!   CI's 30-minute budget, so CI does not build it. A differential test
//!   (`tests/xgrammar_backend.rs`, run only with the feature) compares the
//!   two backends' masks token by token over the real V4 vocabulary.
//!
//! [`RegexBackend`] has two paths.
//! Constraints without recursion become one byte-level regular expression,
//! compiled to a dense DFA (`regex-automata`); the matcher walks a trie of
//! the vocabulary's token bytes from the current DFA state to fill the mask
//! (cached per DFA state). Constraints with recursion (a recursive `$ref`, a
//! recursive EBNF rule, `json_object`, a schema with free-form JSON values
//! such as `{}`) become [`Rules`] for a pushdown
//! matcher ([`PushdownMatcher`]): each recursive rule is a DFA whose calls
//! to rules are DFA transitions over marker bytes, the matcher keeps a small
//! set of stacks of return states, and the mask comes from a per-state cache
//! of the tokens that do not depend on the stack plus a cached re-walk of the
//! few that do (after XGrammar's adaptive token mask cache). The backend
//! picks the path itself. Nesting is exact up to an explicit stack-depth cap
//! ([`RegexBackend::max_depth`], default [`DEFAULT_MAX_DEPTH`]); a token that
//! would nest deeper is refused with [`GrammarError::DepthLimit`].
//! JSON outputs allow insignificant whitespace by default;
//! [`RegexBackend::with_json_whitespace`]`(false)` makes them compact on
//! both paths (a `RegexBackend` option; the xgrammar backend's whitespace
//! is fixed).
//!
//! Supported by [`RegexBackend`]: regular expressions (Rust `regex` syntax:
//! `\d` `\w` `\s` are Unicode classes, `.` does not match `\n`);
//! `json_object` (any JSON object, nesting exact up to the depth cap); a
//! JSON-schema subset (`type` string / number / integer / boolean / null /
//! array / object and type lists, `enum`, `const`, `properties` in declared
//! order with `required`, `items`, `minItems` / `maxItems`, `minLength` /
//! `maxLength`, `anyOf` / `oneOf`, `allOf` with one entry, local `$ref`
//! including recursive ones (trees, linked lists), integer `minimum` /
//! `maximum` / `exclusiveMinimum` / `exclusiveMaximum`, string `pattern`
//! rewritten to match the JSON-encoded text, string `format` `date`,
//! `time`, `date-time`, `uuid`, `ipv4`, `email` (a simple `local@domain`
//! form) and `uri` (RFC 3986; the exact forms are documented in
//! `formats.rs`)); DSML tool-call blocks whose
//! parameters follow each tool's schema (strict tools); EBNF grammars in the
//! GBNF dialect ([`Ebnf`]), recursive rules included.
//!
//! Not supported, a clear [`GrammarError::Unsupported`]: `allOf` with more
//! than one entry, `patternProperties`, `pattern` with `minLength` /
//! `maxLength`, a supported `format` with `minLength` / `maxLength` /
//! `pattern`, more than 8 optional properties in one object, EBNF rules
//! that are left-recursive through other rules (immediate left recursion,
//! `a ::= a "x" | "y"`, is rewritten to `a ::= "y" "x"*`), recursive `$ref`
//! in strict tool parameters. Strict tools also reject every keyword the
//! grammar would not enforce ([`strict_schema`]).
//!
//! Accepted but not enforced (non-strict schemas; xgrammar enforces them):
//! bounds on `number`, other string formats (`hostname`, `ipv6`, ...), and
//! other validation keywords the list above does not name (`uniqueItems`,
//! `multipleOf`, ...): like any unknown keyword they are ignored. Objects with `properties` never get
//! undeclared ones (`additionalProperties` is read as `false`).
//! Free-form values inside schemas (`{}`, `true`, objects without
//! `properties`, arrays without `items`) send the schema to the pushdown
//! path, like recursion, and nest there without bound (up to the depth
//! cap); schemas without them (and without recursion) stay on the DFA path.
//! In strict DSML tool parameters (one regex for the whole block) and in
//! [`schema_regex`] they nest at most [`JSON_DEPTH`] deep.

mod dfa;
mod ebnf;
mod formats;
mod pattern;
mod pushdown;
mod ranges;
mod schema;
mod strict;
mod trigger;
mod vocab;
#[cfg(feature = "xgrammar")]
mod xgrammar_backend;

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use dfa::{CompiledRegex, RegexGrammar, RegexMatcher};
pub use ebnf::{Ebnf, MAX_PATTERN as EBNF_MAX_PATTERN, MAX_RECURSION as EBNF_MAX_RECURSION};
pub use pushdown::{
    CALL_BYTE, CompiledPushdown, DEFAULT_MAX_DEPTH, MAX_LIVE_PARSES, PushdownGrammar,
    PushdownMatcher, Rules,
};
pub use schema::{JSON_DEPTH, dsml_tool_calls_regex, json_value_regex, schema_regex};
pub use strict::strict_schema;
pub use trigger::Triggered;
pub use vocab::GrammarVocab;
#[cfg(feature = "xgrammar")]
pub use xgrammar_backend::{XGrammarBackend, to_xgrammar_ebnf};

use crate::conversation::ToolDefinition;
use crate::render::PromptFormat;

/// Errors of grammar compilation and matching.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The schema uses something this backend does not support.
    #[error("unsupported schema: {0}")]
    Unsupported(String),
    /// The constraint did not compile (bad regex, automaton too large).
    #[error("grammar does not compile: {0}")]
    Compile(String),
    /// Compilation exceeded the time limit.
    #[error("grammar compilation exceeded its time limit of {0:?}")]
    Timeout(Duration),
    /// No token of the vocabulary can start an output the grammar accepts.
    #[error("no token can satisfy the grammar")]
    Unsatisfiable,
    /// A token was offered that the grammar rejects.
    #[error("token {0} is not allowed here")]
    Rejected(u32),
    /// Rollback beyond the accepted tokens.
    #[error("cannot roll back {0} tokens")]
    Rollback(usize),
    /// The token would nest recursive rules deeper than the configured
    /// stack-depth cap ([`RegexBackend::max_depth`]).
    #[error("the output nests deeper than the limit of {0} levels")]
    DepthLimit(usize),
    /// The token would leave more parses of an ambiguous recursive grammar
    /// live than the matcher follows ([`MAX_LIVE_PARSES`]).
    #[error("the grammar is too ambiguous here: more than {0} parses would be live")]
    TooAmbiguous(usize),
}

/// What to constrain the output to.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object.
    JsonObject,
    /// JSON following a schema.
    JsonSchema(serde_json::Value),
    /// Text matching a regular expression.
    Regex(String),
    /// Text derived from an EBNF (GBNF-style) grammar; see [`Ebnf`].
    Ebnf(String),
    /// A DSML tool-call block (the text after the block's opening marker)
    /// calling these tools; with `strict`, parameters follow their schemas.
    ToolCalls {
        /// Prompt format (V4 and V4.1 spell the block differently).
        format: PromptFormat,
        /// Tools that may be called.
        tools: Vec<ToolDefinition>,
        /// Whether the grammar starts inside the block (tool choice required).
        inside_block: bool,
    },
}

impl GrammarSpec {
    /// The cache key: a hash of the spec's canonical text.
    pub fn key(&self) -> u64 {
        let text = match self {
            Self::JsonObject => "json_object".to_owned(),
            Self::JsonSchema(schema) => format!("schema:{schema}"),
            Self::Regex(regex) => format!("regex:{regex}"),
            Self::Ebnf(grammar) => format!("ebnf:{grammar}"),
            Self::ToolCalls {
                format,
                tools,
                inside_block,
            } => format!(
                "tools:{format:?}:{inside_block}:{}",
                serde_json::to_string(tools).unwrap_or_default()
            ),
        };
        xxhash_rust::xxh3::xxh3_64(text.as_bytes())
    }
}

/// A token-level matcher: fills the sampler's bitmask, accepts tokens, rolls
/// back rejected draft tokens.
pub trait Matcher: Send {
    /// Set bit `id % 32` of word `id / 32` for every allowed token (the mask
    /// is cleared first). Errors with [`GrammarError::Unsatisfiable`] when no
    /// token is allowed and the output is not complete.
    fn fill_bitmask(&mut self, mask: &mut [u32]) -> Result<(), GrammarError>;
    /// Advance by one token.
    fn accept(&mut self, token: u32) -> Result<(), GrammarError>;
    /// Undo the last `count` accepted tokens.
    fn rollback(&mut self, count: usize) -> Result<(), GrammarError>;
    /// Whether the output so far is complete (end of sequence is allowed).
    fn is_complete(&self) -> bool;
}

/// A compiled constraint that can start matchers.
pub trait CompiledGrammar: Send + Sync {
    /// A matcher at the start of the output.
    fn matcher(&self) -> Box<dyn Matcher>;
}

/// A grammar backend.
pub trait GrammarBackend: Send + Sync {
    /// Compile `spec` for `vocab`. May be slow; call it off the hot path
    /// (see [`GrammarCache`]).
    fn compile(
        &self,
        spec: &GrammarSpec,
        vocab: &Arc<GrammarVocab>,
    ) -> Result<Arc<dyn CompiledGrammar>, GrammarError>;
}

/// The pure-Rust backend: regex/DFA, and pushdown for recursive grammars.
#[derive(Debug, Clone)]
pub struct RegexBackend {
    /// Largest DFA, in bytes.
    pub dfa_size_limit: usize,
    /// Stack-depth cap of the pushdown matcher (nesting of recursive rules:
    /// e.g. one level per JSON object or array in `json_object`).
    pub max_depth: usize,
    /// Whether JSON outputs ([`GrammarSpec::JsonObject`],
    /// [`GrammarSpec::JsonSchema`]) may hold insignificant whitespace
    /// (`[ \t\n\r]*`) around and between their tokens (default: yes).
    /// Without it they are compact (`{"a":[1,2]}`; whitespace inside strings
    /// is text and stays allowed), as xgrammar's `any_whitespace = false`:
    /// a model, above all one with random weights, cannot then pad a
    /// document with whitespace until its token limit. A [`GrammarCache`]
    /// holds one backend, so its keys need not tell the two apart; DSML
    /// tool-call blocks, regexes and EBNF grammars are not affected.
    pub json_whitespace: bool,
}

impl Default for RegexBackend {
    fn default() -> Self {
        Self {
            dfa_size_limit: 256 << 20,
            max_depth: DEFAULT_MAX_DEPTH,
            json_whitespace: true,
        }
    }
}

impl RegexBackend {
    /// The same backend with insignificant whitespace in JSON outputs
    /// allowed (`true`, the default) or not (compact JSON); see
    /// [`RegexBackend::json_whitespace`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use deepinfer_recipe::grammar::{GrammarBackend, GrammarSpec, GrammarVocab, RegexBackend};
    ///
    /// // Tokens `{`, `}`, ` ` and end of sequence (id 3).
    /// let tokens = vec![Some(b"{".to_vec()), Some(b"}".to_vec()), Some(b" ".to_vec()), None];
    /// let vocab = Arc::new(GrammarVocab::new(tokens, &[3], &[]));
    /// let compact = RegexBackend::default().with_json_whitespace(false);
    /// let mut matcher = compact.compile(&GrammarSpec::JsonObject, &vocab)?.matcher();
    /// matcher.accept(0)?;
    /// let mut mask = [0u32; 1];
    /// matcher.fill_bitmask(&mut mask)?;
    /// assert_eq!(mask[0], 0b0010); // `}` only: no space inside `{}`
    /// # Ok::<(), deepinfer_recipe::grammar::GrammarError>(())
    /// ```
    pub fn with_json_whitespace(mut self, whitespace: bool) -> Self {
        self.json_whitespace = whitespace;
        self
    }

    fn pushdown(
        &self,
        rules: &Rules,
        vocab: &Arc<GrammarVocab>,
    ) -> Result<Arc<dyn CompiledGrammar>, GrammarError> {
        let compiled = CompiledPushdown::new(
            rules,
            Arc::clone(vocab),
            self.dfa_size_limit,
            self.max_depth,
        )?;
        Ok(Arc::new(PushdownGrammar(Arc::new(compiled))))
    }
}

impl GrammarBackend for RegexBackend {
    fn compile(
        &self,
        spec: &GrammarSpec,
        vocab: &Arc<GrammarVocab>,
    ) -> Result<Arc<dyn CompiledGrammar>, GrammarError> {
        let pattern = match spec {
            GrammarSpec::JsonObject => {
                return self.pushdown(&schema::json_object_rules(self.json_whitespace), vocab);
            }
            GrammarSpec::JsonSchema(schema) => {
                match schema::schema_grammar(schema, self.json_whitespace)? {
                    pushdown::Lowered::Regex(pattern) => pattern,
                    pushdown::Lowered::Rules(rules) => return self.pushdown(&rules, vocab),
                }
            }
            GrammarSpec::Regex(regex) => regex.clone(),
            GrammarSpec::Ebnf(grammar) => {
                let grammar = Ebnf::parse(grammar)?;
                if grammar.is_recursive() {
                    return self.pushdown(&grammar.to_rules()?, vocab);
                }
                grammar.to_regex()?
            }
            GrammarSpec::ToolCalls {
                format,
                tools,
                inside_block,
            } => dsml_tool_calls_regex(*format, tools, *inside_block)?,
        };
        let compiled = CompiledRegex::new(&pattern, Arc::clone(vocab), self.dfa_size_limit)?;
        Ok(Arc::new(RegexGrammar(Arc::new(compiled))))
    }
}

type Slot = Result<Arc<dyn CompiledGrammar>, GrammarError>;

/// Compiled grammars by spec hash, each compile bounded by a time limit.
pub struct GrammarCache {
    backend: Arc<dyn GrammarBackend>,
    vocab: Arc<GrammarVocab>,
    limit: Duration,
    entries: Mutex<HashMap<u64, Slot>>,
}

impl std::fmt::Debug for GrammarCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCache")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl GrammarCache {
    /// A cache over `backend` for `vocab`, with a per-compile time limit.
    pub fn new(
        backend: Arc<dyn GrammarBackend>,
        vocab: Arc<GrammarVocab>,
        limit: Duration,
    ) -> Self {
        Self {
            backend,
            vocab,
            limit,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The compiled grammar for `spec`, compiling it on first use. A compile
    /// that exceeds the limit returns [`GrammarError::Timeout`] (and is not
    /// cached, so a later call may retry); its thread finishes in the
    /// background.
    pub fn get(&self, spec: &GrammarSpec) -> Result<Arc<dyn CompiledGrammar>, GrammarError> {
        let key = spec.key();
        if let Some(slot) = self.entries.lock().map_err(poisoned)?.get(&key) {
            return slot.clone();
        }
        let (sender, receiver) = mpsc::channel();
        let backend = Arc::clone(&self.backend);
        let vocab = Arc::clone(&self.vocab);
        let owned = spec.clone();
        std::thread::spawn(move || {
            let _ = sender.send(backend.compile(&owned, &vocab));
        });
        let result = match receiver.recv_timeout(self.limit) {
            Ok(result) => result,
            Err(_) => return Err(GrammarError::Timeout(self.limit)),
        };
        self.entries
            .lock()
            .map_err(poisoned)?
            .insert(key, result.clone());
        result
    }

    /// Number of cached entries (successes and compile errors).
    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn poisoned<T>(_: std::sync::PoisonError<T>) -> GrammarError {
    GrammarError::Compile("grammar cache lock poisoned".into())
}
