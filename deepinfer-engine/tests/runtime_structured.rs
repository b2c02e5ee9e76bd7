//! Structured outputs end to end on the embedded default's architecture with random weights
//! (the real DeepSeek vocabulary; a random model wanders through a grammar where a trained one
//! takes its favourite path): every output under a JSON schema parses and validates, a regex
//! constrains the text, strict tool calls come back structured,
//! and the constraint holds with DSpark drafts verified under grammar masks; `n > 1` samples
//! share the prompt through forks and equal independent requests.
#![cfg(feature = "runtime")]

use deepinfer_engine::Model;
use deepinfer_engine::model::{RandomDtype, write_random_checkpoint};
use deepinfer_engine::runtime::default_model::DEFAULT_CONFIG_JSON;
use deepinfer_engine::runtime::{
    ChatFrontend, Engine, EngineConfig, FinishReason, GrammarConstraint, Output,
};
use deepinfer_kernels::CpuBackend;
use deepinfer_recipe::{PromptTokenizer, SpecialToken};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::OnceLock;

fn model_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("runtime-structured-model");
        std::fs::create_dir_all(&base).unwrap();
        let config = base.join("default_config.json");
        std::fs::write(&config, DEFAULT_CONFIG_JSON).unwrap();
        let dir = base.join("random");
        write_random_checkpoint(&config, &dir, 0x0041_2026, RandomDtype::F32)
            .expect("random checkpoint written");
        dir
    })
    .clone()
}

fn frontend() -> ChatFrontend {
    static FRONT: OnceLock<ChatFrontend> = OnceLock::new();
    FRONT
        .get_or_init(|| {
            ChatFrontend::new(
                PromptTokenizer::deepseek_v4().unwrap(),
                deepinfer_engine::ModelKind::V41,
            )
        })
        .clone()
}

fn engine(cfg: EngineConfig) -> Engine<CpuBackend> {
    let model = Model::load(&model_dir(), CpuBackend::batch_invariant()).unwrap();
    Engine::new(model, cfg)
        .unwrap()
        .with_tokenizer(frontend().tokenizer().clone())
}

/// Run chat bodies; outputs per body, choices in order.
fn run(engine: &mut Engine<CpuBackend>, bodies: &[Value]) -> Vec<Vec<Output>> {
    let front = frontend();
    let mut reqs = Vec::new();
    for (i, b) in bodies.iter().enumerate() {
        let prep = front.prepare(b, i as u64, 7).expect("body converts");
        reqs.extend(prep.requests);
    }
    let outs = engine.generate(reqs).unwrap();
    (0..bodies.len() as u64)
        .map(|i| outs.iter().filter(|o| o.id == i).cloned().collect())
        .collect()
}

/// Bounded everywhere (enums, booleans, a short string, a short array): a model with random
/// weights picks among the allowed tokens at random, so an unbounded string or number would
/// run to the token limit before the JSON closes.
const SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 6},
    "ok": {"type": "boolean"},
    "color": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}
  },
  "required": ["name", "ok", "color", "tags"]
}"#;

/// A validator for exactly the schema above (no JSON-schema crate in the workspace).
fn validates(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    for k in o.keys() {
        if !["name", "ok", "color", "tags"].contains(&k.as_str()) {
            return Err(format!("unknown key {k}"));
        }
    }
    let name = o["name"].as_str().ok_or("name not a string")?;
    if name.chars().count() > 6 {
        return Err(format!("name too long: {name:?}"));
    }
    o["ok"].as_bool().ok_or("ok not a boolean")?;
    let color = o["color"].as_str().ok_or("color not a string")?;
    if !["red", "green", "blue"].contains(&color) {
        return Err(format!("color {color}"));
    }
    let tags = o["tags"].as_array().ok_or("tags not an array")?;
    if tags.len() > 3 || tags.iter().any(|t| t != "a" && t != "b") {
        return Err(format!("tags {tags:?}"));
    }
    Ok(())
}

