//! JSON-schema `pattern` on strings: the pattern (a search, anchored only by
//! its own `^` / `$`) is rewritten to match the *encoded* string body, so
//! the output is valid JSON whose decoded text the pattern matches.
//! Characters JSON must escape are produced in their escaped form (`\"`,
//! `\\`, `\u00XX` or a short escape for control characters).

use regex_syntax::hir::{Class, ClassUnicode, ClassUnicodeRange, Hir, HirKind, Look};

use super::GrammarError;
use super::schema::STRING_CHAR;

fn unsupported(pattern: &str, what: &str) -> GrammarError {
    GrammarError::Unsupported(format!("pattern {pattern:?}: {what}"))
}

/// A regex for JSON string literals (quotes included) whose text matches
/// `pattern`.
pub fn string_pattern_regex(pattern: &str) -> Result<String, GrammarError> {
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .map_err(|error| GrammarError::Compile(format!("pattern {pattern:?}: {error}")))?;
    let mut parts: Vec<Hir> = match hir.kind() {
        HirKind::Concat(parts) => parts.clone(),
        _ => vec![hir.clone()],
    };
    let anchored_start = matches!(
        parts.first().map(Hir::kind),
        Some(HirKind::Look(Look::Start))
    );
    if anchored_start {
        parts.remove(0);
    }
    let anchored_end = matches!(parts.last().map(Hir::kind), Some(HirKind::Look(Look::End)));
    if anchored_end {
        parts.pop();
    }
    let mut body = String::new();
    for part in &parts {
        encode(part, pattern, &mut body)?;
    }
    let free = format!("{STRING_CHAR}*");
    Ok(format!(
        "\"{}(?:{body}){}\"",
        if anchored_start { "" } else { &free },
        if anchored_end { "" } else { &free }
    ))
}

/// `hir` over decoded text, as a regex over the encoded string body.
fn encode(hir: &Hir, pattern: &str, out: &mut String) -> Result<(), GrammarError> {
    match hir.kind() {
        HirKind::Empty => {}
        HirKind::Literal(literal) => {
            let text = std::str::from_utf8(&literal.0)
                .map_err(|_| unsupported(pattern, "a literal that is not UTF-8"))?;
            for c in text.chars() {
                out.push_str(&encoded_char(c));
            }
        }
        HirKind::Class(Class::Unicode(class)) => out.push_str(&encoded_class(class)),
        HirKind::Class(Class::Bytes(_)) => {
            return Err(unsupported(pattern, "byte classes"));
        }
        HirKind::Look(_) => {
            return Err(unsupported(
                pattern,
                "anchors or word boundaries other than a leading `^` and a trailing `$`",
            ));
        }
        HirKind::Repetition(repetition) => {
            out.push_str("(?:");
            encode(&repetition.sub, pattern, out)?;
            out.push(')');
            match repetition.max {
                Some(max) => out.push_str(&format!("{{{},{max}}}", repetition.min)),
                None => out.push_str(&format!("{{{},}}", repetition.min)),
            }
        }
        HirKind::Capture(capture) => {
            out.push_str("(?:");
            encode(&capture.sub, pattern, out)?;
            out.push(')');
        }
        HirKind::Concat(parts) => {
            for part in parts {
                encode(part, pattern, out)?;
            }
        }
        HirKind::Alternation(options) => {
            out.push_str("(?:");
            for (i, option) in options.iter().enumerate() {
                if i > 0 {
                    out.push('|');
                }
                encode(option, pattern, out)?;
            }
            out.push(')');
        }
    }
    Ok(())
}

/// The JSON encodings of one character, as a regex.
fn encoded_char(c: char) -> String {
    match c {
        '"' => r#"\\""#.to_owned(),
        '\\' => r"\\\\".to_owned(),
        c if (c as u32) < 0x20 => {
            let short = match c {
                '\u{8}' => Some('b'),
                '\u{c}' => Some('f'),
                '\n' => Some('n'),
                '\r' => Some('r'),
                '\t' => Some('t'),
                _ => None,
            };
            let hex = format!(r"\\u00{}", hex_byte_regex(c as u8));
            match short {
                Some(short) => format!(r"(?:\\{short}|{hex})"),
                None => format!("(?:{hex})"),
            }
        }
        c => regex_syntax::escape(c.encode_utf8(&mut [0; 4])),
    }
}

