//! JSON schemas (a subset), JSON values and DSML tool-call blocks as regular
//! expressions over output bytes; schemas with recursive `$ref`s and
//! `json_object` as [`Rules`] for the pushdown matcher.

use std::collections::HashMap;

use serde_json::Value;

use super::GrammarError;
use super::pushdown::{Lowered, Rules};
use super::vocab::SPECIAL_BYTE;
use crate::conversation::ToolDefinition;
use crate::render::PromptFormat;

/// Nesting depth of free-form JSON (`{}`, objects without `properties`) in
/// the regex forms: [`schema_regex`] and strict DSML tool parameters. The
/// backend compiles JSON schemas with free-form values, and `json_object`,
/// to the pushdown matcher, where they nest without this bound.
pub const JSON_DEPTH: usize = 3;

/// Most optional properties per object (the regex grows as 2^n).
const MAX_OPTIONAL: usize = 8;

/// Insignificant whitespace between JSON tokens (RFC 8259).
const WS: &str = r"[ \t\n\r]*";
const STRING: &str = r#""(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*""#;
pub(crate) const STRING_CHAR: &str = r#"(?:[^"\\\x00-\x1F]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))"#;
const INTEGER: &str = r"-?(?:0|[1-9][0-9]*)";
const NUMBER: &str = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?";

/// The whitespace pattern between JSON tokens: [`WS`], or nothing for
/// compact JSON (`{"a":[1,2]}`, as xgrammar's `any_whitespace = false`).
fn ws_pattern(whitespace: bool) -> &'static str {
    if whitespace { WS } else { "" }
}

/// Any JSON value nested at most `depth` deep.
pub fn json_value_regex(depth: usize) -> String {
    value_regex(depth, WS)
}

/// Any JSON value nested at most `depth` deep, `ws` between tokens.
fn value_regex(depth: usize, ws: &str) -> String {
    let scalar = format!("{STRING}|{NUMBER}|true|false|null");
    if depth == 0 {
        return format!("(?:{scalar})");
    }
    let inner = value_regex(depth - 1, ws);
    let object = format!(
        r"\{{{ws}(?:{STRING}{ws}:{ws}{inner}(?:{ws},{ws}{STRING}{ws}:{ws}{inner})*)?{ws}\}}"
    );
    let array = format!(r"\[{ws}(?:{inner}(?:{ws},{ws}{inner})*)?{ws}\]");
    format!("(?:{scalar}|{object}|{array})")
}

/// Any JSON object nested at most `depth` deep.
#[cfg(test)]
fn json_object_regex(depth: usize) -> String {
    object_regex(depth, WS)
}

/// Any JSON object nested at most `depth` deep, `ws` between tokens.
fn object_regex(depth: usize, ws: &str) -> String {
    let inner = value_regex(depth.saturating_sub(1), ws);
    format!(
        r"{ws}\{{{ws}(?:{STRING}{ws}:{ws}{inner}(?:{ws},{ws}{STRING}{ws}:{ws}{inner})*)?{ws}\}}{ws}"
    )
}

/// Names (keys in [`Builder::calls`]) of the free-form JSON rules.
const STRING_RULE: &str = "(string)";
const VALUE_RULE: &str = "(value)";
const OBJECT_RULE: &str = "(object)";

