//! The `xgrammar-rs` engine (the C++ xgrammar library: an Earley parser with
//! an adaptive token-mask cache) behind [`GrammarBackend`]. Optional: cargo
//! feature `xgrammar`, which builds the C++ library with CMake (see the
//! crate README for the toolchain it needs).
//!
//! What maps to what:
//! - the vocabulary: a byte-level tokenizer description built from the
//!   [`GrammarVocab`] token bytes (so xgrammar sees exactly the bytes the
//!   regex backend sees); tokens without bytes, reserved tokens and symbol
//!   tokens are special (never allowed as text), end-of-sequence ids are
//!   xgrammar's stop tokens. Two ids with the same bytes cannot both be
//!   described that way: the later ids are left special (counted by
//!   [`XGrammarBackend::duplicate_tokens`]).
//! - `json_object`: xgrammar's JSON-schema converter on `{"type":"object"}`
//!   (any object, nesting unbounded); `JsonSchema`: the converter with free
//!   whitespace `[ \n\r\t]*` between tokens (the regex backend's convention),
//!   properties in declared order, no properties beyond the declared ones.
//! - `Regex`: xgrammar's own regex syntax (ECMAScript-like), passed as is.
//! - `Ebnf`: checked with this crate's GBNF parser first (same syntax errors
//!   as the regex backend), then rewritten into xgrammar's EBNF (see
//!   [`to_xgrammar_ebnf`]); recursion is unbounded here.
//! - `ToolCalls`: a Lark grammar with the DSML marker as a token-id element
//!   `<[id]>` and strict parameters as inline `%json` schemas.
//!
//! No `unsafe` here: everything goes through the binding's safe API.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use dlpark::SafeManagedTensorVersioned;
use dlpark::traits::TensorView;
use serde_json::Value;
use xgrammar::{GrammarCompiler, GrammarMatcher, TokenizerInfo};

use super::vocab::{GrammarVocab, SPECIAL_BYTE};
use super::{CompiledGrammar, Ebnf, GrammarBackend, GrammarError, GrammarSpec, Matcher};
use crate::conversation::ToolDefinition;
use crate::render::PromptFormat;

/// The xgrammar engine as a [`GrammarBackend`].
pub struct XGrammarBackend {
    threads: usize,
    /// The compiler for the last vocabulary seen (building one costs a pass
    /// over the vocabulary, so it is kept while the vocabulary is the same).
    compiler: Mutex<Option<Arc<VocabCompiler>>>,
}

impl std::fmt::Debug for XGrammarBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XGrammarBackend")
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

impl Default for XGrammarBackend {
    fn default() -> Self {
        Self::new(1)
    }
}

struct VocabCompiler {
    /// Held so that the pointer identity check below stays valid.
    vocab: Arc<GrammarVocab>,
    info: TokenizerInfo,
    compiler: GrammarCompiler,
    /// Symbol tokens: (symbol number, token id).
    symbols: Vec<(u8, u32)>,
    duplicates: usize,
}

impl XGrammarBackend {
    /// A backend whose compiles use up to `threads` threads.
    pub fn new(threads: usize) -> Self {
        Self {
            threads: threads.max(1),
            compiler: Mutex::new(None),
        }
    }

    /// Ids of `vocab` that xgrammar treats as special (never allowed as text)
    /// only because another id has the same bytes.
    pub fn duplicate_tokens(&self, vocab: &Arc<GrammarVocab>) -> Result<usize, GrammarError> {
        Ok(self.compiler_for(vocab)?.duplicates)
    }