fn schema_body(seed: u64, temperature: f64) -> Value {
    json!({
        "model": "deepinfer",
        "messages": [{"role": "user", "content": format!("Describe item {seed} as JSON.")}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "item", "schema": serde_json::from_str::<Value>(SCHEMA).unwrap()}},
        "max_tokens": 160,
        "temperature": temperature,
        "seed": seed,
    })
}

#[test]
fn every_output_under_a_json_schema_parses_and_validates() {
    let mut e = engine(EngineConfig::default());
    let mut bodies: Vec<Value> = (0..5).map(|i| schema_body(i, 1.0)).collect();
    bodies.push(schema_body(99, 0.0));
    let outs = run(&mut e, &bodies);
    for (i, o) in outs.iter().enumerate() {
        let o = &o[0];
        assert_eq!(
            o.finish_reason,
            FinishReason::Stop,
            "body {i}: {:?}",
            o.text
        );
        let v: Value = serde_json::from_str(&o.text)
            .unwrap_or_else(|err| panic!("body {i}: {err}: {:?}", o.text));
        validates(&v).unwrap_or_else(|err| panic!("body {i}: {err}: {}", o.text));
    }
    assert!(e.metrics().grammar_ms > 0.0);
    // Unconstrained, the random model's text is not JSON.
    let mut free = schema_body(0, 1.0);
    free.as_object_mut().unwrap().remove("response_format");
    let out = &run(&mut e, &[free])[0][0];
    assert!(serde_json::from_str::<Value>(&out.text).is_err());
}

#[test]
fn regex_and_drafts_under_grammar_masks() {
    let body = |seed: u64, t: f64| {
        json!({
            "model": "deepinfer",
            "messages": [{"role": "user", "content": "A date please."}],
            "response_format": {"type": "regex", "regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}"},
            "max_tokens": 32, "temperature": t, "seed": seed,
        })
    };
    let bodies: Vec<Value> = vec![body(1, 1.0), body(2, 0.0), schema_body(5, 0.0)];
    let plain = run(&mut engine(EngineConfig::default()), &bodies);
    let spec = run(
        &mut engine(EngineConfig {
            spec_drafts: 3,
            ..EngineConfig::default()
        }),
        &bodies,
    );
    let re = |s: &str| {
        let b = s.as_bytes();
        b.len() == 10
            && b.iter().enumerate().all(|(i, c)| {
                if i == 4 || i == 7 {
                    *c == b'-'
                } else {
                    c.is_ascii_digit()
                }
            })
    };
    for outs in [&plain, &spec] {
        assert!(re(&outs[0][0].text), "{:?}", outs[0][0].text);
        assert!(re(&outs[1][0].text), "{:?}", outs[1][0].text);
        validates(&serde_json::from_str(&outs[2][0].text).unwrap()).unwrap();
    }
    // Greedy with drafts verified under the masks gives the greedy tokens.
    assert_eq!(plain[1][0].token_ids, spec[1][0].token_ids);
    assert_eq!(plain[2][0].token_ids, spec[2][0].token_ids);
}

#[test]
fn strict_tool_calls_come_back_structured() {
    let tools = json!([{
        "type": "function",
        "function": {
            "name": "set_light",
            "description": "Switch a light.",
            "strict": true,
            "parameters": {"type": "object", "properties": {
                "room": {"enum": ["kitchen", "hall"]},
                "on": {"type": "boolean"}
            }, "required": ["room", "on"]}
        }
    }]);
    let bodies: Vec<Value> = (0..2)
        .map(|seed| {
            json!({
                "model": "deepinfer",
                "messages": [{"role": "user", "content": "Turn on the kitchen light."}],
                "tools": tools, "tool_choice": "required",
                "max_tokens": 400, "temperature": 1.0, "seed": seed,
            })
        })
        .collect();
    let outs = run(&mut engine(EngineConfig::default()), &bodies);
    for o in &outs {
        let o = &o[0];
        assert_eq!(o.finish_reason, FinishReason::ToolCalls, "{o:?}");
        assert!(!o.tool_calls.is_empty());
        for c in &o.tool_calls {
            assert_eq!(c.name, "set_light");
            let args: Value = serde_json::from_str(&c.arguments).expect("arguments are JSON");
            let a = args.as_object().unwrap();
            for (k, v) in a {
                match k.as_str() {
                    "room" => assert!(v == "kitchen" || v == "hall", "{v}"),
                    "on" => assert!(v.is_boolean()),
                    other => panic!("unknown argument {other}"),
                }
            }
        }
    }
}

