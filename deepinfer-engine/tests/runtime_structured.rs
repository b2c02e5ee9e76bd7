//! Structured outputs end to end on the embedded default model (random weights, the real
//! DeepSeek vocabulary): every output under a JSON schema parses and validates, a regex
//! constrains the text, strict tool calls come back structured,
//! and the constraint holds with DSpark drafts verified under grammar masks; `n > 1` samples
//! share the prompt through forks and equal independent requests.
#![cfg(feature = "runtime")]

use deepinfer_engine::Model;
use deepinfer_engine::runtime::{
    ChatFrontend, DEFAULT_SEED, Engine, EngineConfig, FinishReason, Output, materialize_default,
};
use deepinfer_kernels::CpuBackend;
use deepinfer_recipe::PromptTokenizer;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::OnceLock;

fn model_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("runtime-structured-model");
        materialize_default(&dir, DEFAULT_SEED).expect("default model created")
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
