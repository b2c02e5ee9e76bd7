//! Structured outputs over the real V4 vocabulary: masks, accept, rollback,
//! triggers, cache and errors.

mod common;
use common::{allowed, grammar_vocab as vocab};

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use deepinfer_recipe::grammar::{
    GrammarBackend, GrammarCache, GrammarError, GrammarSpec, GrammarVocab, Matcher, RegexBackend,
    Triggered,
};
use deepinfer_recipe::testing::drive;
use deepinfer_recipe::{PromptFormat, SpecialToken, ToolDefinition};

#[test]
fn json_schema_mask_follows_the_schema() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    });
    let grammar = RegexBackend::default()
        .compile(&GrammarSpec::JsonSchema(schema), &vocab())
        .unwrap();
    let tokenizer = common::tokenizer();
    let good = tokenizer
        .encode_plain(r#"{"city": "Paris", "days": 3}"#)
        .unwrap();
    let mut matcher = grammar.matcher();
    drive(matcher.as_mut(), &good).unwrap();
    assert!(matcher.is_complete());
    let eos = tokenizer
        .special_id(SpecialToken::Eos.deepseek_spelling())
        .unwrap();
    let mut mask = vec![0u32; vocab().mask_words()];
    matcher.fill_bitmask(&mut mask).unwrap();
    assert!(allowed(&mask, eos));
    // A wrong key is rejected, and rollback restores the earlier state.
    matcher.rollback(good.len()).unwrap();
    let bad = tokenizer.encode_plain(r#"{"town""#).unwrap();
    let result = bad.iter().try_for_each(|&id| matcher.accept(id));
    assert!(matches!(result, Err(GrammarError::Rejected(_))));
    assert!(matches!(
        matcher.rollback(1000),
        Err(GrammarError::Rollback(_))
    ));
}

#[test]
fn json_object_and_regex() {
    let backend = RegexBackend::default();
    let tokenizer = common::tokenizer();
    let grammar = backend.compile(&GrammarSpec::JsonObject, &vocab()).unwrap();
    let mut matcher = grammar.matcher();
    drive(
        matcher.as_mut(),
        &tokenizer
            .encode_plain(r#"{"a": [1, 2], "b": {"c": null}}"#)
            .unwrap(),
    )
    .unwrap();
    assert!(matcher.is_complete());

    let grammar = backend
        .compile(&GrammarSpec::Regex("[0-9]{3}-[a-z]+".into()), &vocab())
        .unwrap();
    let mut matcher = grammar.matcher();
    drive(
        matcher.as_mut(),
        &tokenizer.encode_plain("123-abc").unwrap(),
    )
    .unwrap();
    assert!(matcher.is_complete());
    let mut mask = vec![0u32; vocab().mask_words()];
    let mut fresh = grammar.matcher();
    fresh.fill_bitmask(&mut mask).unwrap();
    let letter = tokenizer.encode_plain("a").unwrap()[0];
    assert!(!allowed(&mask, letter));
}

#[test]
fn tool_call_grammar_engages_only_from_the_marker_after_think_end() {
    let tokenizer = common::tokenizer();
    let think_end = tokenizer.special_id("</think>").unwrap();
    let dsml = tokenizer.special_id("｜DSML｜").unwrap();
    let tool = ToolDefinition {
        name: "get_weather".into(),
        description: None,
        parameters: serde_json::json!({"type": "object", "properties": {"location": {"type": "string"}, "days": {"type": "integer"}}}),
        strict: Some(true),
        defer_loading: false,
    };
    let grammar = RegexBackend::default()
        .compile(
            &GrammarSpec::ToolCalls {
                format: PromptFormat::V41,
                tools: vec![tool],
                inside_block: false,
            },
            &vocab(),
        )
        .unwrap();
    let mut matcher = Triggered::new(
        grammar.matcher(),
        Some(think_end),
        Some(dsml),
        vocab().size(),
    );
    let mut ids = tokenizer
        .encode_plain("Reasoning with <｜DSML｜ spelled")
        .unwrap();
    ids.push(dsml); // before </think>: still free
    ids.push(think_end);
    ids.extend(tokenizer.encode_plain("Let me check. <").unwrap());
    for &id in &ids {
        matcher.accept(id).unwrap();
    }
    assert!(!matcher.is_active());
    matcher.accept(dsml).unwrap();
    assert!(matcher.is_active());
    let mut block = tokenizer.encode_plain(" calls>\n<").unwrap();
    block.push(dsml);
    block.extend(
        tokenizer
            .encode_plain(" invoke name=\"get_weather\">\n<")
            .unwrap(),
    );
    // Strict: every parameter, in declared order.
    let opened = block.clone();
    block.push(dsml);
    block.extend(
        tokenizer
            .encode_plain(" parameter name=\"location\" string=\"true\">Paris</")
            .unwrap(),
    );
    block.push(dsml);
    block.extend(tokenizer.encode_plain(" parameter>\n<").unwrap());
    block.push(dsml);
    block.extend(
        tokenizer
            .encode_plain(" parameter name=\"days\" string=\"false\">3</")
            .unwrap(),
    );
    block.push(dsml);
    block.extend(tokenizer.encode_plain(" parameter>\n</").unwrap());
    block.push(dsml);
    block.extend(tokenizer.encode_plain(" invoke>\n</").unwrap());
    block.push(dsml);
    block.extend(tokenizer.encode_plain(" calls>").unwrap());
    for &id in &block {
        matcher.accept(id).unwrap();
    }
    assert!(matcher.is_complete());
    // Leaving out `location` (a required parameter under strict) is rejected.
    matcher.rollback(block.len()).unwrap();
    let mut missing = opened;
    missing.push(dsml);
    missing.extend(tokenizer.encode_plain(" parameter name=\"days\"").unwrap());
    assert!(
        missing
            .iter()
            .try_for_each(|&id| matcher.accept(id))
            .is_err()
    );
    let mut fresh = Triggered::new(grammar.matcher(), None, Some(dsml), vocab().size());
    fresh.accept(dsml).unwrap();
    // An unknown tool name is rejected.
    let mut matcher = fresh;
    let wrong = tokenizer.encode_plain(" calls>\n<").unwrap();
    for &id in &wrong {
        matcher.accept(id).unwrap();
    }
    matcher.accept(dsml).unwrap();
    for &id in &tokenizer.encode_plain(" invoke name=\"").unwrap() {
        matcher.accept(id).unwrap();
    }
    let result = tokenizer
        .encode_plain("unknown_tool")
        .unwrap()
        .iter()
        .try_for_each(|&id| matcher.accept(id));
    assert!(result.is_err());
}

/// Regression (found by the xgrammar differential test): after `</` inside
/// a string parameter the text goes on with any UTF-8 character, not a byte.
/// Token 275 (`E4 B8`, the start of `中`) is allowed there; token 97 (a lone
/// continuation byte `A1`, invalid text) is not.
#[test]
fn dsml_text_after_close_tag_start_is_utf8() {
    let tokenizer = common::tokenizer();
    let dsml = tokenizer.special_id("｜DSML｜").unwrap();
    let (lead, stray) = (275u32, 97u32);
    assert_eq!(tokenizer.token_bytes()[lead as usize], [0xE4, 0xB8]);
    assert_eq!(tokenizer.token_bytes()[stray as usize], [0xA1]);
    let tool = ToolDefinition {
        name: "get_weather".into(),
        description: None,
        parameters: serde_json::json!({"type": "object", "properties": {"location": {"type": "string"}}}),
        strict: Some(true),
        defer_loading: false,
    };
    for format in [PromptFormat::V4, PromptFormat::V41] {
        let (invoke, parameter) = match format {
            PromptFormat::V4 => ("invoke", "parameter"),
            PromptFormat::V41 => (" invoke", " parameter"),
        };
        let grammar = RegexBackend::default()
            .compile(
                &GrammarSpec::ToolCalls {
                    format,
                    tools: vec![tool.clone()],
                    inside_block: true,
                },
                &vocab(),
            )
            .unwrap();
        let mut ids = tokenizer.encode_plain("<").unwrap();
        ids.push(dsml);
        ids.extend(
            tokenizer
                .encode_plain(&format!("{invoke} name=\"get_weather\">\n<"))
                .unwrap(),
        );
        ids.push(dsml);
        ids.extend(
            tokenizer
                .encode_plain(&format!(
                    "{parameter} name=\"location\" string=\"true\">Paris</"
                ))
                .unwrap(),
        );
        let mut matcher = grammar.matcher();
        drive(matcher.as_mut(), &ids).unwrap();
        let mut mask = vec![0u32; vocab().mask_words()];
        matcher.fill_bitmask(&mut mask).unwrap();
        assert!(allowed(&mask, lead), "{format:?}: `中` refused after `</`");
        assert!(!allowed(&mask, stray), "{format:?}: stray byte allowed");
        assert!(allowed(&mask, dsml), "{format:?}: closing marker refused");
        // The text goes on (`</中文` is text), and still closes normally.
        matcher.accept(lead).unwrap();
        let tail = tokenizer
            .token_bytes()
            .iter()
            .position(|bytes| bytes[..] == [0xAD])
            .unwrap() as u32;
        let mut rest = vec![tail];
        rest.extend(tokenizer.encode_plain("文</").unwrap());
        rest.push(dsml);
        drive(matcher.as_mut(), &rest).unwrap();
    }
}

#[test]
fn integer_ranges_and_string_patterns_are_enforced() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"},
            "age": {"type": "integer", "minimum": 18, "exclusiveMaximum": 130},
        },
        "required": ["code", "age"],
    });
    let grammar = RegexBackend::default()
        .compile(&GrammarSpec::JsonSchema(schema), &vocab())
        .unwrap();
    let tokenizer = common::tokenizer();
    let accepts = |text: &str| {
        let ids = tokenizer.encode_plain(text).unwrap();
        let mut matcher = grammar.matcher();
        ids.iter().try_for_each(|&id| matcher.accept(id)).is_ok() && matcher.is_complete()
    };
    assert!(accepts(r#"{"code": "ABC-42", "age": 18}"#));
    assert!(accepts(r#"{"code": "XYZ-0", "age": 129}"#));
    assert!(!accepts(r#"{"code": "ABC-42", "age": 17}"#));
    assert!(!accepts(r#"{"code": "ABC-42", "age": 130}"#));
    assert!(!accepts(r#"{"code": "AB-42", "age": 20}"#));
    assert!(!accepts(r#"{"code": "ABC-", "age": 20}"#));
    // The mask agrees: after `"age": 1`, only digits that can still reach
    // 18..=129 (or more digits) are allowed, never a closing brace.
    let prefix = tokenizer
        .encode_plain(r#"{"code": "ABC-1", "age": 1"#)
        .unwrap();
    let mut matcher = grammar.matcher();
    drive(matcher.as_mut(), &prefix).unwrap();
    let mut mask = vec![0u32; vocab().mask_words()];
    matcher.fill_bitmask(&mut mask).unwrap();
    let close = tokenizer.encode_plain("}").unwrap()[0];
    let nine = tokenizer.encode_plain("9").unwrap()[0];
    assert!(!allowed(&mask, close) && allowed(&mask, nine));
}

#[test]
fn string_formats_are_enforced_over_the_vocabulary() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "day": {"type": "string", "format": "date"},
            "at": {"type": "string", "format": "date-time"},
            "id": {"type": "string", "format": "uuid"},
            "note": {"type": "string", "format": "no-such-format"},
        },
        "required": ["day", "at", "id", "note"],
    });
    let grammar = RegexBackend::default()
        .compile(&GrammarSpec::JsonSchema(schema), &vocab())
        .unwrap();
    let tokenizer = common::tokenizer();
    let accepts = |day: &str, at: &str, id: &str| {
        let text = format!(r#"{{"day": "{day}", "at": "{at}", "id": "{id}", "note": "any"}}"#);
        let ids = tokenizer.encode_plain(&text).unwrap();
        let mut matcher = grammar.matcher();
        ids.iter().try_for_each(|&id| matcher.accept(id)).is_ok() && matcher.is_complete()
    };
    let (at, id) = (
        "2024-02-29T23:59:59.5+05:30",
        "123e4567-e89b-12d3-a456-426614174000",
    );
    assert!(accepts("2024-12-31", at, id));
    assert!(!accepts("2024-13-01", at, id));
    assert!(!accepts("2024-1-01", at, id));
    assert!(!accepts("2024-12-31", "2024-02-29 23:59:59Z", id));
    assert!(!accepts(
        "2024-12-31",
        at,
        "123e4567-e89b-12d3-a456-42661417400g"
    ));
    // The mask agrees: after `"day": "2024-1`, only `0`-`2` may follow.
    let prefix = tokenizer.encode_plain(r#"{"day": "2024-1"#).unwrap();
    let mut matcher = grammar.matcher();
    drive(matcher.as_mut(), &prefix).unwrap();
    let mut mask = vec![0u32; vocab().mask_words()];
    matcher.fill_bitmask(&mut mask).unwrap();
    let digit = |d: &str| tokenizer.encode_plain(d).unwrap()[0];
    assert!(allowed(&mask, digit("2")) && !allowed(&mask, digit("3")));
    // `format` with lengths or a pattern is a clear error.
    let both = serde_json::json!({"type": "string", "format": "email", "maxLength": 64});
    assert!(matches!(
        RegexBackend::default().compile(&GrammarSpec::JsonSchema(both), &vocab()),
        Err(GrammarError::Unsupported(_))
    ));
}

#[test]
fn errors_are_typed() {
    let backend = RegexBackend::default();
    assert!(matches!(
        backend.compile(&GrammarSpec::Regex("(".into()), &vocab()),
        Err(GrammarError::Compile(_))
    ));
    // Only reserved bytes would satisfy it: no token can.
    assert!(matches!(
        backend.compile(&GrammarSpec::Regex("(?-u:\\xFF\\x07)".into()), &vocab()),
        Err(GrammarError::Unsatisfiable)
    ));
    assert!(matches!(
        backend.compile(
            &GrammarSpec::JsonSchema(serde_json::json!({"allOf": [{}, {}]})),
            &vocab()
        ),
        Err(GrammarError::Unsupported(_))
    ));
    assert!(matches!(
        backend.compile(
            &GrammarSpec::JsonSchema(serde_json::json!({"enum": []})),
            &vocab()
        ),
        Err(GrammarError::Unsatisfiable)
    ));
    // An empty integer range, a pattern that does not parse, and one with an
    // anchor in the middle.
    assert!(matches!(
        backend.compile(
            &GrammarSpec::JsonSchema(
                serde_json::json!({"type": "integer", "minimum": 5, "maximum": 4})
            ),
            &vocab()
        ),
        Err(GrammarError::Unsatisfiable)
    ));
    assert!(matches!(
        backend.compile(
            &GrammarSpec::JsonSchema(serde_json::json!({"type": "string", "pattern": "(a"})),
            &vocab()
        ),
        Err(GrammarError::Compile(_))
    ));
    assert!(matches!(
        backend.compile(
            &GrammarSpec::JsonSchema(serde_json::json!({"type": "string", "pattern": "a^b"})),
            &vocab()
        ),
        Err(GrammarError::Unsupported(_))
    ));
}

#[test]
fn cache_hits_and_time_limit() {
    let cache = GrammarCache::new(
        Arc::new(RegexBackend::default()),
        vocab(),
        Duration::from_secs(60),
    );
    let spec = GrammarSpec::Regex("yes|no".into());
    let first = cache.get(&spec).unwrap();
    let second = cache.get(&spec).unwrap();
    assert!(Arc::ptr_eq(&first, &second));
    assert_eq!(cache.len(), 1);
    let strict = GrammarCache::new(Arc::new(RegexBackend::default()), vocab(), Duration::ZERO);
    let slow = GrammarSpec::Regex("[a-z]{1,5000}".into());
    assert!(matches!(strict.get(&slow), Err(GrammarError::Timeout(_))));
}

const ARITHMETIC: &str = r#"
# integer arithmetic; recursive through `factor` (the pushdown matcher)
root   ::= expr
expr   ::= term (ws [-+] ws term)*
term   ::= factor (ws [*/] ws factor)*
factor ::= [0-9]+ | "(" ws expr ws ")" | "-" factor
ws     ::= " "?
"#;

#[test]
fn ebnf_grammar_masks_accepts_and_rolls_back() {
    let grammar = RegexBackend::default()
        .compile(&GrammarSpec::Ebnf(ARITHMETIC.into()), &vocab())
        .unwrap();
    let tokenizer = common::tokenizer();
    let mut matcher = grammar.matcher();
    let ids = tokenizer.encode_plain("(12 + 3) * -4").unwrap();
    drive(matcher.as_mut(), &ids).unwrap();
    assert!(matcher.is_complete());
    // A letter is never allowed; a closing parenthesis is not allowed yet
    // after an opening one.
    let mut mask = vec![0u32; vocab().mask_words()];
    let letter = tokenizer.encode_plain("a").unwrap()[0];
    matcher.fill_bitmask(&mut mask).unwrap();
    assert!(!allowed(&mask, letter));
    matcher.rollback(ids.len()).unwrap();
    let open = tokenizer.encode_plain("(").unwrap();
    drive(matcher.as_mut(), &open).unwrap();
    assert!(!matcher.is_complete());
    let close = tokenizer.encode_plain(")").unwrap()[0];
    matcher.fill_bitmask(&mut mask).unwrap();
    assert!(!allowed(&mask, close));
    assert_eq!(matcher.accept(close), Err(GrammarError::Rejected(close)));
}

#[test]
fn ebnf_errors_are_typed() {
    let backend = RegexBackend::default();
    // No base case: the start rule accepts nothing.
    let empty = backend.compile(&GrammarSpec::Ebnf("root ::= root \"x\"".into()), &vocab());
    assert!(matches!(empty, Err(GrammarError::Unsatisfiable)));
    // A vocabulary without the needed character: no token can start.
    let tiny = Arc::new(GrammarVocab::new(
        vec![Some(b"a".to_vec()), Some(b"b".to_vec()), None],
        &[2],
        &[],
    ));
    let none = backend.compile(&GrammarSpec::Ebnf("root ::= \"c\" [ab]*".into()), &tiny);
    assert!(matches!(none, Err(GrammarError::Unsatisfiable)));
    let ok = backend.compile(&GrammarSpec::Ebnf("root ::= \"a\" [ab]*".into()), &tiny);
    assert!(ok.is_ok());
    let bad = backend.compile(&GrammarSpec::Ebnf("root ::= \"a\" missing".into()), &tiny);
    assert!(matches!(bad, Err(GrammarError::Compile(m)) if m.contains("`missing`")));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// The matcher accepts a text's tokens and ends complete exactly when the
    /// grammar's own regex accepts the text (that regex expands recursion to
    /// a bounded depth, so only texts nested less deeply are compared; see
    /// tests/grammar_pushdown.rs for the unbounded reference).
    #[test]
    fn ebnf_matcher_agrees_with_the_grammar(text in "[0-9 ()*+/-]{0,16}") {
        let nesting = text.chars().scan(0i32, |depth, c| {
            *depth += i32::from(c == '(') - i32::from(c == ')');
            Some(*depth)
        }).max().unwrap_or(0);
        proptest::prop_assume!(nesting < deepinfer_recipe::grammar::EBNF_MAX_RECURSION as i32);
        static GRAMMAR: OnceLock<Arc<dyn deepinfer_recipe::grammar::CompiledGrammar>> = OnceLock::new();
        let grammar = GRAMMAR.get_or_init(|| {
            RegexBackend::default()
                .compile(&GrammarSpec::Ebnf(ARITHMETIC.into()), &vocab())
                .unwrap()
        });
        let pattern = deepinfer_recipe::grammar::Ebnf::parse(ARITHMETIC).unwrap().to_regex().unwrap();
        let reference = regex_automata::meta::Regex::new(&format!("^(?:{pattern})$")).unwrap();
        let ids = common::tokenizer().encode_plain(&text).unwrap();
        let mut matcher = grammar.matcher();
        let accepted = ids.iter().all(|&id| matcher.accept(id).is_ok()) && matcher.is_complete();
        proptest::prop_assert_eq!(accepted, reference.is_match(&text));
    }
}

/// The DFA reports matches one byte late; a complete output must not admit
/// one more arbitrary token.
#[test]
fn complete_output_allows_only_end_of_sequence() {
    let tokenizer = common::tokenizer();
    let eos = tokenizer
        .special_id(SpecialToken::Eos.deepseek_spelling())
        .unwrap();
    for spec in [
        GrammarSpec::Regex("42".into()),
        GrammarSpec::Ebnf("root ::= \"42\"".into()),
    ] {
        let grammar = RegexBackend::default().compile(&spec, &vocab()).unwrap();
        let mut matcher = grammar.matcher();
        drive(matcher.as_mut(), &tokenizer.encode_plain("42").unwrap()).unwrap();
        let mut mask = vec![0u32; vocab().mask_words()];
        matcher.fill_bitmask(&mut mask).unwrap();
        let allowed: u32 = mask.iter().map(|w| w.count_ones()).sum();
        assert_eq!(allowed, 1, "{spec:?}");
        assert!(matches!(
            mask[eos as usize / 32] & (1 << (eos % 32)),
            bit if bit != 0
        ));
        let extra = tokenizer.encode_plain("x").unwrap()[0];
        assert_eq!(matcher.accept(extra), Err(GrammarError::Rejected(extra)));
    }
}