#[test]
fn n_samples_fork_the_prompt_and_equal_independent_requests() {
    let body = |n: u64, seed: u64| {
        json!({
            "model": "deepinfer",
            "messages": [{"role": "user", "content": "Tell me a story about forks and spoons."}],
            "max_tokens": 12, "temperature": 1.0, "seed": seed, "n": n,
        })
    };
    let mut e = engine(EngineConfig::default());
    let forked = run(&mut e, &[body(3, 40)]);
    let m = e.metrics();
    assert_eq!(m.forks, 2, "two children forked from the parent");
    assert_eq!(forked[0].len(), 3);
    for (i, o) in forked[0].iter().enumerate() {
        assert_eq!(o.index, i);
        assert_eq!(o.token_ids.len(), 12);
        assert!(o.usage.prompt_tokens > 0);
        // Choice i is the single request with seed 40 + i.
        let alone = run(
            &mut engine(EngineConfig::default()),
            &[body(1, 40 + i as u64)],
        );
        assert_eq!(alone[0][0].token_ids, o.token_ids, "choice {i}");
        assert_eq!(alone[0][0].text, o.text);
    }
    assert_ne!(forked[0][0].token_ids, forked[0][1].token_ids);
}

#[test]
fn stop_sequences_end_the_output_identically_with_and_without_overlap() {
    let body = |stop: Option<&str>| {
        let mut b = json!({
            "model": "deepinfer",
            "messages": [{"role": "user", "content": "Count from one to twenty, please."}],
            "max_tokens": 24, "temperature": 0.0,
        });
        if let Some(s) = stop {
            b["stop"] = json!([s]);
        }
        b
    };
    let free = run(&mut engine(EngineConfig::default()), &[body(None)])
        .remove(0)
        .remove(0);
    let chars: Vec<char> = free.text.chars().collect();
    assert!(chars.len() >= 8, "text long enough: {:?}", free.text);
    // A stop string from the middle of the free-running text: the output must end just
    // before its first occurrence.
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let at = free.text.find(&stop).expect("stop string occurs");
    let mut outs = Vec::new();
    for overlap in [false, true] {
        let o = run(
            &mut engine(EngineConfig {
                overlap,
                ..EngineConfig::default()
            }),
            &[body(Some(&stop))],
        )
        .remove(0)
        .remove(0);
        assert_eq!(
            o.finish_reason,
            FinishReason::StopSequence,
            "overlap {overlap}"
        );
        assert_eq!(o.text, free.text[..at], "overlap {overlap}");
        assert!(o.token_ids.len() < free.token_ids.len());
        assert_eq!(o.token_ids[..], free.token_ids[..o.token_ids.len()]);
        outs.push(o);
    }
    assert_eq!(outs[0].token_ids, outs[1].token_ids);
    assert_eq!(outs[0].usage, outs[1].usage);
}

/// A tree through a recursive `$ref` (the leaf a boolean, at most two kids, so a model with
/// random weights can finish): the regex form could not compile it.
const TREE: &str = r##"{
  "type": "object",
  "properties": {
    "leaf": {"type": "boolean"},
    "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}
  },
  "required": ["leaf"]
}"##;

