//! Conformance with the golden-dev renderings of `deepseek-recipe` 0.2.0:
//! request conversion, prompt text, special-token byte ranges, token ids
//! with the V4 vocabulary, and error bodies.

mod common;

use deepinfer_recipe::conversation::{Message, Part, ReasoningEffort, ResponseFormat, ToolChoice};
use deepinfer_recipe::protocol::chat::ChatRequest;
use deepinfer_recipe::protocol::{ConversionOptions, Protocol, ThinkingStart};
use deepinfer_recipe::{Piece, PromptFormat, RenderedPrompt, Renderer};
use serde_json::{Value, json};

fn convert(request: &Value) -> deepinfer_recipe::protocol::ConvertedRequest {
    ChatRequest::from_json(&request.to_string())
        .and_then(|r| r.convert(&ConversionOptions::default()))
        .expect("golden request converts")
}

fn check_render(id: &str, rendered: &RenderedPrompt, golden: &Value) {
    assert_eq!(
        rendered.text,
        golden["prompt"].as_str().unwrap(),
        "{id}: prompt"
    );
    let ranges: Vec<Value> = rendered
        .special_ranges
        .iter()
        .map(|r| json!([r.start, r.end]))
        .collect();
    assert_eq!(
        Value::Array(ranges),
        golden["special_ranges_bytes"],
        "{id}: ranges"
    );
    assert_eq!(
        json!(rendered.special_tokens()),
        golden["special_tokens"],
        "{id}: special tokens"
    );
    assert_eq!(
        rendered.images.len() as u64,
        golden["image_source_count"].as_u64().unwrap(),
        "{id}: images"
    );
    // Token ids with the V4 vocabulary; `<｜System｜>` has none (null).
    let tokenizer = common::tokenizer();
    let mut ids = Vec::new();
    for piece in rendered.pieces() {
        match piece {
            Piece::Special(spelling) => ids.push(json!(tokenizer.special_id(spelling))),
            Piece::Plain(text) => ids.extend(
                tokenizer
                    .encode_plain(text)
                    .unwrap()
                    .into_iter()
                    .map(|id| json!(id)),
            ),
        }
    }
    assert_eq!(
        Value::Array(ids),
        golden["token_ids_v4_vocab"],
        "{id}: token ids"
    );
    // Whole-prompt encoding (parallel and sequential) when every special has an id.
    match tokenizer.encode(rendered) {
        Ok(parallel) => {
            assert_eq!(
                json!(parallel),
                golden["token_ids_v4_vocab"],
                "{id}: encode"
            );
            assert_eq!(parallel, tokenizer.encode_sequential(rendered).unwrap());
        }
        Err(_) => assert!(
            golden["token_ids_v4_vocab"]
                .as_array()
                .unwrap()
                .contains(&Value::Null),
            "{id}: encode failed although every special token has an id"
        ),
    }
}

#[test]
fn renders_match_golden_dev() {
    let mut rendered_count = 0;
    for case in common::golden_requests() {
        let id = case["id"].as_str().unwrap();
        if !case["error"].is_null() {
            continue;
        }
        let converted = convert(&case["request"]);
        let golden = &case["render"];
        let expected_format = match golden["encoding"].as_str().unwrap() {
            "v4" => PromptFormat::V4,
            _ => PromptFormat::V41,
        };
        assert_eq!(converted.format, expected_format, "{id}: format");
        let rendered = Renderer::new(converted.format).render(&converted.conversation);
        check_render(id, &rendered, golden);
        rendered_count += 1;
        if let Some(v4) = case.get("render_v4_same_conversation") {
            let rendered = Renderer::new(PromptFormat::V4).render(&converted.conversation);
            check_render(id, &rendered, v4);
            rendered_count += 1;
        }
    }
    assert_eq!(rendered_count, 41 + 37, "renderings checked");
}

fn role(message: &Message) -> &'static str {
    match message {
        Message::System { .. } => "system",
        Message::User { .. } => "user",
        Message::Assistant { .. } => "assistant",
        Message::Tool { .. } => "tool",
        Message::LatestReminder { .. } => "latest_reminder",
    }
}

