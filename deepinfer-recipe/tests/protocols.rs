//! Protocols beyond the golden chat streams: Responses and Anthropic
//! Messages against the golden complete responses, n > 1, log
//! probabilities, stream/complete consistency, and bad input.

mod common;

use deepinfer_recipe::protocol::anthropic::{MessagesRequest, MessagesStream};
use deepinfer_recipe::protocol::chat::ChatRequest;
use deepinfer_recipe::protocol::chat_response::{ChatChoice, TokenLogprob, complete_response};
use deepinfer_recipe::protocol::responses::{ResponsesStream, convert_request};
use deepinfer_recipe::protocol::{ConversionOptions, PromptUsage, Protocol, RequestError};
use deepinfer_recipe::{BackendFinish, Event, StreamParser};
use serde_json::{Value, json};

fn events_for(case: &Value, parsing: &deepinfer_recipe::protocol::ParsingOptions) -> Vec<Event> {
    let mut parser = StreamParser::new(common::tokenizer(), parsing);
    let mut events = Vec::new();
    for chunk in case["input"]["chunks"].as_array().unwrap() {
        let ids: Vec<u32> = chunk
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        events.extend(parser.push_tokens(&ids));
    }
    events.extend(parser.finish(Some(BackendFinish::Stop)));
    events
}

const PROMPT: PromptUsage = PromptUsage {
    prompt_tokens: 17,
    cached_tokens: 5,
};