    fn compiler_for(&self, vocab: &Arc<GrammarVocab>) -> Result<Arc<VocabCompiler>, GrammarError> {
        let mut slot = self
            .compiler
            .lock()
            .map_err(|_| GrammarError::Compile("xgrammar compiler lock poisoned".into()))?;
        if let Some(current) = slot.as_ref()
            && Arc::ptr_eq(&current.vocab, vocab)
        {
            return Ok(Arc::clone(current));
        }
        let (json, symbols, duplicates) = tokenizer_json(vocab);
        let stop: Vec<i32> = vocab.eos.iter().map(|&id| id as i32).collect();
        let size = vocab.size();
        let threads = self.threads;
        let built = guarded(|| {
            let info = TokenizerInfo::from_backend_str(&json, Some(size), stop)
                .map_err(|error| GrammarError::Compile(format!("xgrammar vocabulary: {error}")))?;
            let compiler = GrammarCompiler::with(&info, Some(threads), Some(false), None);
            Ok((info, compiler))
        })?;
        let compiler = Arc::new(VocabCompiler {
            vocab: Arc::clone(vocab),
            info: built.0,
            compiler: built.1,
            symbols,
            duplicates,
        });
        *slot = Some(Arc::clone(&compiler));
        Ok(compiler)
    }
}

/// Runs `f`, turning a panic in the binding into a typed error.
fn guarded<T>(f: impl FnOnce() -> Result<T, GrammarError>) -> Result<T, GrammarError> {
    catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(GrammarError::Compile("xgrammar binding panicked".into())))
}

fn compile_error(error: xgrammar::XGrammarErr) -> GrammarError {
    GrammarError::Compile(format!("xgrammar: {error}"))
}