/// Add the free-form JSON rules (any string, value, object; nesting without
/// limit) to `rules`, returning their calls by name. Strings are a rule of
/// their own so that every string, whatever its context, shares one set of
/// DFA states, and with it one mask cache. `ws` goes between tokens.
fn json_rules(rules: &mut Rules, ws: &str) -> HashMap<String, usize> {
    let string = rules.declare(STRING_RULE);
    let value = rules.declare(VALUE_RULE);
    let object = rules.declare(OBJECT_RULE);
    let (s, v, o) = (Rules::call(string), Rules::call(value), Rules::call(object));
    rules.define(string, STRING.to_owned());
    let array = format!(r"\[{ws}(?:{v}(?:{ws},{ws}{v})*)?{ws}\]");
    rules.define(
        value,
        format!("(?:{s}|{NUMBER}|true|false|null|{o}|{array})"),
    );
    rules.define(
        object,
        format!(r"\{{{ws}(?:{s}{ws}:{ws}{v}(?:{ws},{ws}{s}{ws}:{ws}{v})*)?{ws}\}}"),
    );
    [
        (STRING_RULE, string),
        (VALUE_RULE, value),
        (OBJECT_RULE, object),
    ]
    .into_iter()
    .map(|(name, rule)| (name.to_owned(), rule))
    .collect()
}

/// Any JSON object, nested without limit: rules for the pushdown matcher.
/// `whitespace`: insignificant whitespace allowed around and between
/// tokens; without it the object is compact.
pub(crate) fn json_object_rules(whitespace: bool) -> Rules {
    let ws = ws_pattern(whitespace);
    let mut rules = Rules::new();
    let start = rules.declare("(start)");
    let calls = json_rules(&mut rules, ws);
    let object = Rules::call(calls[OBJECT_RULE]);
    rules.define(start, format!("{ws}{object}{ws}"));
    rules
}

/// A regex for JSON documents following `schema`, free-form values in it
/// (`{}`, `true`, objects without `properties`) nested at most
/// [`JSON_DEPTH`] deep. Recursive `$ref`s are an
/// [`GrammarError::Unsupported`] error here (a regex cannot nest without
/// bound); the backend compiles them, and free-form values, with the
/// pushdown matcher instead.
pub fn schema_regex(schema: &Value) -> Result<String, GrammarError> {
    let mut builder = Builder::new(schema);
    let body = builder.value(schema)?;
    if !builder.recursive.is_empty() {
        return Err(GrammarError::Unsupported(
            "recursive $ref (use the backend: it compiles recursion to a pushdown matcher)".into(),
        ));
    }
    Ok(format!("{WS}{body}{WS}"))
}

/// `schema` lowered: one regex when no `$ref` recurses and no free-form
/// value (other than a plain string) occurs, else rules where each
/// recursive `$ref` and the free-form JSON value / object are rules and
/// everything else is inlined, so free-form values nest without bound.
/// `whitespace`: insignificant whitespace allowed around and between
/// tokens; without it documents are compact.
pub(crate) fn schema_grammar(schema: &Value, whitespace: bool) -> Result<Lowered, GrammarError> {
    let ws = ws_pattern(whitespace);
    let mut builder = Builder::new(schema).with_ws(ws);
    let body = builder.value(schema)?;
    if builder.recursive.is_empty() && !builder.free_form {
        return Ok(Lowered::Regex(format!("{ws}{body}{ws}")));
    }
    let recursive = std::mem::take(&mut builder.recursive);
    let mut rules = Rules::new();
    let start = rules.declare("(start)");
    let mut calls: HashMap<String, usize> = recursive
        .iter()
        .map(|reference| (reference.clone(), rules.declare(reference.clone())))
        .collect();
    // Free-form values inside a recursive schema nest without limit too.
    calls.extend(json_rules(&mut rules, ws));
    let lower = |target: &Value| {
        let mut builder = Builder::new(schema).with_ws(ws);
        builder.calls = calls.clone();
        let body = builder.value(target)?;
        if builder.recursive.is_empty() {
            Ok(body)
        } else {
            Err(GrammarError::Unsupported(
                "recursive $ref through an unsupported path".into(),
            ))
        }
    };
    rules.define(start, format!("{ws}{}{ws}", lower(schema)?));
    for reference in &recursive {
        let target = resolve_ref(schema, reference)?;
        rules.define(calls[reference], lower(target)?);
    }
    Ok(Lowered::Rules(rules))
}