#[test]
fn conversions_match_golden_dev() {
    for case in common::golden_requests() {
        let id = case["id"].as_str().unwrap();
        if !case["error"].is_null() {
            continue;
        }
        let converted = convert(&case["request"]);
        let golden = &case["converted"];
        let conversation = &converted.conversation;
        let gc = &golden["conversation"];
        assert_eq!(json!(conversation.thinking), gc["thinking_mode"], "{id}");
        let effort = conversation.reasoning_effort.map(|e| match e {
            ReasoningEffort::Low => "low",
            ReasoningEffort::High => "high",
            ReasoningEffort::Xhigh => "xhigh",
            ReasoningEffort::Max => "max",
        });
        assert_eq!(json!(effort), gc["reasoning_effort"], "{id}");
        let choice = match conversation.tool_choice {
            ToolChoice::Auto => "auto",
            ToolChoice::None => "none",
            ToolChoice::Required => "required",
        };
        assert_eq!(json!(choice), gc["tool_choice"], "{id}");
        let names: Vec<&str> = conversation.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(json!(names), gc["tool_names"], "{id}");
        let format = match &conversation.response_format {
            ResponseFormat::Text => "text",
            ResponseFormat::JsonObject => "json_object",
            ResponseFormat::JsonSchema(_) => "json_schema",
            ResponseFormat::Regex(_) => "regex",
        };
        assert_eq!(json!(format), gc["response_format"], "{id}");
        let messages = gc["messages"].as_array().unwrap();
        assert_eq!(conversation.messages.len(), messages.len(), "{id}");
        for (message, golden) in conversation.messages.iter().zip(messages) {
            assert_eq!(json!(role(message)), golden["role"], "{id}");
            let image = "<｜image｜>";
            let (content, images) = match message {
                Message::System { content, .. }
                | Message::User { content }
                | Message::Tool { content, .. } => (
                    content.flatten(image),
                    content
                        .parts
                        .iter()
                        .filter(|p| matches!(p, Part::Image(_)))
                        .count(),
                ),
                Message::Assistant { content, .. } | Message::LatestReminder { content } => {
                    (content.clone(), 0)
                }
            };
            assert_eq!(json!(content), golden["content"], "{id}");
            assert_eq!(json!(images), golden["image_sources"], "{id}");
            if let Message::Assistant {
                reasoning,
                tool_calls,
                prefix,
                ..
            } = message
            {
                assert_eq!(json!(reasoning), golden["reasoning_content"], "{id}");
                assert_eq!(json!(prefix), golden["prefix"], "{id}");
                let calls = tool_calls.as_ref().map(|calls| {
                    calls
                        .iter()
                        .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
                        .collect::<Vec<_>>()
                });
                assert_eq!(json!(calls), golden["tool_calls"], "{id}");
            }
            if let Message::Tool { tool_call_id, .. } = message {
                assert_eq!(json!(tool_call_id), golden["tool_call_id"], "{id}");
            }
        }
        let inference = &golden["inference_options"];
        let sampling = &converted.sampling;
        assert_eq!(json!(sampling.max_tokens), inference["max_tokens"], "{id}");
        assert!(
            (f64::from(sampling.temperature) - inference["temperature"].as_f64().unwrap()).abs()
                < 1e-6,
            "{id}: temperature"
        );
        assert!(
            (f64::from(sampling.top_p) - inference["top_p"].as_f64().unwrap()).abs() < 1e-6,
            "{id}: top_p"
        );
        assert_eq!(json!(sampling.logprobs), inference["logprobs"], "{id}");
        assert_eq!(
            json!(sampling.top_logprobs),
            inference["top_logprobs"],
            "{id}"
        );
        assert_eq!(json!(sampling.seed), inference["seed"], "{id}");
        let kind = converted.constraint.as_ref().map(|c| match c {
            deepinfer_recipe::protocol::OutputConstraint::Json { .. } => "json",
            deepinfer_recipe::protocol::OutputConstraint::Regex(_) => "regex",
            deepinfer_recipe::protocol::OutputConstraint::ToolCalls {
                required: false, ..
            } => "tool_call",
            deepinfer_recipe::protocol::OutputConstraint::ToolCalls { required: true, .. } => {
                "tool_call_required"
            }
        });
        assert_eq!(
            json!(kind),
            inference["output_constraint"]
                .get("kind")
                .cloned()
                .unwrap_or(Value::Null),
            "{id}: constraint kind"
        );
        check_parsing(id, &converted.parsing, &golden["parsing_options"]);
        assert_eq!(json!(converted.stream), golden["stream"], "{id}");
    }
}

fn check_parsing(id: &str, parsing: &deepinfer_recipe::protocol::ParsingOptions, golden: &Value) {
    assert_eq!(
        json!(parsing.parse_tool_calls),
        golden["parse_tool_calls"],
        "{id}"
    );
    assert_eq!(
        json!(parsing.starts_in_tool_calls),
        golden["starts_in_tool_calls"],
        "{id}"
    );
    assert_eq!(
        json!(parsing.parse_json_output),
        golden["parse_json_output"],
        "{id}"
    );
    let stage = parsing.thinking.map(|stage| match stage {
        ThinkingStart::ReasoningStart => "ReasoningStart",
        ThinkingStart::ReasoningContinuation => "ReasoningContinuation",
        ThinkingStart::ContentContinuation => "ContentContinuation",
    });
    assert_eq!(json!(stage), golden["thinking_initial_stage"], "{id}");
    assert_eq!(
        json!(parsing.stop_sequences),
        golden["stop_sequences"],
        "{id}"
    );
}

#[test]
fn errors_match_golden_dev_bodies() {
    let mut errors = 0;
    for case in common::golden_requests() {
        let id = case["id"].as_str().unwrap();
        if case["error"].is_null() {
            continue;
        }
        let error = ChatRequest::from_json(&case["request"].to_string())
            .and_then(|r| r.convert(&ConversionOptions::default()))
            .expect_err(id);
        assert_eq!(
            u64::from(error.status()),
            case["error"]["status_code"].as_u64().unwrap()
        );
        let mut body = error.to_json(Protocol::ChatCompletions);
        // The reference reports no parameter; ours may name one.
        body["error"]["param"] = Value::Null;
        assert_eq!(body, case["error"]["body"], "{id}");
        errors += 1;
    }
    assert_eq!(errors, 4);
}