impl GrammarBackend for XGrammarBackend {
    fn compile(
        &self,
        spec: &GrammarSpec,
        vocab: &Arc<GrammarVocab>,
    ) -> Result<Arc<dyn CompiledGrammar>, GrammarError> {
        let compiler = self.compiler_for(vocab)?;
        // Work done in Rust (and its own errors) before entering the binding.
        let ebnf = match spec {
            GrammarSpec::Ebnf(text) => Some(to_xgrammar_ebnf(text)?),
            _ => None,
        };
        let lark = match spec {
            GrammarSpec::ToolCalls {
                format,
                tools,
                inside_block,
            } => {
                let dsml = compiler
                    .symbols
                    .iter()
                    .find(|&&(symbol, _)| symbol == 0)
                    .map(|&(_, id)| id)
                    .ok_or_else(|| {
                        GrammarError::Compile(
                            "tool calls need the DSML token as symbol 0 of the vocabulary".into(),
                        )
                    })?;
                Some(tool_calls_lark(*format, tools, *inside_block, dsml)?)
            }
            _ => None,
        };
        let xg = &compiler.compiler;
        let compiled = guarded(|| {
            let result = match spec {
                GrammarSpec::JsonObject => json_document(r#"{"type":"object"}"#, false)
                    .and_then(|grammar| xg.compile_grammar(&grammar)),
                GrammarSpec::JsonSchema(schema) => json_document(&schema.to_string(), true)
                    .and_then(|grammar| xg.compile_grammar(&grammar)),
                GrammarSpec::Regex(regex) => xg.compile_regex(regex),
                GrammarSpec::Ebnf(_) => {
                    let (text, root) = ebnf
                        .as_ref()
                        .ok_or_else(|| GrammarError::Compile("EBNF translation missing".into()))?;
                    xgrammar::Grammar::from_ebnf(text, Some(root))
                        .and_then(|grammar| xg.compile_grammar(&grammar))
                }
                GrammarSpec::ToolCalls { .. } => {
                    let text = lark
                        .as_ref()
                        .ok_or_else(|| GrammarError::Compile("tool-call grammar missing".into()))?;
                    xgrammar::Grammar::from_lark(text, Some(&compiler.info), None)
                        .and_then(|grammar| xg.compile_grammar(&grammar))
                }
            };
            result.map_err(compile_error)
        })?;
        let grammar = Arc::new(XGrammar {
            compiled,
            words: vocab.mask_words(),
            size: vocab.size(),
        });
        // Like the regex backend: a grammar that no token can start is an
        // error at compile time.
        let mut probe = grammar.start();
        let mut mask = vec![0u32; grammar.words];
        match probe.fill_bitmask(&mut mask) {
            Err(GrammarError::Unsatisfiable) if !probe.is_complete() => {
                Err(GrammarError::Unsatisfiable)
            }
            Err(error @ GrammarError::Compile(_)) => Err(error),
            _ => Ok(grammar as Arc<dyn CompiledGrammar>),
        }
    }
}

/// A JSON document following `schema`, with free whitespace around it as
/// in the regex backend (xgrammar's converter allows it only between
/// tokens). `strict`: no properties beyond the declared ones.
fn json_document(schema: &str, strict: bool) -> xgrammar::Result<xgrammar::Grammar> {
    let value = xgrammar::Grammar::from_json_schema(
        schema,
        Some(true),
        None,
        None,
        Some(strict),
        None,
        None,
        Some(false),
    )?;
    let space = || xgrammar::Grammar::from_ebnf(r"root ::= [ \n\r\t]*", None);
    Ok(xgrammar::Grammar::concat(&[space()?, value, space()?]))
}

/// A grammar compiled by xgrammar for one vocabulary.
struct XGrammar {
    compiled: xgrammar::CompiledGrammar,
    words: usize,
    size: usize,
}

impl XGrammar {
    fn start(&self) -> XGrammarMatcher {
        XGrammarMatcher {
            // Stop tokens from the vocabulary; the matcher stays open after
            // the grammar completes until a stop token is accepted.
            matcher: GrammarMatcher::with(&self.compiled, None, Some(false), None),
            words: self.words,
            size: self.size,
            accepted: 0,
        }
    }
}

impl CompiledGrammar for XGrammar {
    fn matcher(&self) -> Box<dyn Matcher> {
        Box::new(self.start())
    }
}

/// Matches tokens with an xgrammar `GrammarMatcher`.
struct XGrammarMatcher {
    matcher: GrammarMatcher,
    words: usize,
    size: usize,
    accepted: usize,
}

impl Matcher for XGrammarMatcher {
    fn fill_bitmask(&mut self, mask: &mut [u32]) -> Result<(), GrammarError> {
        mask.fill(0);
        if self.matcher.is_terminated() {
            return Ok(());
        }
        let matcher = &mut self.matcher;
        let words = self.words;
        let size = self.size;
        let mut any = false;
        guarded(|| {
            // xgrammar writes an int32 tensor with the same bit layout as
            // ours (bit id % 32 of word id / 32).
            let mut tensor = SafeManagedTensorVersioned::new(vec![0i32; words])
                .map_err(|error| GrammarError::Compile(format!("bitmask tensor: {error}")))?;
            matcher
                .fill_next_token_bitmask(&mut tensor, None, None)
                .map_err(compile_error)?;
            let filled = tensor
                .as_slice_contiguous::<i32>()
                .map_err(|error| GrammarError::Compile(format!("bitmask tensor: {error}")))?;
            for (out, &word) in mask.iter_mut().zip(filled) {
                *out = word as u32;
            }
            // xgrammar sets the padding bits past the vocabulary.
            let tail = size % 32;
            if tail != 0
                && let Some(last) = mask.get_mut(size / 32)
            {
                *last &= (1u32 << tail) - 1;
            }
            any = mask.iter().any(|&w| w != 0);
            Ok(())
        })?;
        if any {
            Ok(())
        } else {
            Err(GrammarError::Unsatisfiable)
        }
    }

    fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        // Out-of-range ids are checked here: the C++ side would raise an
        // exception the binding does not catch on this path.
        if token as usize >= self.size || self.matcher.is_terminated() {
            return Err(GrammarError::Rejected(token));
        }
        if self.matcher.accept_token(token as i32, None) {
            self.accepted += 1;
            Ok(())
        } else {
            Err(GrammarError::Rejected(token))
        }
    }