fn resolve_ref<'a>(root: &'a Value, reference: &str) -> Result<&'a Value, GrammarError> {
    reference
        .strip_prefix('#')
        .and_then(|pointer| root.pointer(pointer))
        .ok_or_else(|| GrammarError::Unsupported(format!("$ref {reference}")))
}

fn escape_literal(value: &Value) -> String {
    let text = value.to_string();
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

struct Builder<'a> {
    root: &'a Value,
    depth: usize,
    /// `$ref`s being expanded (to find recursion).
    active: Vec<&'a str>,
    /// `$ref`s found to recurse.
    recursive: Vec<String>,
    /// `$ref`s compiled as calls to these rules.
    calls: HashMap<String, usize>,
    /// Whether a free-form value or object was inlined as a bounded regex.
    free_form: bool,
    /// Whitespace between tokens ([`WS`], or nothing for compact JSON).
    ws: &'static str,
}

impl<'a> Builder<'a> {
    fn new(root: &'a Value) -> Self {
        Self {
            root,
            depth: 0,
            active: Vec::new(),
            recursive: Vec::new(),
            calls: HashMap::new(),
            free_form: false,
            ws: WS,
        }
    }

    /// The same, with `ws` between JSON tokens.
    fn with_ws(mut self, ws: &'static str) -> Self {
        self.ws = ws;
        self
    }

    /// A free-form JSON string, value or object: a call to its rule when
    /// compiling rules, else the bounded regex.
    fn free(&mut self, rule: &str) -> String {
        self.free_form |= rule != STRING_RULE && self.calls.is_empty();
        match (self.calls.get(rule), rule) {
            (Some(&call), _) => Rules::call(call),
            (None, STRING_RULE) => STRING.to_owned(),
            (None, OBJECT_RULE) => object_regex(JSON_DEPTH, self.ws),
            (None, _) => value_regex(JSON_DEPTH, self.ws),
        }
    }

    /// As [`Builder::free`], one level shallower on the regex path (the
    /// container around it takes one level).
    fn free_inner(&mut self, rule: &str) -> String {
        self.free_form |= self.calls.is_empty();
        match (self.calls.get(rule), rule) {
            (Some(&call), _) => Rules::call(call),
            (None, OBJECT_RULE) => object_regex(JSON_DEPTH - 1, self.ws),
            (None, _) => value_regex(JSON_DEPTH - 1, self.ws),
        }
    }

    fn value(&mut self, schema: &'a Value) -> Result<String, GrammarError> {
        self.depth += 1;
        if self.depth > 32 {
            return Err(GrammarError::Unsupported(
                "schema nests deeper than 32 levels (recursive $ref?)".into(),
            ));
        }
        let result = self.value_inner(schema);
        self.depth -= 1;
        result
    }

