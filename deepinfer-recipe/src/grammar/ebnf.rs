//! EBNF grammars (the GBNF dialect of llama.cpp, a subset) compiled to the
//! byte-level regular expressions of the regex/DFA backend.
//!
//! Syntax: rules `name ::= expression`, one or more; `root` is the start rule
//! (else the first rule). Expressions: string literals `"..."` (escapes `\n`
//! `\r` `\t` `\\` `\"` `\xHH` `\uHHHH` `\UHHHHHHHH`), character classes
//! `[a-z_]` / `[^"\\]`, the any-character `.`, rule references, grouping
//! `( ... )`, alternation `|`, and the postfix operators `*` `+` `?` `{m}`
//! `{m,}` `{m,n}`. `#` starts a comment.
//!
//! Grammars without recursion become one regular expression
//! ([`Ebnf::to_regex`], matched by the DFA backend). Grammars where a rule
//! refers to itself (directly or through others) become [`Rules`] for the
//! pushdown matcher ([`Ebnf::to_rules`]): every rule that takes part in
//! recursion stays a rule, called through a marker, and everything else is
//! inlined, so recursion is exact. [`Ebnf::to_regex`] on a recursive grammar
//! still expands each recursive rule to at most [`MAX_RECURSION`] nested
//! levels (dropping its recursive alternatives at the last level). A grammar
//! whose start rule accepts nothing is an [`GrammarError::Unsatisfiable`]
//! error, one that expands past [`MAX_PATTERN`] bytes a
//! [`GrammarError::Compile`] error. Immediate left recursion (`a ::= a "x" |
//! "y"`) is rewritten to repetition (`a ::= "y" "x"*`) when parsing; left
//! recursion through other rules is an [`GrammarError::Unsupported`] error
//! from the pushdown backend.

use std::collections::HashMap;

use super::GrammarError;
use super::pushdown::Rules;

/// Nested expansions of one recursive rule.
pub const MAX_RECURSION: usize = 4;

/// Largest expanded pattern, in bytes.
pub const MAX_PATTERN: usize = 4 << 20;

/// A parsed grammar expression.
#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Literal(String),
    /// (negated, ranges)
    Class(bool, Vec<(char, char)>),
    Any,
    Rule(String),
    Seq(Vec<Expr>),
    Alt(Vec<Expr>),
    Repeat(Box<Expr>, u32, Option<u32>),
}

/// A grammar: its rules and start rule.
#[derive(Debug, Clone)]
pub struct Ebnf {
    rules: HashMap<String, Expr>,
    root: String,
}

fn syntax(at: usize, what: impl std::fmt::Display) -> GrammarError {
    GrammarError::Compile(format!("EBNF syntax error at byte {at}: {what}"))
}

