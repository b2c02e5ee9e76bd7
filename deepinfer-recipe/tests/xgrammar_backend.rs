//! The xgrammar backend (feature `xgrammar`) against the regex backend:
//! along mask-guided token walks over the real V4 vocabulary both must
//! allow the same tokens, except where the two engines are documented to
//! differ (each difference is classified below; an unclassified one fails).
//! Also accept / rollback round trips and typed errors.

#![cfg(feature = "xgrammar")]

mod common;
use common::{allowed, eos, grammar_vocab as vocab};

use std::sync::{Arc, OnceLock};

use deepinfer_recipe::grammar::{
    CompiledGrammar, GrammarBackend, GrammarError, GrammarSpec, GrammarVocab, RegexBackend,
    XGrammarBackend, to_xgrammar_ebnf,
};
use deepinfer_recipe::{PromptFormat, ToolDefinition};

fn xgrammar() -> &'static XGrammarBackend {
    static BACKEND: OnceLock<XGrammarBackend> = OnceLock::new();
    BACKEND.get_or_init(|| XGrammarBackend::new(2))
}

fn bytes(id: u32) -> Vec<u8> {
    common::tokenizer()
        .token_bytes()
        .get(id as usize)
        .cloned()
        .unwrap_or_default()
}

/// The golden-dev JSON schemas (response formats and tool parameters),
/// each once, as the crate's grammar bench uses them.
fn golden_schemas() -> Vec<serde_json::Value> {
    let mut schemas: Vec<serde_json::Value> = Vec::new();
    for case in common::golden_requests() {
        let request = &case["request"];
        let mut found = Vec::new();
        if let Some(schema) = request.pointer("/response_format/json_schema/schema") {
            found.push(schema.clone());
        }
        for tool in request["tools"].as_array().into_iter().flatten() {
            if let Some(parameters) = tool.pointer("/function/parameters") {
                found.push(parameters.clone());
            }
        }
        for schema in found {
            if schema.is_object() && !schemas.contains(&schema) {
                schemas.push(schema);
            }
        }
    }
    schemas
}

/// Tiny deterministic generator for the walks.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % bound.max(1)
    }
}

/// Why a token may be allowed by one backend and not the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Known {
    /// In the value of a `number` with `minimum` / `maximum`: xgrammar
    /// enforces the bounds, the regex backend does not (documented).
    NumberBounds,
    /// A regex with `\d`, `\w` or `\s`: Unicode classes in the regex
    /// backend (Rust `regex` semantics), ASCII in xgrammar; the tokens are
    /// ones with non-ASCII bytes that the regex backend allows.
    UnicodeClasses,
    /// A regex with `.`: the regex backend's `.` excludes `\n` (Rust
    /// `regex`), xgrammar's matches it; the tokens contain `\n`.
    DotMatchesNewline,
}

#[derive(Debug, Default)]
struct Report {
    steps: usize,
    agreeing_steps: usize,
    /// Steps with bit-identical masks (no difference at all).
    exact_steps: usize,
    /// (walk, step, prefix text, token, allowed by regex backend)
    unexplained: Vec<(String, usize, String, u32, bool)>,
    known: std::collections::HashMap<Known, usize>,
    complete_mismatch: Vec<(String, usize, String)>,
}

/// The key whose value the output is in: the last `"key":` of the prefix.
fn current_key(prefix: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(prefix);
    let colon = text.rfind("\":")?;
    let open = text[..colon].rfind('"')?;
    Some(text[open + 1..colon].to_owned())
}

/// Differences explained by a constraint xgrammar enforces and the regex
/// backend does not: only tokens the regex backend allows and xgrammar
/// does not, only in the values of the golden-dev property with such a
/// constraint (`search_docs`: `score`, a number in [0, 1]; the date format
/// of `after` is enforced by both backends and must agree exactly).
/// Anything else is unexplained.
fn classify(name: &str, prefix: &[u8], token: &[u8], by_regex: bool) -> Option<Known> {
    if let Some(pattern) = name.strip_prefix("regex ") {
        let unicode = ["\\d", "\\w", "\\s"].iter().any(|c| pattern.contains(c));
        if by_regex && unicode && token.iter().any(|&b| b >= 0x80) {
            return Some(Known::UnicodeClasses);
        }
        if !by_regex && pattern.contains('.') && token.contains(&b'\n') {
            return Some(Known::DotMatchesNewline);
        }
        return None;
    }
    if !by_regex {
        return None;
    }
    match current_key(prefix)?.as_str() {
        "score" => Some(Known::NumberBounds),
        _ => None,
    }
}