    fn rollback(&mut self, count: usize) -> Result<(), GrammarError> {
        if count > self.accepted {
            return Err(GrammarError::Rollback(count));
        }
        if count == 0 {
            return Ok(());
        }
        let steps = i32::try_from(count).map_err(|_| GrammarError::Rollback(count))?;
        self.matcher
            .rollback(Some(steps))
            .map_err(|_| GrammarError::Rollback(count))?;
        self.accepted -= count;
        Ok(())
    }

    fn is_complete(&self) -> bool {
        self.matcher.is_terminated() || self.matcher.is_completed()
    }
}

/// GPT-2's byte-to-character map (printable Latin-1 bytes map to
/// themselves, the rest to U+0100 on), which xgrammar's byte-level decoder
/// inverts.
fn byte_level_chars() -> [char; 256] {
    let mut chars = ['\0'; 256];
    let mut next = 256u32;
    for (byte, slot) in chars.iter_mut().enumerate() {
        let printable = (33..=126).contains(&byte)
            || (161..=172).contains(&byte)
            || (174..=255).contains(&byte);
        let code = if printable {
            byte as u32
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    chars
}

/// A Hugging Face `tokenizer.json` (word-level model, byte-level decoder)
/// whose vocabulary spells each plain token's bytes; plus the symbol tokens
/// and the number of ids left out as duplicates.
fn tokenizer_json(vocab: &GrammarVocab) -> (String, Vec<(u8, u32)>, usize) {
    let chars = byte_level_chars();
    let mut map = serde_json::Map::new();
    let mut symbols = Vec::new();
    let mut duplicates = 0;
    for (id, token) in vocab.token_bytes.iter().enumerate() {
        let Some(bytes) = token else { continue };
        if bytes.contains(&SPECIAL_BYTE) {
            // Symbols are reserved tokens that grammars name by id. They
            // keep their bytes `[0xFF, n]`: xgrammar never allows a token
            // with no bytes, and 0xFF is never part of UTF-8 text, so no
            // text element of a grammar can match them.
            if let [SPECIAL_BYTE, symbol] = bytes.as_slice() {
                symbols.push((*symbol, id as u32));
            }
        }
        let spelled: String = bytes.iter().map(|&b| chars[b as usize]).collect();
        if map.contains_key(&spelled) {
            duplicates += 1;
        } else {
            map.insert(spelled, Value::from(id as u64));
        }
    }
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "WordLevel", "vocab": Value::Object(map), "unk_token": "\u{0}unk"},
    });
    (json.to_string(), symbols, duplicates)
}