struct Parser<'a> {
    text: &'a str,
    at: usize,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<char> {
        self.text[self.at..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += c.len_utf8();
        Some(c)
    }

    /// Skip blanks and comments; `newlines` says whether line breaks count
    /// as blanks.
    fn skip(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.bump();
                }
            } else if c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n') {
                self.bump();
            } else {
                break;
            }
        }
    }

    fn name(&mut self) -> Option<&'a str> {
        let start = self.at;
        while self.peek().is_some_and(is_name_char) {
            self.bump();
        }
        (self.at > start).then(|| &self.text[start..self.at])
    }

    /// Whether a rule definition (`name ::=`) starts here.
    fn at_definition(&self) -> bool {
        let mut probe = Parser {
            text: self.text,
            at: self.at,
        };
        if probe.name().is_none() {
            return false;
        }
        probe.skip(true);
        probe.text[probe.at..].starts_with("::=")
    }

    fn grammar(&mut self) -> Result<Ebnf, GrammarError> {
        let mut rules = HashMap::new();
        let mut first = None;
        loop {
            self.skip(true);
            if self.peek().is_none() {
                break;
            }
            let start = self.at;
            let name = self
                .name()
                .ok_or_else(|| syntax(start, "expected a rule name"))?
                .to_owned();
            self.skip(true);
            if !self.text[self.at..].starts_with("::=") {
                return Err(syntax(self.at, format!("expected `::=` after `{name}`")));
            }
            self.at += 3;
            let body = self.alternatives()?;
            if rules.insert(name.clone(), body).is_some() {
                return Err(syntax(start, format!("rule `{name}` is defined twice")));
            }
            first.get_or_insert(name);
        }
        let root = if rules.contains_key("root") {
            "root".to_owned()
        } else {
            first.ok_or_else(|| syntax(0, "the grammar has no rules"))?
        };
        let mut grammar = Ebnf { rules, root };
        grammar.check_references()?;
        grammar.remove_immediate_left_recursion();
        Ok(grammar)
    }

    fn alternatives(&mut self) -> Result<Expr, GrammarError> {
        let mut options = vec![self.sequence()?];
        loop {
            self.skip(true);
            if self.peek() == Some('|') {
                self.bump();
                options.push(self.sequence()?);
            } else {
                break;
            }
        }
        Ok(if options.len() == 1 {
            options.pop().unwrap_or(Expr::Seq(Vec::new()))
        } else {
            Expr::Alt(options)
        })
    }

    fn sequence(&mut self) -> Result<Expr, GrammarError> {
        let mut items = Vec::new();
        loop {
            self.skip(true);
            match self.peek() {
                None | Some('|') | Some(')') => break,
                _ if self.at_definition() => break,
                _ => {}
            }
            let item = self.primary()?;
            items.push(self.postfix(item)?);
        }
        Ok(if items.len() == 1 {
            items.pop().unwrap_or(Expr::Seq(Vec::new()))
        } else {
            Expr::Seq(items)
        })
    }

    fn primary(&mut self) -> Result<Expr, GrammarError> {
        let start = self.at;
        match self.peek() {
            Some('"') => {
                self.bump();
                let mut text = String::new();
                loop {
                    match self.bump() {
                        None => return Err(syntax(start, "unterminated string")),
                        Some('"') => break,
                        Some('\\') => text.push(self.escape()?),
                        Some(c) => text.push(c),
                    }
                }
                Ok(Expr::Literal(text))
            }
            Some('[') => {
                self.bump();
                let negated = self.peek() == Some('^');
                if negated {
                    self.bump();
                }
                let mut ranges = Vec::new();
                loop {
                    let low = match self.bump() {
                        None => return Err(syntax(start, "unterminated character class")),
                        Some(']') => break,
                        Some('\\') => self.escape()?,
                        Some(c) => c,
                    };
                    let mut high = low;
                    if self.peek() == Some('-') && !self.text[self.at + 1..].starts_with(']') {
                        self.bump();
                        high = match self.bump() {
                            None => return Err(syntax(start, "unterminated character class")),
                            Some('\\') => self.escape()?,
                            Some(c) => c,
                        };
                        if high < low {
                            return Err(syntax(start, format!("reversed range {low:?}-{high:?}")));
                        }
                    }
                    ranges.push((low, high));
                }
                Ok(Expr::Class(negated, ranges))
            }
            Some('.') => {
                self.bump();
                Ok(Expr::Any)
            }
            Some('(') => {
                self.bump();
                let inner = self.alternatives()?;
                self.skip(true);
                if self.bump() != Some(')') {
                    return Err(syntax(start, "unclosed `(`"));
                }
                Ok(inner)
            }
            Some(c) if is_name_char(c) => Ok(Expr::Rule(self.name().unwrap_or_default().into())),
            Some(c) => Err(syntax(start, format!("unexpected {c:?}"))),
            None => Err(syntax(start, "unexpected end")),
        }
    }

    fn postfix(&mut self, mut item: Expr) -> Result<Expr, GrammarError> {
        loop {
            self.skip(false);
            let (min, max) = match self.peek() {
                Some('*') => (0, None),
                Some('+') => (1, None),
                Some('?') => (0, Some(1)),
                Some('{') => {
                    let start = self.at;
                    self.bump();
                    let close = self.text[self.at..]
                        .find('}')
                        .ok_or_else(|| syntax(start, "unclosed `{`"))?;
                    let body = self.text[self.at..self.at + close].replace(' ', "");
                    self.at += close;
                    let number = |s: &str| {
                        s.parse::<u32>()
                            .map_err(|_| syntax(start, format!("bad repetition `{{{body}}}`")))
                    };
                    let bounds = match body.split_once(',') {
                        None => (number(&body)?, Some(number(&body)?)),
                        Some((low, "")) => (number(low)?, None),
                        Some((low, high)) => (number(low)?, Some(number(high)?)),
                    };
                    if bounds.1.is_some_and(|high| high < bounds.0) || bounds.0 > 1000 {
                        return Err(syntax(start, format!("bad repetition `{{{body}}}`")));
                    }
                    bounds
                }
                _ => return Ok(item),
            };
            self.bump();
            item = Expr::Repeat(Box::new(item), min, max);
        }
    }

    fn escape(&mut self) -> Result<char, GrammarError> {
        let start = self.at;
        let hex = |parser: &mut Self, digits: usize| {
            let text = parser.text.get(parser.at..parser.at + digits);
            let value = text.and_then(|t| u32::from_str_radix(t, 16).ok());
            parser.at += digits;
            value
                .and_then(char::from_u32)
                .ok_or_else(|| syntax(start, "bad escape"))
        };
        match self.bump() {
            Some('n') => Ok('\n'),
            Some('r') => Ok('\r'),
            Some('t') => Ok('\t'),
            Some('x') => hex(self, 2),
            Some('u') => hex(self, 4),
            Some('U') => hex(self, 8),
            Some(c @ ('\\' | '"' | '[' | ']' | '-' | '^')) => Ok(c),
            _ => Err(syntax(start, "bad escape")),
        }
    }
}