/// Walk both matchers along `guide` (then stop) or, without a guide, along
/// `steps` random tokens both allow; compare masks at every step.
fn walk(
    name: &str,
    regex: &dyn CompiledGrammar,
    xgr: &dyn CompiledGrammar,
    guide: Option<&[u32]>,
    seed: u64,
    steps: usize,
    report: &mut Report,
) {
    let words = vocab().mask_words();
    let tokenizer = common::tokenizer();
    let (mut a, mut b) = (regex.matcher(), xgr.matcher());
    let (mut ma, mut mb) = (vec![0u32; words], vec![0u32; words]);
    let mut rng = Lcg(seed);
    let mut prefix: Vec<u8> = Vec::new();
    let limit = guide.map_or(steps, |g| g.len());
    for step in 0..=limit {
        let ra = a.fill_bitmask(&mut ma);
        let rb = b.fill_bitmask(&mut mb);
        report.steps += 1;
        if a.is_complete() != b.is_complete() {
            report.complete_mismatch.push((
                name.to_owned(),
                step,
                String::from_utf8_lossy(&prefix).into_owned(),
            ));
        }
        let mut agree = true;
        if ma == mb {
            report.exact_steps += 1;
        }
        for word in 0..words {
            let mut diff = ma[word] ^ mb[word];
            while diff != 0 {
                let bit = diff.trailing_zeros();
                diff &= diff - 1;
                let id = word as u32 * 32 + bit;
                let by_regex = allowed(&ma, id);
                match classify(name, &prefix, &bytes(id), by_regex) {
                    Some(known) => *report.known.entry(known).or_default() += 1,
                    None => {
                        agree = false;
                        report.unexplained.push((
                            name.to_owned(),
                            step,
                            String::from_utf8_lossy(&prefix).into_owned(),
                            id,
                            by_regex,
                        ));
                    }
                }
            }
        }
        if agree {
            report.agreeing_steps += 1;
        }
        if ra.is_err() || rb.is_err() {
            assert_eq!(
                ra.is_err(),
                rb.is_err(),
                "{name}: only one backend has no token after {:?}: {ra:?} {rb:?}",
                String::from_utf8_lossy(&prefix)
            );
            return;
        }
        if step == limit {
            return;
        }
        let next = match guide {
            Some(guide) => guide[step],
            None => {
                // Both allow it. Every third step prefer structure (a token
                // starting with JSON / markup punctuation) over free text.
                let both: Vec<u32> = (0..vocab().size() as u32)
                    .filter(|&id| allowed(&ma, id) && allowed(&mb, id))
                    .collect();
                if both.is_empty() {
                    return;
                }
                let punctuation: Vec<u32> = both
                    .iter()
                    .copied()
                    .filter(|&id| bytes(id).first().is_some_and(|c| b"\"{}[],:<>".contains(c)))
                    .collect();
                if !punctuation.is_empty() && rng.next(3) == 0 {
                    punctuation[rng.next(punctuation.len())]
                } else {
                    both[rng.next(both.len())]
                }
            }
        };
        if next == eos() {
            a.accept(next).unwrap();
            b.accept(next).unwrap();
            assert!(a.is_complete() && b.is_complete());
            return;
        }
        let accepted = (a.accept(next), b.accept(next));
        assert_eq!(
            accepted.0.is_ok(),
            accepted.1.is_ok(),
            "{name}: accept of {next} {:?} differs after {:?}",
            String::from_utf8_lossy(&bytes(next)),
            String::from_utf8_lossy(&prefix)
        );
        if accepted.0.is_err() {
            return;
        }
        prefix.extend(tokenizer.token_bytes()[next as usize].iter());
    }
}

fn summarize(label: &str, report: &Report) {
    eprintln!(
        "{label}: {} steps, {} with identical masks, {} equal apart from known differences, known differences (tokens) {:?}, unexplained {}, completion mismatches {}",
        report.steps,
        report.exact_steps,
        report.agreeing_steps,
        report.known,
        report.unexplained.len(),
        report.complete_mismatch.len()
    );
    let only_regex = report.unexplained.iter().filter(|u| u.4).count();
    eprintln!(
        "  unexplained: {only_regex} allowed only by the regex backend, {} only by xgrammar",
        report.unexplained.len() - only_regex
    );
    let mut shown = std::collections::HashMap::new();
    for (name, step, prefix, id, by_regex) in report
        .unexplained
        .iter()
        .filter(|(name, step, ..)| {
            let count = shown.entry((name.clone(), *step)).or_insert(0);
            *count += 1;
            *count <= 6
        })
        .take(40)
    {
        eprintln!(
            "  {name} step {step} after {prefix:?}: token {id} {:?} allowed only by {}",
            String::from_utf8_lossy(&bytes(*id)),
            if *by_regex { "regex" } else { "xgrammar" }
        );
    }
    for (name, step, prefix) in report.complete_mismatch.iter().take(5) {
        eprintln!("  {name} step {step} after {prefix:?}: is_complete differs");
    }
}