/// Rewrites a grammar in this crate's GBNF dialect (see [`Ebnf`]) into
/// xgrammar's EBNF, returning the text and its start rule. The grammar is
/// parsed by [`Ebnf::parse`] first, so syntax errors are the regex
/// backend's. Differences handled: `.` becomes `[^]` (any character,
/// newline included, as in the regex backend); every literal and class
/// character is re-escaped (`\xHH` is two hex digits here but any number in
/// xgrammar; raw newlines are not allowed there); rule names get a prefix
/// (names may start with a digit here); each definition starts a line; the
/// start rule is `root` or else the first rule.
pub fn to_xgrammar_ebnf(text: &str) -> Result<(String, String), GrammarError> {
    Ebnf::parse(text)?;
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len() * 2);
    let mut first = None;
    let mut has_root = false;
    let mut at = 0;
    let bad = |at: usize| GrammarError::Compile(format!("EBNF translation failed at char {at}"));
    while at < chars.len() {
        let c = chars[at];
        match c {
            '#' => {
                while at < chars.len() && chars[at] != '\n' {
                    at += 1;
                }
            }
            '"' => {
                at += 1;
                out.push('"');
                loop {
                    let c = *chars.get(at).ok_or_else(|| bad(at))?;
                    at += 1;
                    match c {
                        '"' => break,
                        '\\' => {
                            let (decoded, used) = unescape(&chars[at..]).ok_or_else(|| bad(at))?;
                            at += used;
                            push_escaped(&mut out, decoded);
                        }
                        c => push_escaped(&mut out, c),
                    }
                }
                out.push('"');
            }
            '[' => {
                at += 1;
                out.push('[');
                if chars.get(at) == Some(&'^') {
                    at += 1;
                    out.push('^');
                }
                loop {
                    let c = *chars.get(at).ok_or_else(|| bad(at))?;
                    at += 1;
                    let low = match c {
                        ']' => break,
                        '\\' => {
                            let (decoded, used) = unescape(&chars[at..]).ok_or_else(|| bad(at))?;
                            at += used;
                            decoded
                        }
                        c => c,
                    };
                    push_escaped(&mut out, low);
                    if chars.get(at) == Some(&'-') && chars.get(at + 1) != Some(&']') {
                        at += 1;
                        out.push('-');
                        let c = *chars.get(at).ok_or_else(|| bad(at))?;
                        at += 1;
                        let high = if c == '\\' {
                            let (decoded, used) = unescape(&chars[at..]).ok_or_else(|| bad(at))?;
                            at += used;
                            decoded
                        } else {
                            c
                        };
                        push_escaped(&mut out, high);
                    }
                }
                out.push(']');
            }
            '.' => {
                at += 1;
                out.push_str(" [^] ");
            }
            '{' => {
                while at < chars.len() && chars[at] != '}' {
                    if chars[at] != ' ' {
                        out.push(chars[at]);
                    }
                    at += 1;
                }
                out.push('}');
                at += 1;
            }
            c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => {
                let start = at;
                while at < chars.len()
                    && (chars[at].is_ascii_alphanumeric() || chars[at] == '_' || chars[at] == '-')
                {
                    at += 1;
                }
                let name: String = chars[start..at].iter().collect();
                let mut after = at;
                while after < chars.len() && chars[after].is_whitespace() {
                    after += 1;
                }
                let defines = chars.get(after..after + 3) == Some(&[':', ':', '='][..]);
                if defines {
                    out.push('\n');
                    has_root |= name == "root";
                    first.get_or_insert_with(|| name.clone());
                }
                out.push_str(" r_");
                out.push_str(&name);
                out.push(' ');
            }
            c => {
                at += 1;
                out.push(c);
            }
        }
    }
    let root = if has_root {
        "root".to_owned()
    } else {
        first.ok_or_else(|| GrammarError::Compile("the grammar has no rules".into()))?
    };
    Ok((out, format!("r_{root}")))
}

/// Decodes a GBNF escape (after its backslash): the character and the
/// number of chars used.
fn unescape(rest: &[char]) -> Option<(char, usize)> {
    let hex = |digits: usize| {
        let text: String = rest.get(1..1 + digits)?.iter().collect();
        let value = u32::from_str_radix(&text, 16).ok()?;
        Some((char::from_u32(value)?, 1 + digits))
    };
    match rest.first()? {
        'n' => Some(('\n', 1)),
        'r' => Some(('\r', 1)),
        't' => Some(('\t', 1)),
        'x' => hex(2),
        'u' => hex(4),
        'U' => hex(8),
        &c @ ('\\' | '"' | '[' | ']' | '-' | '^') => Some((c, 1)),
        _ => None,
    }
}

/// One literal or class character in xgrammar's syntax: letters and digits
/// as they are, everything else as `\UXXXXXXXX`.
fn push_escaped(out: &mut String, c: char) {
    if c.is_ascii_alphanumeric() || c == ' ' {
        out.push(c);
    } else {
        out.push_str(&format!("\\U{:08X}", c as u32));
    }
}