    fn value_inner(&mut self, schema: &'a Value) -> Result<String, GrammarError> {
        let Some(object) = schema.as_object() else {
            return match schema {
                Value::Bool(true) => Ok(self.free(VALUE_RULE)),
                _ => Err(GrammarError::Unsupported(format!("schema {schema}"))),
            };
        };
        if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
            if let Some(&rule) = self.calls.get(reference) {
                return Ok(Rules::call(rule));
            }
            if self.active.contains(&reference) {
                if !self.recursive.iter().any(|r| r == reference) {
                    self.recursive.push(reference.to_owned());
                }
                // Recursion found: this regex is abandoned and the caller
                // compiles the schema as pushdown rules, so the text
                // returned here is never used.
                return Ok(String::new());
            }
            let target = resolve_ref(self.root, reference)?;
            self.active.push(reference);
            let result = self.value(target);
            self.active.pop();
            return result;
        }
        if let Some(value) = object.get("const") {
            return Ok(escape_literal(value));
        }
        if let Some(values) = object.get("enum").and_then(Value::as_array) {
            if values.is_empty() {
                return Err(GrammarError::Unsatisfiable);
            }
            let alternatives: Vec<String> = values.iter().map(escape_literal).collect();
            return Ok(format!("(?:{})", alternatives.join("|")));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(options) = object.get(key).and_then(Value::as_array) {
                let alternatives = options
                    .iter()
                    .map(|option| self.value(option))
                    .collect::<Result<Vec<_>, _>>()?;
                return Ok(format!("(?:{})", alternatives.join("|")));
            }
        }
        if let Some(all) = object.get("allOf").and_then(Value::as_array) {
            return match all.as_slice() {
                [only] => self.value(only),
                _ => Err(GrammarError::Unsupported(
                    "allOf with several schemas".into(),
                )),
            };
        }
        if object.contains_key("patternProperties") {
            return Err(GrammarError::Unsupported("patternProperties".into()));
        }
        match object.get("type") {
            Some(Value::String(kind)) => self.typed(kind, object),
            Some(Value::Array(kinds)) => {
                let alternatives = kinds
                    .iter()
                    .map(|kind| {
                        kind.as_str()
                            .ok_or_else(|| GrammarError::Unsupported(format!("type {kind}")))
                            .and_then(|kind| self.typed(kind, object))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(format!("(?:{})", alternatives.join("|")))
            }
            None if object.contains_key("properties") => self.typed("object", object),
            None => Ok(self.free(VALUE_RULE)),
            Some(other) => Err(GrammarError::Unsupported(format!("type {other}"))),
        }
    }

    fn typed(
        &mut self,
        kind: &str,
        object: &'a serde_json::Map<String, Value>,
    ) -> Result<String, GrammarError> {
        let count = |key: &str| object.get(key).and_then(Value::as_u64);
        match kind {
            "string" => {
                let (min, max) = (count("minLength"), count("maxLength"));
                let format = match object.get("format") {
                    None => None,
                    Some(Value::String(name)) => super::formats::format_regex(name),
                    Some(other) => {
                        return Err(GrammarError::Unsupported(format!(
                            "format {other} is not a string"
                        )));
                    }
                };
                if let Some(body) = format {
                    // A format fixes the string's shape; intersecting it
                    // with lengths or a pattern is not done here.
                    if min.is_some() || max.is_some() || object.contains_key("pattern") {
                        return Err(GrammarError::Unsupported(
                            "`format` together with `minLength` / `maxLength` / `pattern`".into(),
                        ));
                    }
                    return Ok(format!("\"{body}\""));
                }
                if let Some(pattern) = object.get("pattern") {
                    let pattern = pattern.as_str().ok_or_else(|| {
                        GrammarError::Unsupported(format!("pattern {pattern} is not a string"))
                    })?;
                    if min.is_some() || max.is_some() {
                        return Err(GrammarError::Unsupported(
                            "`pattern` together with `minLength` / `maxLength`".into(),
                        ));
                    }
                    return super::pattern::string_pattern_regex(pattern);
                }
                Ok(match (min, max) {
                    (None, None) => self.free(STRING_RULE),
                    (min, max) => {
                        let min = min.unwrap_or(0);
                        let max = max.map(|m| m.to_string()).unwrap_or_default();
                        format!("\"{STRING_CHAR}{{{min},{max}}}\"")
                    }
                })
            }
            "integer" => match super::ranges::integer_bounds(object)? {
                Some((low, high)) => super::ranges::integer_range_regex(low, high),
                None => Ok(INTEGER.to_owned()),
            },
            "number" => Ok(NUMBER.to_owned()),
            "boolean" => Ok("(?:true|false)".to_owned()),
            "null" => Ok("null".to_owned()),
            "array" => {
                let item = match object.get("items") {
                    Some(items) => self.value(items)?,
                    None => self.free_inner(VALUE_RULE),
                };
                let min = count("minItems").unwrap_or(0);
                let max = count("maxItems");
                let ws = self.ws;
                let body = match (min, max) {
                    (_, Some(0)) => String::new(),
                    (0, None) => format!("(?:{item}(?:{ws},{ws}{item})*)?"),
                    (0, Some(max)) => format!("(?:{item}(?:{ws},{ws}{item}){{0,{}}})?", max - 1),
                    (min, max) => {
                        let max = max.map(|m| (m - 1).to_string()).unwrap_or_default();
                        format!("{item}(?:{ws},{ws}{item}){{{},{max}}}", min - 1)
                    }
                };
                Ok(format!(r"\[{ws}{body}{ws}\]"))
            }
            "object" => {
                let Some(properties) = object.get("properties").and_then(Value::as_object) else {
                    return Ok(self.free_inner(OBJECT_RULE));
                };
                let required: Vec<&str> = object
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let optional = properties
                    .keys()
                    .filter(|k| !required.contains(&k.as_str()))
                    .count();
                if optional > MAX_OPTIONAL {
                    return Err(GrammarError::Unsupported(format!(
                        "{optional} optional properties (at most {MAX_OPTIONAL})"
                    )));
                }
                let ws = self.ws;
                let mut members = Vec::new();
                for (name, schema) in properties {
                    let key = escape_literal(&Value::String(name.clone()));
                    let value = self.value(schema)?;
                    members.push((
                        format!("{key}{ws}:{ws}{value}"),
                        required.contains(&name.as_str()),
                    ));
                }
                Ok(format!(
                    r"\{{{ws}{}{ws}\}}",
                    members_regex(&members, false, ws)
                ))
            }
            other => Err(GrammarError::Unsupported(format!("type {other:?}"))),
        }
    }
}

/// Members in order; optional ones may be left out, commas only between
/// members that are present; `ws` around the commas.
fn members_regex(members: &[(String, bool)], need_comma: bool, ws: &str) -> String {
    let Some(((member, required), rest)) = members.split_first() else {
        return String::new();
    };
    let comma = if need_comma {
        format!("{ws},{ws}")
    } else {
        String::new()
    };
    let present = format!("{comma}{member}{}", members_regex(rest, true, ws));
    if *required {
        present
    } else {
        format!("(?:{present}|{})", members_regex(rest, need_comma, ws))
    }
}

/// The DSML block after its opening marker token (or, `inside_block`, after
/// the whole opening tag, as when the prompt already opened it). The DSML
/// token is symbol 0: build the [`super::GrammarVocab`] with `(dsml_id, 0)`.
pub fn dsml_tool_calls_regex(
    format: PromptFormat,
    tools: &[ToolDefinition],
    inside_block: bool,
) -> Result<String, GrammarError> {
    if tools.is_empty() {
        return Err(GrammarError::Unsatisfiable);
    }
    let dsml = format!("(?-u:\\x{SPECIAL_BYTE:02X}\\x00)");
    let (block, invoke, parameter, joiner) = match format {
        PromptFormat::V41 => (" calls", " invoke", " parameter", "\n"),
        PromptFormat::V4 => ("tool_calls", "invoke", "parameter", ""),
    };
    // Free text inside a string parameter: any UTF-8 characters. The
    // closing tag is `</` + the marker, whose first byte (0xFF) is never
    // part of UTF-8 text, so after `</` the text goes on with any character
    // (`<` included) and the marker alone leaves it. Matching characters,
    // not bytes, keeps the text valid UTF-8 (no stray continuation byte)
    // and lets one token hold a whole multi-byte character after `</`.
    let text = "(?s:[^<]|<[^/]|</.)*".to_owned();
    let mut calls = Vec::new();
    for tool in tools {
        let name = escape_literal(&Value::String(tool.name.clone()));
        let name = &name[1..name.len() - 1];
        // Strict tools: every parameter once, in declared order (see `strict`).
        let normalized = super::strict::strict_tool_parameters(tool)?;
        let strict = normalized.is_some();
        let properties = normalized
            .as_ref()
            .unwrap_or(&tool.parameters)
            .get("properties")
            .and_then(Value::as_object);
        let parameter_regex = |key: &str, string: Option<bool>, value: &str| {
            let flag = match string {
                Some(true) => "true",
                Some(false) => "false",
                None => "(?:true|false)",
            };
            format!(
                "<{dsml}{parameter} name=\"{key}\" string=\"{flag}\">{value}</{dsml}{parameter}>"
            )
        };
        let separator = if joiner.is_empty() { "\n" } else { joiner };
        let params = match (strict, properties) {
            (true, Some(properties)) => {
                let mut sequence = Vec::new();
                for (key, schema) in properties {
                    let key = escape_literal(&Value::String(key.clone()));
                    let key = &key[1..key.len() - 1];
                    let is_string = schema.get("type").and_then(Value::as_str) == Some("string");
                    let value = if is_string {
                        text.clone()
                    } else {
                        let mut builder = Builder::new(schema);
                        let value = builder.value(schema)?;
                        if !builder.recursive.is_empty() {
                            return Err(GrammarError::Unsupported(format!(
                                "tool `{}`: recursive $ref in a strict parameter",
                                tool.name
                            )));
                        }
                        value
                    };
                    sequence.push(parameter_regex(key, Some(is_string), &value));
                }
                match format {
                    PromptFormat::V4 => sequence.iter().map(|p| format!("{p}\n")).collect(),
                    PromptFormat::V41 => sequence.join(separator),
                }
            }
            (true, None) => String::new(),
            (false, _) => {
                let param = parameter_regex(r#"[^"<]+"#, None, &text);
                match format {
                    PromptFormat::V4 => format!("(?:{param}\n)*"),
                    PromptFormat::V41 => format!("(?:{param}(?:{separator}{param})*)?"),
                }
            }
        };
        let body = match format {
            PromptFormat::V4 => {
                format!("<{dsml}{invoke} name=\"{name}\">\n{params}</{dsml}{invoke}>\n")
            }
            PromptFormat::V41 => {
                format!("<{dsml}{invoke} name=\"{name}\">\n{params}\n</{dsml}{invoke}>")
            }
        };
        calls.push(body);
    }
    let call = format!("(?:{})", calls.join("|"));
    let list = match format {
        PromptFormat::V4 => format!("{call}+</{dsml}{block}>"),
        PromptFormat::V41 => format!("{call}(?:\n{call})*\n</{dsml}{block}>"),
    };
    Ok(if inside_block {
        list
    } else {
        format!("{block}>\n{list}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use regex_automata::meta::Regex;

    fn full(pattern: &str) -> Regex {
        Regex::new(&format!("^(?:{pattern})$")).unwrap()
    }

    #[test]
    fn schema_subset_accepts_and_rejects() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 5},
                "n": {"type": "integer"},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
            },
            "required": ["name"],
        });
        let re = full(&schema_regex(&schema).unwrap());
        assert!(re.is_match(r#"{"name": "Ann", "n": 3, "tags": ["a","b"]}"#));
        assert!(re.is_match(r#"{"name":"Ann"}"#));
        assert!(re.is_match(r#"{"name":"Ann","tags":[]}"#));
        assert!(!re.is_match(r#"{"n": 3}"#));
        assert!(!re.is_match(r#"{"name": "Annabel"}"#));
        assert!(!re.is_match(r#"{"name": "A", "tags": ["c"]}"#));
        assert!(!re.is_match(r#"{"name": "A",}"#));
    }

    #[test]
    fn json_object_is_bounded_json() {
        let re = full(&json_object_regex(3));
        assert!(re.is_match(r#"{"a": [1, {"b": null}], "c": "x"}"#));
        assert!(!re.is_match(r#"[1]"#));
        assert!(!re.is_match(r#"{"a": }"#));
    }

    #[test]
    fn recursive_ref_is_rejected_clearly() {
        let schema = serde_json::json!({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"});
        assert!(matches!(
            schema_regex(&schema),
            Err(GrammarError::Unsupported(_))
        ));
    }
}