/// Regex fragments, with the empty language kept apart (regex syntax has no
/// direct way to say "matches nothing").
#[derive(Debug, Clone, PartialEq)]
enum Fragment {
    Never,
    Pattern(String),
}

fn class_char(c: char) -> String {
    format!("\\x{{{:X}}}", u32::from(c))
}

impl Ebnf {
    /// Parse a grammar.
    pub fn parse(text: &str) -> Result<Self, GrammarError> {
        Parser { text, at: 0 }.grammar()
    }

    /// Rewrite `a ::= a x | a y | b | c` as `a ::= (b | c) (x | y)*`, the
    /// same language without the left recursion (which a pushdown matcher
    /// cannot run: it would call `a` forever before reading anything). Left
    /// recursion through other rules or nullable prefixes is left alone.
    fn remove_immediate_left_recursion(&mut self) {
        for (name, body) in &mut self.rules {
            let options = match &*body {
                Expr::Alt(options) => options.clone(),
                other => vec![other.clone()],
            };
            let (mut tails, mut heads) = (Vec::new(), Vec::new());
            for option in options {
                match option {
                    Expr::Rule(first) if &first == name => tails.push(Expr::Seq(Vec::new())),
                    Expr::Seq(items) if items.first() == Some(&Expr::Rule(name.clone())) => {
                        tails.push(Expr::Seq(items[1..].to_vec()))
                    }
                    other => heads.push(other),
                }
            }
            if tails.is_empty() || heads.is_empty() {
                continue;
            }
            let alternatives = |mut list: Vec<Expr>| {
                if list.len() == 1 {
                    list.pop().unwrap_or(Expr::Seq(Vec::new()))
                } else {
                    Expr::Alt(list)
                }
            };
            *body = Expr::Seq(vec![
                alternatives(heads),
                Expr::Repeat(Box::new(alternatives(tails)), 0, None),
            ]);
        }
    }

    fn check_references(&self) -> Result<(), GrammarError> {
        fn walk(expr: &Expr, grammar: &Ebnf) -> Result<(), GrammarError> {
            match expr {
                Expr::Rule(name) if !grammar.rules.contains_key(name) => Err(
                    GrammarError::Compile(format!("EBNF rule `{name}` is used but not defined")),
                ),
                Expr::Seq(items) | Expr::Alt(items) => {
                    items.iter().try_for_each(|item| walk(item, grammar))
                }
                Expr::Repeat(inner, ..) => walk(inner, grammar),
                _ => Ok(()),
            }
        }
        self.rules.values().try_for_each(|expr| walk(expr, self))
    }

    /// The whole-output regular expression of the grammar.
    pub fn to_regex(&self) -> Result<String, GrammarError> {
        let mut stack = Vec::new();
        match self.expand(&Expr::Rule(self.root.clone()), &mut stack, &HashMap::new())? {
            Fragment::Pattern(pattern) => Ok(pattern),
            Fragment::Never => Err(GrammarError::Unsatisfiable),
        }
    }

    /// Whether some rule refers to itself, directly or through others.
    pub fn is_recursive(&self) -> bool {
        !self.recursive_rules().is_empty()
    }