/// A validator for exactly [`TREE`]; the depth of the tree (1: no kids).
fn tree_depth(v: &Value) -> Result<usize, String> {
    let o = v.as_object().ok_or("node not an object")?;
    for k in o.keys() {
        if k != "leaf" && k != "kids" {
            return Err(format!("unknown key {k}"));
        }
    }
    o.get("leaf")
        .and_then(Value::as_bool)
        .ok_or("leaf missing or not a boolean")?;
    let Some(kids) = o.get("kids") else {
        return Ok(1);
    };
    let kids = kids.as_array().ok_or("kids not an array")?;
    if kids.len() > 2 {
        return Err(format!("{} kids", kids.len()));
    }
    let mut depth = 0;
    for kid in kids {
        depth = depth.max(tree_depth(kid)?);
    }
    Ok(depth + 1)
}

/// Lexer states of [`compact_object_prefix`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum Json {
    Start,
    Value,
    FirstKeyOrClose,
    Key,
    Colon,
    CommaOrClose,
    FirstValueOrClose,
    Str {
        key: bool,
    },
    Escape {
        key: bool,
    },
    Hex {
        key: bool,
        left: u8,
    },
    /// Number: 0 after `-`, 1 after a leading `0`, 2 in the integer, 3 after `.`, 4 in the
    /// fraction, 5 after `e`, 6 after its sign, 7 in the exponent.
    Num(u8),
    Literal(&'static str),
    Done,
}

/// Whether `text` can be continued into one compact JSON object (RFC 8259, no whitespace
/// outside strings), written here independently of the grammar crate: `Ok(complete)`, or the
/// byte offset of the first character no continuation allows.
fn compact_object_prefix(text: &str) -> Result<bool, usize> {
    let mut stack: Vec<char> = Vec::new();
    let mut state = Json::Start;
    for (at, c) in text.char_indices() {
        loop {
            let after_value = |stack: &Vec<char>| {
                if stack.is_empty() {
                    Json::Done
                } else {
                    Json::CommaOrClose
                }
            };
            let close = |kind: char, stack: &mut Vec<char>| {
                if stack.pop() == Some(kind) {
                    Ok(after_value(stack))
                } else {
                    Err(at)
                }
            };
            state = match (state, c) {
                (Json::Start, '{') | (Json::Value, '{') => {
                    stack.push('{');
                    Json::FirstKeyOrClose
                }
                (Json::Value, '[') => {
                    stack.push('[');
                    Json::FirstValueOrClose
                }
                (Json::Value, '"') => Json::Str { key: false },
                (Json::Value, '-') => Json::Num(0),
                (Json::Value, '0') => Json::Num(1),
                (Json::Value, '1'..='9') => Json::Num(2),
                (Json::Value, 't') => Json::Literal("rue"),
                (Json::Value, 'f') => Json::Literal("alse"),
                (Json::Value, 'n') => Json::Literal("ull"),
                (Json::FirstKeyOrClose, '}') | (Json::CommaOrClose, '}') => close('{', &mut stack)?,
                (Json::FirstKeyOrClose, '"') | (Json::Key, '"') => Json::Str { key: true },
                (Json::Colon, ':') => Json::Value,
                (Json::CommaOrClose, ',') if stack.last() == Some(&'{') => Json::Key,
                (Json::CommaOrClose, ',') => Json::Value,
                (Json::CommaOrClose, ']') | (Json::FirstValueOrClose, ']') => {
                    close('[', &mut stack)?
                }
                (Json::FirstValueOrClose, _) => {
                    state = Json::Value;
                    continue;
                }
                (Json::Str { key }, '"') if key => Json::Colon,
                (Json::Str { .. }, '"') => after_value(&stack),
                (Json::Str { key }, '\\') => Json::Escape { key },
                (Json::Str { .. }, c) if c < ' ' => return Err(at),
                (Json::Str { key }, _) => Json::Str { key },
                (Json::Escape { key }, 'u') => Json::Hex { key, left: 4 },
                (Json::Escape { key }, c) if "\"\\/bfnrt".contains(c) => Json::Str { key },
                (Json::Hex { key, left }, c) if c.is_ascii_hexdigit() => {
                    if left == 1 {
                        Json::Str { key }
                    } else {
                        Json::Hex {
                            key,
                            left: left - 1,
                        }
                    }
                }
                (Json::Num(n), c) => match (n, c) {
                    (0, '0') => Json::Num(1),
                    (0, '1'..='9') | (2, '0'..='9') => Json::Num(2),
                    (1 | 2, '.') => Json::Num(3),
                    (3 | 4, '0'..='9') => Json::Num(4),
                    (1 | 2 | 4, 'e' | 'E') => Json::Num(5),
                    (5, '+' | '-') => Json::Num(6),
                    (5..=7, '0'..='9') => Json::Num(7),
                    (1 | 2 | 4 | 7, _) => {
                        state = after_value(&stack);
                        continue;
                    }
                    _ => return Err(at),
                },
                (Json::Literal(rest), c) if rest.starts_with(c) => match &rest[1..] {
                    "" => after_value(&stack),
                    more => Json::Literal(more),
                },
                _ => return Err(at),
            };
            break;
        }
    }
    Ok(state == Json::Done || (stack.is_empty() && matches!(state, Json::Num(1 | 2 | 4 | 7))))
}