#[test]
fn anthropic_messages_match_golden_content() {
    for case in common::golden_outputs() {
        let Some(golden) = case["results"].get("messages") else {
            continue;
        };
        let converted = MessagesRequest::from_json(&golden["request"].to_string())
            .and_then(|r| r.convert(&ConversionOptions::default()))
            .unwrap();
        let events = events_for(&case, &converted.parsing);
        let mut stream = MessagesStream::new(
            "msg_golden",
            converted.model.clone(),
            converted.conversation.thinking,
        );
        let mut frames = stream.start(PROMPT);
        for event in &events {
            frames.extend(stream.on_event(event));
        }
        let ours = stream.message();
        let theirs = &golden["response"];
        assert_eq!(ours["stop_reason"], theirs["stop_reason"]);
        assert_eq!(ours["usage"], theirs["usage"]);
        let strip = |content: &Value| -> Vec<Value> {
            content
                .as_array()
                .unwrap()
                .iter()
                .map(|block| {
                    let mut block = block.clone();
                    if block["type"] == "tool_use" {
                        block["id"] = Value::Null;
                    }
                    block
                })
                .collect()
        };
        assert_eq!(
            strip(&ours["content"]),
            strip(&theirs["content"]),
            "{}",
            case["id"]
        );
        // Streamed deltas concatenate to the complete message.
        let names: Vec<&str> = frames.iter().map(|(name, _)| *name).collect();
        assert_eq!(names.first(), Some(&"message_start"));
        assert_eq!(names.last(), Some(&"message_stop"));
        let text: String = frames
            .iter()
            .filter_map(|(_, data)| data["delta"]["text"].as_str())
            .collect();
        let full: String = ours["content"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect();
        assert_eq!(text, full);
    }
}

#[test]
fn responses_match_golden_output_items() {
    for case in common::golden_outputs() {
        let Some(golden) = case["results"].get("responses") else {
            continue;
        };
        let converted = convert_request(
            &golden["request"].to_string(),
            &ConversionOptions::default(),
        )
        .unwrap();
        let events = events_for(&case, &converted.parsing);
        let mut stream = ResponsesStream::new(
            "resp_golden",
            converted.model.clone(),
            converted.conversation.thinking,
        );
        let mut frames = stream.start(PROMPT);
        for event in &events {
            frames.extend(stream.on_event(event));
        }
        let ours = stream.response();
        let theirs = &golden["response"];
        assert_eq!(ours["status"], theirs["status"]);
        assert_eq!(ours["usage"], theirs["usage"], "{}", case["id"]);
        let summary = |output: &Value| -> Vec<Value> {
            output
                .as_array()
                .unwrap()
                .iter()
                .map(|item| match item["type"].as_str() {
                    Some("reasoning") => json!(["reasoning", item["content"][0]["text"]]),
                    Some("message") => json!(["message", item["content"][0]["text"]]),
                    Some("function_call") => json!(["call", item["name"], item["arguments"]]),
                    other => json!([other]),
                })
                .collect()
        };
        assert_eq!(
            summary(&ours["output"]),
            summary(&theirs["output"]),
            "{}",
            case["id"]
        );
        assert_eq!(frames.last().unwrap().0, "response.completed");
    }
}

#[test]
fn n_choices_and_logprobs() {
    let request = json!({
        "model": "DeepSeek-V4.1-Flash", "n": 2, "logprobs": true, "top_logprobs": 2,
        "thinking": {"type": "disabled"},
        "messages": [{"role": "user", "content": "hi"}],
    });
    let converted = ChatRequest::from_json(&request.to_string())
        .and_then(|r| r.convert(&ConversionOptions::default()))
        .unwrap();
    assert_eq!(converted.sampling.n, 2);
    assert_eq!(converted.sampling.top_logprobs, Some(2));
    let tokenizer = common::tokenizer();
    let mut choices = Vec::new();
    for (index, answer) in ["Hello there", "Hi!"].iter().enumerate() {
        let mut choice = ChatChoice::new("id", "m", 0, index as u32, false, false, false);
        choice.start(PROMPT);
        let mut parser = StreamParser::new(tokenizer.clone(), &converted.parsing);
        let ids = tokenizer.encode_plain(answer).unwrap();
        for &id in &ids {
            let logprob = TokenLogprob {
                token: tokenizer.decode(&[id]).unwrap(),
                logprob: -0.5,
                top: vec![("x".into(), -1.0)],
            };
            for event in parser.push_tokens(&[id]) {
                let chunks = choice.on_event(&event, Some(std::slice::from_ref(&logprob)));
                assert_eq!(chunks[0]["choices"][0]["index"], json!(index));
                assert_eq!(
                    chunks[0]["choices"][0]["logprobs"]["content"][0]["logprob"],
                    json!(-0.5)
                );
            }
        }
        for event in parser.finish(Some(BackendFinish::Stop)) {
            choice.on_event(&event, None);
        }
        choices.push(choice);
    }
    let response = complete_response(&choices, PROMPT);
    assert_eq!(response["choices"][1]["message"]["content"], "Hi!");
    assert_eq!(
        response["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(response["usage"]["completion_tokens"], json!(2 + 2));
}

fn chat_error(body: &str) -> RequestError {
    ChatRequest::from_json(body)
        .and_then(|r| r.convert(&ConversionOptions::default()))
        .unwrap_err()
}

#[test]
fn bad_input_is_a_typed_error_in_each_shape() {
    assert!(matches!(
        chat_error("{not json"),
        RequestError::Malformed(_)
    ));
    let unknown_role =
        r#"{"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "wizard", "content": "x"}]}"#;
    assert!(matches!(
        chat_error(unknown_role),
        RequestError::Malformed(_)
    ));
    let orphan = r#"{"model": "DeepSeek-V4.1-Flash", "messages": [{"role": "tool", "tool_call_id": "a", "content": "x"}]}"#;
    assert!(matches!(chat_error(orphan), RequestError::Invalid { .. }));
    let n_zero = r#"{"model": "DeepSeek-V4.1-Flash", "n": 0, "messages": [{"role": "user", "content": "x"}]}"#;
    assert!(matches!(chat_error(n_zero), RequestError::Invalid { .. }));
    let top_without = r#"{"model": "DeepSeek-V4.1-Flash", "top_logprobs": 3, "messages": [{"role": "user", "content": "x"}]}"#;
    assert!(matches!(
        chat_error(top_without),
        RequestError::Invalid { .. }
    ));
    let bad_grammar = r#"{"model": "DeepSeek-V4.1-Flash", "response_format": {"type": "grammar", "grammar": "root ::= item"}, "messages": [{"role": "user", "content": "x"}]}"#;
    let error = chat_error(bad_grammar);
    assert!(matches!(error, RequestError::Invalid { .. }));
    assert!(error.to_string().contains("`item` is used but not defined"));
    let grammar = r#"{"model": "DeepSeek-V4.1-Flash", "response_format": {"type": "grammar", "grammar": "root ::= [0-9]+"}, "messages": [{"role": "user", "content": "x"}]}"#;
    let converted = ChatRequest::from_json(grammar)
        .and_then(|r| r.convert(&ConversionOptions::default()))
        .unwrap();
    assert!(matches!(
        converted.constraint,
        Some(deepinfer_recipe::protocol::OutputConstraint::Regex(_))
    ));
    let open_strict = r#"{"model": "DeepSeek-V4.1-Flash", "tools": [{"type": "function", "function": {"name": "f", "strict": true, "parameters": {"type": "object", "properties": {"n": {"type": "number", "minimum": 1}}}}}], "messages": [{"role": "user", "content": "x"}]}"#;
    let error = chat_error(open_strict);
    assert!(matches!(error, RequestError::Invalid { .. }));
    assert!(error.to_string().contains("function 'f'"));
    assert!(error.to_string().contains("`minimum`"));
    let loose = open_strict.replace(r#""strict": true"#, r#""strict": false"#);
    assert!(
        ChatRequest::from_json(&loose)
            .and_then(|r| r.convert(&ConversionOptions::default()))
            .is_ok()
    );
    let image = r#"{"model": "DeepSeek-V4-Pro", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}"#;
    let strict = ConversionOptions {
        reject_unsupported_images: true,
        ..ConversionOptions::default()
    };
    let error = ChatRequest::from_json(image)
        .and_then(|r| r.convert(&strict))
        .unwrap_err();
    assert!(error.to_string().contains("images"));
    // The default replaces the image with text, as the reference does.
    assert!(
        ChatRequest::from_json(image)
            .and_then(|r| r.convert(&ConversionOptions::default()))
            .is_ok()
    );

    let anthropic = error.to_json(Protocol::AnthropicMessages);
    assert_eq!(anthropic["type"], "error");
    assert_eq!(anthropic["error"]["type"], "invalid_request_error");
    let openai = error.to_json(Protocol::Responses);
    assert_eq!(openai["error"]["type"], "invalid_request_error");

    let orphan_result = r#"{"model": "DeepSeek-V4.1-Flash", "max_tokens": 10, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]}"#;
    assert!(
        MessagesRequest::from_json(orphan_result)
            .and_then(|r| r.convert(&ConversionOptions::default()))
            .is_err()
    );
    let no_max = r#"{"model": "DeepSeek-V4.1-Flash", "messages": []}"#;
    assert!(matches!(
        MessagesRequest::from_json(no_max),
        Err(RequestError::Malformed(_))
    ));
    let orphan_output = r#"{"model": "DeepSeek-V4.1-Flash", "input": [{"type": "function_call_output", "call_id": "x", "output": "y"}]}"#;
    assert!(convert_request(orphan_output, &ConversionOptions::default()).is_err());
    assert!(matches!(
        convert_request("[]", &ConversionOptions::default()),
        Err(RequestError::Malformed(_))
    ));
}

#[test]
fn anthropic_and_responses_requests_convert() {
    let anthropic = json!({
        "model": "DeepSeek-V4.1-Flash", "max_tokens": 100, "system": "Be brief.",
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "call it"},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}, {"type": "text", "text": "thanks"}]},
        ],
    });
    let converted = MessagesRequest::from_json(&anthropic.to_string())
        .and_then(|r| r.convert(&ConversionOptions::default()))
        .unwrap();
    assert_eq!(converted.conversation.messages.len(), 5);
    assert!(converted.parsing.parse_tool_calls);

    let responses = json!({
        "model": "DeepSeek-V4-Pro", "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        "text": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
    });
    let converted = convert_request(&responses.to_string(), &ConversionOptions::default()).unwrap();
    assert_eq!(converted.conversation.messages.len(), 4);
}