    /// Rules that can reach themselves, sorted by name.
    fn recursive_rules(&self) -> Vec<String> {
        fn references(expr: &Expr, out: &mut Vec<String>) {
            match expr {
                Expr::Rule(name) => out.push(name.clone()),
                Expr::Seq(items) | Expr::Alt(items) => {
                    items.iter().for_each(|item| references(item, out))
                }
                Expr::Repeat(inner, ..) => references(inner, out),
                _ => {}
            }
        }
        let mut names: Vec<&String> = self.rules.keys().collect();
        names.sort();
        names
            .into_iter()
            .filter(|&name| {
                let mut seen: Vec<String> = Vec::new();
                let mut todo = Vec::new();
                references(&self.rules[name], &mut todo);
                while let Some(next) = todo.pop() {
                    if &next == name {
                        return true;
                    }
                    if !seen.contains(&next)
                        && let Some(body) = self.rules.get(&next)
                    {
                        references(body, &mut todo);
                        seen.push(next);
                    }
                }
                false
            })
            .cloned()
            .collect()
    }

    /// The grammar as rules for the pushdown matcher: rule 0 is the start,
    /// each recursive rule is a rule of its own, the rest is inlined.
    pub fn to_rules(&self) -> Result<Rules, GrammarError> {
        let recursive = self.recursive_rules();
        let mut rules = Rules::new();
        let start = rules.declare("(start)");
        let calls: HashMap<String, usize> = recursive
            .iter()
            .map(|name| (name.clone(), rules.declare(name.clone())))
            .collect();
        let pattern = |fragment| match fragment {
            Fragment::Pattern(pattern) => pattern,
            // An empty class: matches nothing.
            Fragment::Never => "[a&&b]".to_owned(),
        };
        let root = self.expand(&Expr::Rule(self.root.clone()), &mut Vec::new(), &calls)?;
        rules.define(start, pattern(root));
        for name in &recursive {
            let body = self.expand(&self.rules[name], &mut Vec::new(), &calls)?;
            rules.define(calls[name], pattern(body));
        }
        Ok(rules)
    }

    fn expand(
        &self,
        expr: &Expr,
        stack: &mut Vec<String>,
        calls: &HashMap<String, usize>,
    ) -> Result<Fragment, GrammarError> {
        let fragment = match expr {
            Expr::Literal(text) => Fragment::Pattern(regex_syntax_escape(text)),
            Expr::Any => Fragment::Pattern("(?s:.)".into()),
            Expr::Class(negated, ranges) => {
                if ranges.is_empty() {
                    if *negated {
                        Fragment::Pattern("(?s:.)".into())
                    } else {
                        Fragment::Never
                    }
                } else {
                    let mut class = String::from(if *negated { "[^" } else { "[" });
                    for &(low, high) in ranges {
                        class.push_str(&class_char(low));
                        if high != low {
                            class.push('-');
                            class.push_str(&class_char(high));
                        }
                    }
                    class.push(']');
                    Fragment::Pattern(class)
                }
            }
            Expr::Rule(name) if calls.contains_key(name) => {
                Fragment::Pattern(Rules::call(calls[name]))
            }
            Expr::Rule(name) => {
                let depth = stack.iter().filter(|open| *open == name).count();
                if depth >= MAX_RECURSION {
                    return Ok(Fragment::Never);
                }
                let body = self.rules.get(name).ok_or_else(|| {
                    GrammarError::Compile(format!("EBNF rule `{name}` is used but not defined"))
                })?;
                stack.push(name.clone());
                let inner = self.expand(body, stack, calls);
                stack.pop();
                match inner? {
                    Fragment::Pattern(pattern) => Fragment::Pattern(format!("(?:{pattern})")),
                    Fragment::Never => Fragment::Never,
                }
            }
            Expr::Seq(items) => {
                let mut pattern = String::new();
                for item in items {
                    match self.expand(item, stack, calls)? {
                        Fragment::Never => return Ok(Fragment::Never),
                        Fragment::Pattern(part) => pattern.push_str(&part),
                    }
                }
                Fragment::Pattern(pattern)
            }
            Expr::Alt(options) => {
                let mut parts = Vec::new();
                for option in options {
                    if let Fragment::Pattern(part) = self.expand(option, stack, calls)? {
                        parts.push(part);
                    }
                }
                if parts.is_empty() {
                    Fragment::Never
                } else {
                    Fragment::Pattern(format!("(?:{})", parts.join("|")))
                }
            }
            Expr::Repeat(inner, min, max) => match self.expand(inner, stack, calls)? {
                Fragment::Never if *min == 0 => Fragment::Pattern(String::new()),
                Fragment::Never => Fragment::Never,
                Fragment::Pattern(part) => Fragment::Pattern(match (min, max) {
                    (0, None) => format!("(?:{part})*"),
                    (1, None) => format!("(?:{part})+"),
                    (0, Some(1)) => format!("(?:{part})?"),
                    (min, None) => format!("(?:{part}){{{min},}}"),
                    (min, Some(max)) => format!("(?:{part}){{{min},{max}}}"),
                }),
            },
        };
        if let Fragment::Pattern(pattern) = &fragment
            && pattern.len() > MAX_PATTERN
        {
            return Err(GrammarError::Compile(format!(
                "EBNF grammar expands to more than {MAX_PATTERN} bytes of pattern"
            )));
        }
        Ok(fragment)
    }
}