/// A Lark string literal (JSON escapes, which Lark accepts).
fn lark_literal(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

/// The DSML tool-call block (after its opening marker, or inside it) as a
/// Lark grammar: the same language as the regex backend's
/// [`super::dsml_tool_calls_regex`], with the marker as token `dsml`.
fn tool_calls_lark(
    format: PromptFormat,
    tools: &[ToolDefinition],
    inside_block: bool,
    dsml: u32,
) -> Result<String, GrammarError> {
    if tools.is_empty() {
        return Err(GrammarError::Unsatisfiable);
    }
    let (block, invoke, parameter, joiner) = match format {
        PromptFormat::V41 => (" calls", " invoke", " parameter", "\n"),
        PromptFormat::V4 => ("tool_calls", "invoke", "parameter", ""),
    };
    let d = format!("<[{dsml}]>");
    let lit = lark_literal;
    let mut rules = vec![
        // Free text: anything but `</` right before the marker token (a
        // token, so plain text never contains it).
        r#"TEXT: /([^<]|<[^\/]|<\/[^<]|<\/<)*/"#.to_owned(),
        r#"KEY: /[^"<]+/"#.to_owned(),
    ];
    let parameter_rule = |key: &str, flag: &str, value: &str| -> String {
        format!(
            "\"<\" {d} {} {key} {} {flag} {} {value} \"</\" {d} {}",
            lit(&format!("{parameter} name=\"")),
            lit("\" string=\""),
            lit("\">"),
            lit(&format!("{parameter}>")),
        )
    };
    let mut calls = Vec::new();
    for (index, tool) in tools.iter().enumerate() {
        let name = Value::String(tool.name.clone()).to_string();
        let name = &name[1..name.len() - 1];
        let normalized = super::strict::strict_tool_parameters(tool)?;
        let strict = normalized.is_some();
        let properties = normalized
            .as_ref()
            .unwrap_or(&tool.parameters)
            .get("properties")
            .and_then(Value::as_object);
        let params = match (strict, properties) {
            (true, Some(properties)) => {
                let mut sequence = Vec::new();
                for (key, schema) in properties {
                    let key = Value::String(key.clone()).to_string();
                    let key = lit(&key[1..key.len() - 1]);
                    let is_string = schema.get("type").and_then(Value::as_str) == Some("string");
                    let (flag, value) = if is_string {
                        ("\"true\"", "TEXT".to_owned())
                    } else {
                        ("\"false\"", format!("%json {schema}"))
                    };
                    sequence.push(parameter_rule(&key, flag, &value));
                }
                match format {
                    PromptFormat::V4 => sequence
                        .iter()
                        .map(|p| format!("{p} \"\\n\""))
                        .collect::<Vec<_>>()
                        .join(" "),
                    PromptFormat::V41 => sequence.join(" \"\\n\" "),
                }
            }
            (true, None) => String::new(),
            (false, _) => {
                let param = parameter_rule("KEY", "(\"true\" | \"false\")", "TEXT");
                match format {
                    PromptFormat::V4 => format!("({param} \"\\n\")*"),
                    PromptFormat::V41 => {
                        let separator = lit(if joiner.is_empty() { "\n" } else { joiner });
                        format!("({param} ({separator} {param})*)?")
                    }
                }
            }
        };
        let body = match format {
            PromptFormat::V4 => format!(
                "\"<\" {d} {} {params} \"</\" {d} {}",
                lit(&format!("{invoke} name=\"{name}\">\n")),
                lit(&format!("{invoke}>\n")),
            ),
            PromptFormat::V41 => format!(
                "\"<\" {d} {} {params} \"\\n</\" {d} {}",
                lit(&format!("{invoke} name=\"{name}\">\n")),
                lit(&format!("{invoke}>")),
            ),
        };
        rules.push(format!("call_{index}: {body}"));
        calls.push(format!("call_{index}"));
    }
    rules.push(format!("call: {}", calls.join(" | ")));
    let close = lit(&format!("{block}>"));
    rules.push(match format {
        PromptFormat::V4 => format!("list: call+ \"</\" {d} {close}"),
        PromptFormat::V41 => format!("list: call (\"\\n\" call)* \"\\n</\" {d} {close}"),
    });
    rules.push(if inside_block {
        "start: list".to_owned()
    } else {
        format!("start: {} list", lit(&format!("{block}>\n")))
    });
    Ok(rules.join("\n"))
}
