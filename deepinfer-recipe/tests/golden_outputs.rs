//! Conformance with the golden-dev output parses of `deepseek-recipe` 0.2.0:
//! every token sequence parses to the same Chat Completions chunks and
//! complete response (tool-call ids normalised as in the fixture).

mod common;

use deepinfer_recipe::protocol::chat::ChatRequest;
use deepinfer_recipe::protocol::chat_response::{ChatChoice, complete_response};
use deepinfer_recipe::protocol::{ConversionOptions, PromptUsage, ThinkingStart};
use deepinfer_recipe::{BackendFinish, Event, StreamParser};
use serde_json::Value;

/// `call_NN_[ET_]<random>` → `call_NN_[ET_]<RANDOM>`, as the fixture stores ids.
fn normalise_ids(value: &mut Value) {
    match value {
        Value::String(text) if text.starts_with("call_") && text.len() > 8 => {
            let (head, rest) = text.split_at(8);
            let marker = if rest.starts_with("ET_") { "ET_" } else { "" };
            *text = format!("{head}{marker}<RANDOM>");
        }
        Value::Array(items) => items.iter_mut().for_each(normalise_ids),
        Value::Object(map) => map.values_mut().for_each(normalise_ids),
        _ => {}
    }
}

fn run_chat(case: &Value) -> (Vec<Value>, Value) {
    let chat = &case["results"]["chat"];
    let converted = ChatRequest::from_json(&chat["request"].to_string())
        .and_then(|r| r.convert(&ConversionOptions::default()))
        .expect("request converts");
    let parsing = &converted.parsing;
    let mut parser = StreamParser::new(common::tokenizer(), parsing);
    let starts_in_reasoning = matches!(
        parsing.thinking,
        Some(ThinkingStart::ReasoningStart | ThinkingStart::ReasoningContinuation)
    ) && !parsing.starts_in_tool_calls;
    let mut choice = ChatChoice::new(
        "chatcmpl-golden",
        converted.model.clone(),
        0,
        0,
        parsing.thinking.is_some(),
        starts_in_reasoning,
        !converted.stream || converted.include_usage,
    );
    let prompt = PromptUsage {
        prompt_tokens: 17,
        cached_tokens: 5,
    };
    let mut stream = vec![choice.start(prompt)];
    let mut events: Vec<Event> = Vec::new();
    let input = &case["input"];
    if input["kind"] == "text_chunks" {
        let per_chunk = input["token_count_per_chunk"].as_u64().unwrap() as u32;
        for chunk in input["text_chunks"].as_array().unwrap() {
            events.extend(parser.push_text(chunk.as_str().unwrap(), per_chunk));
            if parser.is_stopped() {
                break;
            }
        }
    } else {
        for chunk in input["chunks"].as_array().unwrap() {
            let ids: Vec<u32> = chunk
                .as_array()
                .unwrap()
                .iter()
                .map(|id| id.as_u64().unwrap() as u32)
                .collect();
            events.extend(parser.push_tokens(&ids));
            if parser.is_stopped() {
                break;
            }
        }
    }
    let backend = match case["backend_finish_reason"].as_str() {
        Some("stop") => Some(BackendFinish::Stop),
        Some("length") => Some(BackendFinish::Length),
        Some("content_filter") => Some(BackendFinish::ContentFilter),
        _ => None,
    };
    events.extend(parser.finish(backend));
    for event in &events {
        stream.extend(choice.on_event(event, None));
    }
    let mut response = complete_response(std::slice::from_ref(&choice), prompt);
    response["id"] = Value::from("chatcmpl-golden");
    (stream, response)
}

#[test]
fn chat_streams_and_responses_match_golden_dev() {
    let mut checked = 0;
    for case in common::golden_outputs() {
        let id = case["id"].as_str().unwrap();
        let (mut stream, mut response) = run_chat(&case);
        stream.iter_mut().for_each(normalise_ids);
        normalise_ids(&mut response);
        let golden = &case["results"]["chat"];
        let golden_stream: Vec<Value> = golden["stream"]
            .as_array()
            .unwrap()
            .iter()
            .map(|frame| frame["data"].clone())
            .collect();
        assert_eq!(response, golden["response"], "{id}: complete response");
        assert_eq!(
            stream.len(),
            golden_stream.len(),
            "{id}: chunk count\n{stream:#?}"
        );
        for (index, (ours, theirs)) in stream.iter().zip(&golden_stream).enumerate() {
            assert_eq!(ours, theirs, "{id}: chunk {index}");
        }
        checked += 1;
    }
    assert_eq!(checked, 25);
}