#[test]
fn the_compact_json_prefix_checker_agrees_with_serde() {
    let complete = [
        r#"{}"#,
        r#"{"a":[1,-2.5e+3,{"b":null}],"c":"x \"y\" \u00e9","d":[true,false,[]]}"#,
    ];
    for text in complete {
        assert_eq!(compact_object_prefix(text), Ok(true), "{text}");
        assert!(serde_json::from_str::<Value>(text).is_ok());
        for end in 0..text.len() {
            assert_eq!(
                compact_object_prefix(&text[..end]),
                Ok(false),
                "{}",
                &text[..end]
            );
        }
    }
    for bad in [
        r#"{ }"#,
        r#"{"a": 1}"#,
        r#"[1]"#,
        r#"{"a":01}"#,
        r#"{"a":1}}"#,
        r#"{"a":tru}"#,
        r#"{"a"}"#,
        r#"{"a":[1,]}"#,
    ] {
        assert!(compact_object_prefix(bad).is_err(), "{bad}");
    }
}

fn json_body(seed: u64, format: Value) -> Value {
    json!({
        "model": "deepinfer",
        "messages": [{"role": "user", "content": format!("Some JSON please ({seed}).")}],
        "response_format": format,
        "max_tokens": 40,
        "temperature": 1.0,
        "seed": seed,
    })
}

fn tree_format() -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "tree", "schema": serde_json::from_str::<Value>(TREE).unwrap()}})
}

/// A recursive `$ref` schema (an error before: the engine compiled JSON to one regex) and
/// `json_object` (bounded at 3 levels before) run end to end: every output is compact JSON,
/// complete and valid when the model stopped, a valid prefix when it ran out of tokens.
#[test]
fn recursive_schemas_and_json_object_run_and_stay_valid() {
    let seeds = 0..8u64;
    let mut bodies: Vec<Value> = seeds.clone().map(|s| json_body(s, tree_format())).collect();
    bodies.extend((0..3).map(|s| json_body(s, json!({"type": "json_object"}))));
    let outs = run(&mut engine(EngineConfig::default()), &bodies);
    let mut finished_trees = 0;
    let mut deepest = 0;
    for (i, o) in outs.iter().enumerate() {
        let o = &o[0];
        let tree = i < seeds.end as usize;
        match o.finish_reason {
            FinishReason::Stop => {
                assert_eq!(
                    compact_object_prefix(&o.text),
                    Ok(true),
                    "body {i}: {:?}",
                    o.text
                );
                let v: Value = serde_json::from_str(&o.text)
                    .unwrap_or_else(|err| panic!("body {i}: {err}: {:?}", o.text));
                assert!(v.is_object());
                if tree {
                    let depth =
                        tree_depth(&v).unwrap_or_else(|err| panic!("body {i}: {err}: {}", o.text));
                    deepest = deepest.max(depth);
                    finished_trees += 1;
                }
            }
            FinishReason::Length => {
                assert_eq!(o.token_ids.len(), 40, "body {i}");
                assert_eq!(
                    compact_object_prefix(&o.text),
                    Ok(false),
                    "body {i}: {:?}",
                    o.text
                );
            }
            other => panic!("body {i}: {other:?}: {:?}", o.text),
        }
    }
    assert!(finished_trees > 0, "some tree finishes within 40 tokens");
    assert!(
        deepest >= 2,
        "the recursion is used: a finished tree has kids"
    );
}