/// Escape text for a regex (every character with a meaning is escaped).
fn regex_syntax_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == ' ' || c == '_' || !c.is_ascii() {
            out.push(c);
        } else {
            out.push_str(&class_char(c));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regex(grammar: &str) -> String {
        Ebnf::parse(grammar).unwrap().to_regex().unwrap()
    }

    fn accepts(grammar: &str, text: &str) -> bool {
        let pattern = format!("^(?:{})$", regex(grammar));
        regex_automata::meta::Regex::new(&pattern)
            .unwrap()
            .is_match(text)
    }

    #[test]
    fn literals_classes_and_repetition() {
        let g = "root ::= \"a\" [0-9]+ (\"-\" | \"+\")? x{2,3}\nx ::= [^a-z\\n]";
        assert!(accepts(g, "a12-XY"));
        assert!(accepts(g, "a1ZZZ"));
        assert!(!accepts(g, "a-XY"));
        assert!(!accepts(g, "a1xy"));
        assert!(!accepts(g, "a1X"));
    }

    #[test]
    fn multi_line_rules_and_comments() {
        let g = "# a list\nroot ::= \"[\" item\n   (\",\" item)* \"]\"  # items\nitem ::= \"\\\"\" [a-z]* \"\\\"\"\n";
        assert!(accepts(g, r#"["a","bc",""]"#));
        assert!(!accepts(g, r#"["a",]"#));
    }

    #[test]
    fn recursion_is_bounded() {
        let g = "root ::= \"(\" root \")\" | \"x\"";
        assert!(accepts(g, "((x))"));
        let deep = format!(
            "{}x{}",
            "(".repeat(MAX_RECURSION),
            ")".repeat(MAX_RECURSION)
        );
        assert!(!accepts(g, &deep));
    }

    #[test]
    fn immediate_left_recursion_becomes_repetition() {
        let g = "root ::= expr\nexpr ::= expr \"+\" num | expr \"-\" num | num\nnum ::= [0-9]+";
        let grammar = Ebnf::parse(g).unwrap();
        // No recursion is left: the DFA path takes it.
        assert!(!grammar.is_recursive());
        assert!(accepts(g, "1+22-3"));
        assert!(accepts(g, "7"));
        assert!(!accepts(g, "+1"));
        assert!(!accepts(g, "1+"));
        // Mixed with true recursion, the recursion stays.
        let nested = "root ::= root \"+\" atom | atom\natom ::= [0-9] | \"(\" root \")\"";
        assert!(Ebnf::parse(nested).unwrap().is_recursive());
    }

    #[test]
    fn errors_are_clear() {
        let never = Ebnf::parse("root ::= root \"x\"").unwrap().to_regex();
        assert_eq!(never, Err(GrammarError::Unsatisfiable));
        let undefined = Ebnf::parse("root ::= item").unwrap_err();
        assert!(
            undefined
                .to_string()
                .contains("`item` is used but not defined")
        );
        for bad in [
            "root ::= \"a",
            "root ::= [a",
            "root = \"a\"",
            "root ::= (\"a\"",
            "::= x",
        ] {
            assert!(
                matches!(Ebnf::parse(bad), Err(GrammarError::Compile(_))),
                "{bad}"
            );
        }
    }
}