fn compile_both(spec: &GrammarSpec) -> (Arc<dyn CompiledGrammar>, Arc<dyn CompiledGrammar>) {
    let regex = RegexBackend::default().compile(spec, &vocab()).unwrap();
    let xgr = xgrammar().compile(spec, &vocab()).unwrap();
    (regex, xgr)
}

#[test]
fn golden_schema_masks_agree_with_the_regex_backend() {
    let tokenizer = common::tokenizer();
    let samples = [
        r#"{"name": "Ann", "age": 31, "tags": ["a", "b"]}"#,
        r#"{"location": "Paris", "days": 3, "unit": "celsius"}"#,
        r#"{"query": "rust", "filters": {"tags": ["x"]}, "limit": 5, "exact": true, "mode": null}"#,
        r#"{"title": "Fix it", "priority": 2, "labels": ["bug"]}"#,
        r#"{"query": "q", "filters": {"after": "2024-01-31", "score": 0.5}, "mode": "fast"}"#,
        r#"{"location": "Oslo", "days": 14, "unit": "fahrenheit"}"#,
        r#"{"title": "T", "priority": 3, "labels": ["a", "b", "c", "d"]}"#,
    ];
    let mut report = Report::default();
    let schemas = golden_schemas();
    assert!(schemas.len() >= 4, "golden-dev schemas: {}", schemas.len());
    for (index, schema) in schemas.iter().enumerate() {
        let spec = GrammarSpec::JsonSchema(schema.clone());
        let (regex, xgr) = compile_both(&spec);
        let name = format!("schema {index}");
        for sample in samples {
            let ids = tokenizer.encode_plain(sample).unwrap();
            // Walk the sample only as far as the schema accepts it.
            let mut probe = regex.matcher();
            let accepted = ids
                .iter()
                .take_while(|&&id| probe.accept(id).is_ok())
                .count();
            walk(
                &name,
                regex.as_ref(),
                xgr.as_ref(),
                Some(&ids[..accepted]),
                0,
                0,
                &mut report,
            );
        }
        for seed in 0..6 {
            walk(
                &name,
                regex.as_ref(),
                xgr.as_ref(),
                None,
                seed,
                24,
                &mut report,
            );
        }
    }
    summarize("golden schemas", &report);
    assert!(report.unexplained.is_empty() && report.complete_mismatch.is_empty());
}

#[test]
fn regex_masks_agree_with_the_regex_backend() {
    let patterns = [
        "[0-9]{3}-[a-z]+",
        "(yes|no|maybe)",
        "[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8}){0,2}",
        "[a-z]+@[a-z]+\\.(com|org)",
        "-?(0|[1-9][0-9]*)(\\.[0-9]+)?",
        "[0-9]{4}-[0-9]{2}-[0-9]{2}",
        "\\d{2}",
        "a.{1,3}c",
        "\\w+ \\s?x",
    ];
    let mut report = Report::default();
    for pattern in patterns {
        let (regex, xgr) = compile_both(&GrammarSpec::Regex(pattern.into()));
        for seed in 0..6 {
            walk(
                &format!("regex {pattern}"),
                regex.as_ref(),
                xgr.as_ref(),
                None,
                seed,
                16,
                &mut report,
            );
        }
    }
    summarize("regexes", &report);
    assert!(report.unexplained.is_empty() && report.complete_mismatch.is_empty());
}

