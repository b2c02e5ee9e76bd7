//! Compact JSON outputs (`RegexBackend::with_json_whitespace(false)`) over
//! the real V4 vocabulary: masks never allow whitespace outside strings,
//! compact documents are accepted and spaced ones refused, recursion nests
//! deep, and a complete document admits end of sequence and nothing that
//! runs past it (the DFA reports matches one byte late; both JSON paths
//! must still refuse such a token), with and without whitespace.

mod common;
use common::{allowed, eos, grammar_vocab as vocab, mask_of};

use std::sync::{Arc, OnceLock};

use deepinfer_recipe::grammar::{
    CompiledGrammar, GrammarBackend, GrammarError, GrammarSpec, RegexBackend,
};
use proptest::prelude::*;
use serde_json::{Value, json};

fn token_bytes(id: u32) -> &'static [u8] {
    static TABLE: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    let table = TABLE.get_or_init(|| common::tokenizer().token_bytes().to_vec());
    &table[id as usize]
}

fn is_ws(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Plain tokens holding a whitespace byte (the only ones that could put
/// whitespace between JSON tokens).
fn ws_tokens() -> &'static [u32] {
    static IDS: OnceLock<Vec<u32>> = OnceLock::new();
    IDS.get_or_init(|| {
        (0..vocab().size() as u32)
            .filter(|&id| id != eos() && token_bytes(id).iter().copied().any(is_ws))
            .collect()
    })
}

/// Where a JSON lexer stands: outside strings, inside one, or right after a
/// backslash inside one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    Outside,
    Inside,
    Escape,
}

/// Feed `bytes` to the lexer at `lex`; `Err(offset)` at the first
/// whitespace byte outside a string.
fn lex(mut state: Lex, bytes: &[u8]) -> Result<Lex, usize> {
    for (offset, &byte) in bytes.iter().enumerate() {
        state = match (state, byte) {
            (Lex::Outside, b'"') => Lex::Inside,
            (Lex::Outside, b) if is_ws(b) => return Err(offset),
            (Lex::Outside, _) => Lex::Outside,
            (Lex::Inside, b'"') => Lex::Outside,
            (Lex::Inside, b'\\') => Lex::Escape,
            (Lex::Inside, _) | (Lex::Escape, _) => Lex::Inside,
        };
    }
    Ok(state)
}

/// Schemas covering both JSON paths: the DFA path (no recursion, no
/// free-form value), free-form values (pushdown), recursive `$ref`
/// (pushdown), and `json_object`.
fn specs() -> Vec<(&'static str, GrammarSpec)> {
    vec![
        ("json_object", GrammarSpec::JsonObject),
        (
            "flat",
            GrammarSpec::JsonSchema(json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "n": {"type": "integer"},
                    "tags": {"type": "array", "items": {"enum": ["a", "b c"]}},
                    "ok": {"type": "boolean"},
                },
                "required": ["name", "tags"],
            })),
        ),
        (
            "free_form",
            GrammarSpec::JsonSchema(json!({
                "type": "object",
                "properties": {"data": {}, "meta": {"type": "object"}},
                "required": ["data", "meta"],
            })),
        ),
        ("tree", GrammarSpec::JsonSchema(tree_schema())),
    ]
}

fn tree_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "value": {"type": "integer"},
            "children": {"type": "array", "items": {"$ref": "#"}},
        },
        "required": ["value"],
    })
}

/// Compiled grammars of [`specs`]: (name, compact, spaced).
type Compiled = (
    &'static str,
    Arc<dyn CompiledGrammar>,
    Arc<dyn CompiledGrammar>,
);

fn compiled() -> &'static [Compiled] {
    static COMPILED: OnceLock<Vec<Compiled>> = OnceLock::new();
    COMPILED.get_or_init(|| {
        let compact = RegexBackend::default().with_json_whitespace(false);
        let spaced = RegexBackend::default();
        specs()
            .into_iter()
            .map(|(name, spec)| {
                (
                    name,
                    compact.compile(&spec, &vocab()).unwrap(),
                    spaced.compile(&spec, &vocab()).unwrap(),
                )
            })
            .collect()
    })
}