/// The frontend's JSON grammars nest without bound and are compact by default (whitespace
/// between tokens only with `compact_json` off); a complete document admits end of sequence
/// alone, and no token that closes it and runs on.
#[test]
fn frontend_json_grammars_nest_deep_and_end_exactly() {
    let tokenizer = PromptTokenizer::deepseek_v4().unwrap();
    let eos = tokenizer
        .special_id(SpecialToken::Eos.deepseek_spelling())
        .unwrap();
    let levels = 12;
    let object = format!("{}1{}", r#"{"a":["#.repeat(levels), "]}".repeat(levels));
    let tree = format!(
        r#"{}{{"leaf":true}}{}"#,
        r#"{"leaf":false,"kids":["#.repeat(levels),
        "]}".repeat(levels)
    );
    assert_eq!(
        tree_depth(&serde_json::from_str(&tree).unwrap()),
        Ok(levels + 1)
    );
    let grammar = |front: &ChatFrontend, format: Value| {
        let prep = front
            .prepare(&json_body(0, format), 0, 7)
            .expect("body converts");
        prep.requests[0].grammar.clone().expect("a grammar")
    };
    let accepts = |g: &GrammarConstraint, text: &str| {
        let mut m = g.matcher();
        let ids = tokenizer.encode_plain(text).unwrap();
        ids.iter().all(|&id| m.accept(id).is_ok()) && m.is_complete()
    };
    let mut spaced = frontend();
    spaced.compact_json = false;
    for (format, text) in [
        (json!({"type": "json_object"}), &object),
        (tree_format(), &tree),
    ] {
        let compact = grammar(&frontend(), format.clone());
        assert!(accepts(&compact, text), "{text}");
        let padded = text.replacen(':', ": ", 1);
        assert!(!accepts(&compact, &padded), "{padded}");
        let loose = grammar(&spaced, format);
        assert!(accepts(&loose, &padded), "{padded}");
        // The end: before the last `}` nothing that closes and runs on; after it only EOS.
        let mut m = compact.matcher();
        for id in tokenizer.encode_plain(&text[..text.len() - 1]).unwrap() {
            m.accept(id).unwrap();
        }
        let mut mask = vec![0u32; compact.vocab_size.div_ceil(32)];
        m.fill_bitmask(&mut mask).unwrap();
        let bit = |mask: &[u32], id: u32| mask[id as usize / 32] >> (id % 32) & 1 == 1;
        assert!(!bit(&mask, eos));
        for token in ["}", "}}", "},", "}]", "}\n"] {
            let ids = tokenizer.encode_plain(token).unwrap();
            assert_eq!(ids.len(), 1, "{token:?} is one token");
            assert_eq!(bit(&mask, ids[0]), token == "}", "{token:?}");
        }
        m.accept(tokenizer.encode_plain("}").unwrap()[0]).unwrap();
        assert!(m.is_complete());
        m.fill_bitmask(&mut mask).unwrap();
        let allowed: Vec<u32> = (0..compact.vocab_size as u32)
            .filter(|&id| bit(&mask, id))
            .collect();
        assert_eq!(allowed, vec![eos]);
    }
}