/// Two hex digits of `byte`, either case.
fn hex_byte_regex(byte: u8) -> String {
    format!("{:02x}", byte)
        .chars()
        .map(|d| {
            if d.is_ascii_alphabetic() {
                format!("[{}{}]", d, d.to_ascii_uppercase())
            } else {
                d.to_string()
            }
        })
        .collect()
}

/// A class over decoded text: its plain characters as a class, and each
/// character that JSON escapes as its escape.
fn encoded_class(class: &ClassUnicode) -> String {
    let mut plain = class.clone();
    let escaped = ClassUnicode::new([
        ClassUnicodeRange::new('\0', '\u{1F}'),
        ClassUnicodeRange::new('"', '"'),
        ClassUnicodeRange::new('\\', '\\'),
    ]);
    plain.difference(&escaped);
    let mut special = class.clone();
    special.intersect(&escaped);
    let mut alternatives = Vec::new();
    if !plain.ranges().is_empty() {
        alternatives.push(Hir::class(Class::Unicode(plain)).to_string());
    }
    for range in special.ranges() {
        for c in range.start()..=range.end() {
            alternatives.push(encoded_char(c));
        }
    }
    if alternatives.is_empty() {
        // A class nothing matches.
        return "[a&&b]".to_owned();
    }
    format!("(?:{})", alternatives.join("|"))
}

#[cfg(test)]
mod tests {
    use regex_automata::meta::Regex;

    use super::*;

    fn full(pattern: &str) -> Regex {
        Regex::new(&format!("^{}$", string_pattern_regex(pattern).unwrap())).unwrap()
    }

    /// The JSON literal of `text`.
    fn json(text: &str) -> String {
        serde_json::Value::String(text.to_owned()).to_string()
    }

    #[test]
    fn anchored_and_searched_patterns() {
        let re = full("^[A-Z]{2}-[0-9]{3}$");
        assert!(re.is_match(&json("AB-123")));
        assert!(!re.is_match(&json("AB-1234")) && !re.is_match(&json("xAB-123")));
        let search = full("ab+c");
        assert!(search.is_match(&json("xx abbbc yy")));
        assert!(!search.is_match(&json("ac")));
    }

    #[test]
    fn escaped_characters_follow_json() {
        let re = full(r#"^a"b\\c\n$"#);
        assert!(re.is_match(&json("a\"b\\c\n")));
        assert!(re.is_match(r#""a\"b\\c\u000A""#));
        assert!(!re.is_match("\"a\"b\\c\n\""));
        // A negated class may produce a quote, but only escaped.
        let any = full("^[^x]+$");
        assert!(any.is_match(&json("say \"hi\"\t")));
        assert!(!any.is_match("\"say \"hi\"\""));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// The encoded-string regex accepts a string's JSON literal exactly
        /// when the pattern finds a match in the string itself.
        #[test]
        fn agrees_with_searching_the_decoded_text(
            pattern in proptest::sample::select(vec![
                "^[a-c]+$", "ab|c\"", "^x.*y$", "[^a]{2}", "[0-9]{2,3}", "^(a|\"|\\\\|\n)*$",
                "b?c", "^$", "\t[^\"]",
            ]),
            text in "[abcxy\"\\\\\n\t 0-9\u{1}é]{0,8}",
        ) {
            let oracle = Regex::new(pattern).unwrap();
            proptest::prop_assert_eq!(
                full(pattern).is_match(&json(&text)),
                oracle.is_match(&text),
                "{:?} on {:?}", pattern, text
            );
        }
    }

    #[test]
    fn bad_patterns_are_typed_errors() {
        assert!(matches!(
            string_pattern_regex("(unclosed"),
            Err(GrammarError::Compile(_))
        ));
        assert!(matches!(
            string_pattern_regex(r"a\bb"),
            Err(GrammarError::Unsupported(_))
        ));
    }
}