/// Whether `grammar` takes `text` (tokenised plainly) and ends complete.
fn accepts(grammar: &Arc<dyn CompiledGrammar>, text: &str) -> bool {
    let ids = common::tokenizer().encode_plain(text).unwrap();
    let mut matcher = grammar.matcher();
    ids.iter().try_for_each(|&id| matcher.accept(id)).is_ok() && matcher.is_complete()
}

/// Valid documents for [`specs`] (by index).
fn documents() -> [Value; 4] {
    [
        json!({"a": [1, {"b": null}, "x y"], "c": -1.5, "d": {"e": [true, false, {}]}}),
        json!({"name": "Ann Lee", "n": 3, "tags": ["a", "b c"], "ok": true}),
        json!({"data": [[{"k": [1, 2]}], "s p"], "meta": {"k": {"j": []}}}),
        json!({"value": 1, "children": [{"value": 2}, {"value": 3, "children": []}]}),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Along random mask walks, no allowed token puts whitespace outside a
    /// string; end of sequence is allowed exactly when the matcher is
    /// complete, and a completed output parses as JSON.
    #[test]
    fn compact_masks_never_allow_whitespace_outside_strings(
        which in 0usize..4,
        choices in proptest::collection::vec(any::<u32>(), 1..28),
    ) {
        let (name, grammar, _) = &compiled()[which];
        let mut matcher = grammar.matcher();
        let mut text = Vec::new();
        let mut state = Lex::Outside;
        for choice in choices {
            let mask = mask_of(matcher.as_mut());
            prop_assert_eq!(allowed(&mask, eos()), matcher.is_complete(), "{}", name);
            for &id in ws_tokens() {
                if allowed(&mask, id) {
                    prop_assert!(
                        lex(state, token_bytes(id)).is_ok(),
                        "{}: token {:?} after {:?}",
                        name,
                        String::from_utf8_lossy(token_bytes(id)),
                        String::from_utf8_lossy(&text)
                    );
                }
            }
            let ids: Vec<u32> = (0..vocab().size() as u32).filter(|&id| allowed(&mask, id)).collect();
            let id = ids[choice as usize % ids.len()];
            matcher.accept(id).unwrap();
            if id == eos() {
                let parsed = serde_json::from_slice::<Value>(&text);
                prop_assert!(parsed.is_ok(), "{}: {:?}", name, String::from_utf8_lossy(&text));
                break;
            }
            state = lex(state, token_bytes(id)).unwrap();
            text.extend_from_slice(token_bytes(id));
        }
    }
}

#[test]
fn compact_documents_are_accepted_and_spaced_ones_refused() {
    for ((name, compact, spaced), document) in compiled().iter().zip(documents()) {
        let tight = serde_json::to_string(&document).unwrap();
        let pretty = serde_json::to_string_pretty(&document).unwrap();
        let padded = format!(" {tight}\n");
        assert!(accepts(compact, &tight), "{name}: {tight}");
        assert!(accepts(spaced, &tight), "{name}: {tight}");
        assert!(accepts(spaced, &pretty), "{name}: {pretty}");
        assert!(accepts(spaced, &padded), "{name}: {padded:?}");
        assert!(!accepts(compact, &pretty), "{name}: {pretty}");
        assert!(!accepts(compact, &padded), "{name}: {padded:?}");
        // One space after a colon is enough to be refused.
        let colon = tight.replacen(':', ": ", 1);
        assert!(!accepts(compact, &colon), "{name}: {colon}");
        assert!(accepts(spaced, &colon), "{name}: {colon}");
    }
    // Whitespace inside strings is text, compact or not.
    let (_, compact, _) = &compiled()[0];
    assert!(accepts(compact, r#"{"a b":"c\td e\n"}"#));
}

#[test]
fn compact_recursion_nests_deep() {
    let levels = 12;
    let (_, object, _) = &compiled()[0];
    let text = format!("{}1{}", r#"{"a":["#.repeat(levels), "]}".repeat(levels));
    assert!(accepts(object, &text));
    assert!(!accepts(object, &text.replacen('[', "[ ", 1)));
    let (_, tree, _) = &compiled()[3];
    let text = format!(
        r#"{}{{"value":0}}{}"#,
        r#"{"value":1,"children":["#.repeat(levels),
        "]}".repeat(levels)
    );
    assert!(accepts(tree, &text), "{text}");
    let value: Value = serde_json::from_str(&text).unwrap();
    let mut depth = 0;
    let mut node = &value;
    while let Some(child) = node.get("children").and_then(|c| c.get(0)) {
        node = child;
        depth += 1;
    }
    assert_eq!(depth, levels);
    // A linked list through `$defs`, compact, 12 deep.
    let list = json!({
        "$defs": {"node": {
            "type": "object",
            "properties": {"v": {"type": "string"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
            "required": ["v", "next"],
        }},
        "$ref": "#/$defs/node",
    });
    let linked = RegexBackend::default()
        .with_json_whitespace(false)
        .compile(&GrammarSpec::JsonSchema(list), &vocab())
        .unwrap();
    let text = format!(
        "{}null{}",
        r#"{"v":"x y","next":"#.repeat(levels),
        "}".repeat(levels)
    );
    assert!(accepts(&linked, &text));
    assert!(!accepts(&linked, &text.replace(",", ", ")));
}

/// The DFA reports matches one byte late. Every JSON path (DFA and
/// pushdown, compact and spaced) must still refuse a token that runs past
/// a complete document, and allow end of sequence exactly there.
#[test]
fn a_complete_document_admits_only_end_of_sequence() {
    let tokenizer = common::tokenizer();
    // Tokens that start with `}` and go on with something else.
    let past_brace: Vec<u32> = (0..vocab().size() as u32)
        .filter(|&id| {
            let bytes = token_bytes(id);
            bytes.len() > 1 && bytes[0] == b'}' && !bytes[1..].iter().copied().all(is_ws)
        })
        .collect();
    assert!(past_brace.len() > 5, "tokens such as `}}}},` and `}},`");
    let close = tokenizer.encode_plain("}").unwrap()[0];
    for ((name, compact, spaced), document) in compiled().iter().zip(documents()) {
        let text = serde_json::to_string(&document).unwrap();
        assert!(text.ends_with('}'));
        let ids = tokenizer.encode_plain(&text[..text.len() - 1]).unwrap();
        for (grammar, spaced_output) in [(compact, false), (spaced, true)] {
            let mut matcher = grammar.matcher();
            for &id in &ids {
                matcher.accept(id).unwrap();
            }
            // Before the last brace: not complete, no end of sequence, and
            // no token that closes the document and runs on.
            assert!(!matcher.is_complete(), "{name}");
            let mask = mask_of(matcher.as_mut());
            assert!(!allowed(&mask, eos()), "{name}");
            assert!(allowed(&mask, close), "{name}");
            for &id in &past_brace {
                assert!(
                    !allowed(&mask, id),
                    "{name} (spaced {spaced_output}): {:?}",
                    String::from_utf8_lossy(token_bytes(id))
                );
                let mut probe = grammar.matcher();
                ids.iter().for_each(|&t| probe.accept(t).unwrap());
                assert_eq!(probe.accept(id), Err(GrammarError::Rejected(id)));
            }
            matcher.accept(close).unwrap();
            assert!(matcher.is_complete(), "{name}");
            // Complete: end of sequence, and (spaced) trailing whitespace
            // only; compact: end of sequence alone.
            let mask = mask_of(matcher.as_mut());
            assert!(allowed(&mask, eos()), "{name}");
            let others: Vec<u32> = (0..vocab().size() as u32)
                .filter(|&id| id != eos() && allowed(&mask, id))
                .collect();
            if spaced_output {
                assert!(!others.is_empty(), "{name}");
                for &id in &others {
                    assert!(token_bytes(id).iter().copied().all(is_ws), "{name}: {id}");
                }
            } else {
                assert!(others.is_empty(), "{name}: {others:?}");
            }
            let extra = tokenizer.encode_plain("x").unwrap()[0];
            assert_eq!(matcher.accept(extra), Err(GrammarError::Rejected(extra)));
            matcher.accept(eos()).unwrap();
            assert!(matcher.is_complete());
        }
    }
}

#[test]
fn the_default_backend_allows_whitespace() {
    assert!(RegexBackend::default().json_whitespace);
    assert!(
        !RegexBackend::default()
            .with_json_whitespace(false)
            .json_whitespace
    );
}