#[test]
fn ebnf_and_json_object_masks_agree_with_the_regex_backend() {
    let grammars = [
        // Not recursive, so the regex backend's bounded expansion is exact.
        "root ::= greeting \" \" name \"!\"\ngreeting ::= \"hello\" | \"hi\"\nname ::= [A-Z] [a-z]{1,6}",
        "list ::= item (\", \" item){0,3}\nitem ::= [0-9]+ | \"x\" .",
    ];
    let mut report = Report::default();
    for grammar in grammars {
        let (regex, xgr) = compile_both(&GrammarSpec::Ebnf(grammar.into()));
        for seed in 0..6 {
            walk(
                "ebnf",
                regex.as_ref(),
                xgr.as_ref(),
                None,
                seed,
                16,
                &mut report,
            );
        }
    }
    let tokenizer = common::tokenizer();
    let (regex, xgr) = compile_both(&GrammarSpec::JsonObject);
    let ids = tokenizer
        .encode_plain(r#"{"a": [1, 2.5, "x"], "b": {"c": null, "d": true}}"#)
        .unwrap();
    walk(
        "json_object",
        regex.as_ref(),
        xgr.as_ref(),
        Some(&ids),
        0,
        0,
        &mut report,
    );
    for seed in 0..4 {
        walk(
            "json_object",
            regex.as_ref(),
            xgr.as_ref(),
            None,
            seed,
            20,
            &mut report,
        );
    }
    summarize("ebnf + json_object", &report);
    assert!(report.unexplained.is_empty() && report.complete_mismatch.is_empty());
}

#[test]
fn tool_call_masks_agree_with_the_regex_backend() {
    let tools = vec![
        ToolDefinition {
            name: "get_weather".into(),
            description: None,
            parameters: serde_json::json!({"type": "object", "properties": {"location": {"type": "string"}, "days": {"type": "integer"}}}),
            strict: Some(true),
            defer_loading: false,
        },
        ToolDefinition {
            name: "search".into(),
            description: None,
            parameters: serde_json::json!({"type": "object", "properties": {"q": {"type": "string"}}}),
            strict: None,
            defer_loading: false,
        },
    ];
    let tokenizer = common::tokenizer();
    let dsml = tokenizer.special_id("｜DSML｜").unwrap();
    let mut report = Report::default();
    for format in [PromptFormat::V41, PromptFormat::V4] {
        let spec = GrammarSpec::ToolCalls {
            format,
            tools: tools.clone(),
            inside_block: false,
        };
        let (regex, xgr) = compile_both(&spec);
        let (block, invoke, parameter, sep) = match format {
            PromptFormat::V41 => (" calls", " invoke", " parameter", "\n"),
            PromptFormat::V4 => ("tool_calls", "invoke", "parameter", "\n"),
        };
        let mut ids = tokenizer.encode_plain(&format!("{block}>\n<")).unwrap();
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
        ids.push(dsml);
        ids.extend(
            tokenizer
                .encode_plain(&format!("{parameter}>{sep}<"))
                .unwrap(),
        );
        ids.push(dsml);
        ids.extend(
            tokenizer
                .encode_plain(&format!("{parameter} name=\"days\" string=\"false\">3</"))
                .unwrap(),
        );
        ids.push(dsml);
        // Walk as far as the regex backend accepts the hand-written block.
        let mut probe = regex.matcher();
        let accepted = ids
            .iter()
            .take_while(|&&id| probe.accept(id).is_ok())
            .count();
        assert!(
            accepted > 10,
            "{format:?}: sample accepted only to {accepted}"
        );
        walk(
            "tools",
            regex.as_ref(),
            xgr.as_ref(),
            Some(&ids[..accepted]),
            0,
            0,
            &mut report,
        );
        for seed in 0..4 {
            walk(
                "tools",
                regex.as_ref(),
                xgr.as_ref(),
                None,
                seed,
                30,
                &mut report,
            );
        }
    }
    summarize("tool calls", &report);
    assert!(report.unexplained.is_empty() && report.complete_mismatch.is_empty());
}

#[test]
fn accept_and_rollback_round_trip() {
    let tokenizer = common::tokenizer();
    let schema = golden_schemas()
        .into_iter()
        .find(|schema| schema.pointer("/properties/name").is_some())
        .unwrap();
    let grammar = xgrammar()
        .compile(&GrammarSpec::JsonSchema(schema), &vocab())
        .unwrap();
    let ids = tokenizer
        .encode_plain(r#"{"name": "Ann", "age": 31, "tags": ["a", "b"]}"#)
        .unwrap();
    let mut matcher = grammar.matcher();
    let words = vocab().mask_words();
    let mut masks = Vec::new();
    for &id in &ids {
        let mut mask = vec![0u32; words];
        matcher.fill_bitmask(&mut mask).unwrap();
        assert!(
            allowed(&mask, id),
            "{id} {:?}",
            String::from_utf8_lossy(&bytes(id))
        );
        masks.push(mask);
        matcher.accept(id).unwrap();
    }
    assert!(matcher.is_complete());
    let mut mask = vec![0u32; words];
    matcher.fill_bitmask(&mut mask).unwrap();
    assert!(allowed(&mask, eos()));
    matcher.accept(eos()).unwrap();
    // After end of sequence nothing is allowed, and nothing is accepted.
    matcher.fill_bitmask(&mut mask).unwrap();
    assert!(mask.iter().all(|&w| w == 0));
    assert!(matches!(
        matcher.accept(ids[0]),
        Err(GrammarError::Rejected(_))
    ));
    matcher.rollback(1).unwrap();
    // Roll back to every earlier point: the mask there is the same again.
    for back in [3usize, 5, ids.len() - 8] {
        let at = ids.len() - back;
        matcher.rollback(back).unwrap();
        matcher.fill_bitmask(&mut mask).unwrap();
        assert_eq!(mask, masks[at], "mask after rolling back to token {at}");
        for &id in &ids[at..] {
            matcher.accept(id).unwrap();
        }
        assert!(matcher.is_complete());
    }
    // A rejected token (one the mask leaves out) leaves the state as it was.
    matcher.rollback(2).unwrap();
    matcher.fill_bitmask(&mut mask).unwrap();
    let before = mask.clone();
    let bad = (0..vocab().size() as u32)
        .find(|&id| !allowed(&mask, id) && !bytes(id).is_empty())
        .unwrap();
    assert!(matches!(
        matcher.accept(bad),
        Err(GrammarError::Rejected(_))
    ));
    matcher.fill_bitmask(&mut mask).unwrap();
    assert_eq!(mask, before);
    for &id in &ids[ids.len() - 2..] {
        matcher.accept(id).unwrap();
    }
    assert!(matcher.is_complete());
    assert!(matches!(
        matcher.rollback(ids.len() + 1),
        Err(GrammarError::Rollback(_))
    ));
    assert!(matches!(
        matcher.accept(u32::MAX),
        Err(GrammarError::Rejected(_))
    ));
}

#[test]
fn errors_are_typed() {
    let backend = xgrammar();
    let vocab = vocab();
    let compile = |spec: GrammarSpec| backend.compile(&spec, &vocab).err();
    // A `$ref` to nothing, a type that does not exist: xgrammar rejects them.
    let missing = compile(GrammarSpec::JsonSchema(
        serde_json::json!({"$ref": "#/$defs/missing"}),
    ));
    assert!(
        matches!(missing, Some(GrammarError::Compile(_))),
        "{missing:?}"
    );
    let unknown = compile(GrammarSpec::JsonSchema(
        serde_json::json!({"type": "tuple"}),
    ));
    assert!(
        matches!(unknown, Some(GrammarError::Compile(_))),
        "{unknown:?}"
    );
    let regex = compile(GrammarSpec::Regex("[a-".into()));
    assert!(matches!(regex, Some(GrammarError::Compile(_))), "{regex:?}");
    let ebnf = compile(GrammarSpec::Ebnf("root ::= \"a\" missing".into()));
    assert!(matches!(ebnf, Some(GrammarError::Compile(_))), "{ebnf:?}");
    let tools = compile(GrammarSpec::ToolCalls {
        format: PromptFormat::V41,
        tools: Vec::new(),
        inside_block: true,
    });
    assert_eq!(tools, Some(GrammarError::Unsatisfiable));

    // A grammar no token of a tiny vocabulary can start.
    let tiny = Arc::new(GrammarVocab::new(
        vec![
            Some(b"a".to_vec()),
            Some(b"b".to_vec()),
            None,
            Some(Vec::new()),
        ],
        &[2],
        &[],
    ));
    // Its own backend: the shared one keeps its compiler for the big vocabulary.
    let backend = XGrammarBackend::new(1);
    let none = backend
        .compile(&GrammarSpec::Regex("c+".into()), &tiny)
        .err();
    assert_eq!(none, Some(GrammarError::Unsatisfiable));
    let ok = backend
        .compile(&GrammarSpec::Regex("a[ab]*".into()), &tiny)
        .unwrap();
    let mut matcher = ok.matcher();
    let mut mask = vec![0u32; tiny.mask_words()];
    matcher.fill_bitmask(&mut mask).unwrap();
    assert_eq!(mask, vec![0b0001]);
    matcher.accept(0).unwrap();
    matcher.fill_bitmask(&mut mask).unwrap();
    // `a` or `b`, or end of sequence (id 2); never the empty token 3.
    assert_eq!(mask, vec![0b0111]);
    assert!(matches!(matcher.accept(3), Err(GrammarError::Rejected(3))));
}

#[test]
fn ebnf_translation_keeps_the_dialect() {
    let (text, root) = to_xgrammar_ebnf("start ::= \"\\x2A\" . [\\x30-9]  # comment\n").unwrap();
    assert_eq!(root, "r_start");
    assert!(text.contains("\\U0000002A"), "{text}");
    assert!(text.contains("[^]"), "{text}");
    assert!(!text.contains("comment"), "{text}");
    assert!(matches!(
        to_xgrammar_ebnf("root ::= \"unterminated"),
        Err(GrammarError::Compile(_))
    ));
}
