//! OpenAI Responses: requests, streamed events and the response object.

use serde_json::{Value, json};

use super::chat::{SamplingRequest, UNSUPPORTED_IMAGE, sampling_options};
use super::output_parts::{OutputParts, Part as OutPart, PartKind};
use super::{
    ConversionOptions, ConvertedRequest, OutputConstraint, ParsingOptions, PromptUsage,
    RequestError, ThinkingStart, resolve_thinking, resolve_top_p, validate_tool_name,
};
use crate::conversation::{
    Content, Conversation, ImageRef, Message, Part, ResponseFormat, ToolCall, ToolChoice,
    ToolDefinition,
};
use crate::parser::{CompletionUsage, Event, FinishReason};

fn field<'a>(value: &'a Value, name: &str) -> Option<&'a Value> {
    value.get(name).filter(|v| !v.is_null())
}

fn str_field<'a>(value: &'a Value, name: &str, path: &str) -> Result<&'a str, RequestError> {
    field(value, name)
        .and_then(Value::as_str)
        .ok_or_else(|| RequestError::Malformed(format!("{path}.{name}: expected a string")))
}

fn content(value: &Value, path: &str, images: bool, reject: bool) -> Result<Content, RequestError> {
    match value {
        Value::String(text) => Ok(Content::text(text.clone())),
        Value::Array(parts) => {
            let mut out = Content::default();
            for (index, part) in parts.iter().enumerate() {
                let path = format!("{path}[{index}]");
                let piece = match field(part, "type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        Part::Text(str_field(part, "text", &path)?.to_owned())
                    }
                    Some("input_image") if !images && reject => {
                        return Err(RequestError::invalid_param(
                            "This model does not accept images.",
                            &path,
                        ));
                    }
                    Some("input_image") if !images => Part::Text(UNSUPPORTED_IMAGE.to_owned()),
                    Some("input_image") => Part::Image(ImageRef {
                        url: str_field(part, "image_url", &path)?.to_owned(),
                        detail: field(part, "detail")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                    }),
                    other => {
                        return Err(RequestError::invalid_param(
                            format!("{path}.type: unsupported content type {other:?}"),
                            &path,
                        ));
                    }
                };
                let separator = if out.parts.is_empty() { "" } else { "\n\n" };
                out.extend_with(separator, Content { parts: vec![piece] });
            }
            Ok(out)
        }
        _ => Err(RequestError::Malformed(format!(
            "{path}: expected a string or a list"
        ))),
    }
}

/// Parse and convert a Responses request body.
pub fn convert_request(
    body: &str,
    options: &ConversionOptions,
) -> Result<ConvertedRequest, RequestError> {
    let request: Value =
        serde_json::from_str(body).map_err(|error| RequestError::Malformed(error.to_string()))?;
    if !request.is_object() {
        return Err(RequestError::Malformed(
            "the request must be a JSON object".into(),
        ));
    }
    let model = str_field(&request, "model", "request")?.to_owned();
    let spec = options.model(&model)?;
    let effort = field(&request, "reasoning")
        .and_then(|r| field(r, "effort"))
        .and_then(Value::as_str);
    let (thinking, effort) = resolve_thinking(options.default_thinking, None, effort)?;
    let (images, reject) = (spec.supports_images, options.reject_unsupported_images);

    let mut messages = Vec::new();
    if let Some(instructions) = field(&request, "instructions").and_then(Value::as_str)
        && !instructions.is_empty()
    {
        messages.push(Message::system(instructions));
    }
    let items = match field(&request, "input") {
        Some(Value::String(text)) => {
            vec![json!({"type": "message", "role": "user", "content": text})]
        }
        Some(Value::Array(items)) => items.clone(),
        _ => {
            return Err(RequestError::Malformed(
                "input: expected a string or a list".into(),
            ));
        }
    };
    if items.is_empty() {
        return Err(RequestError::invalid_param("input: empty", "input"));
    }
    let mut known_calls: Vec<String> = Vec::new();
    let mut pending_reasoning: Option<String> = None;
    for (index, item) in items.iter().enumerate() {
        let path = format!("input[{index}]");
        let kind = field(item, "type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => {
                let role = str_field(item, "role", &path)?;
                let body = field(item, "content")
                    .cloned()
                    .unwrap_or(Value::String(String::new()));
                match role {
                    "user" => messages.push(Message::User {
                        content: content(&body, &path, images, reject)?,
                    }),
                    "system" | "developer" => {
                        let content = content(&body, &path, images, reject)?;
                        if !content.is_empty() {
                            messages.push(Message::System {
                                content,
                                tools: None,
                            });
                        }
                    }
                    "assistant" => {
                        let text = content(&body, &path, false, false)?.flatten("");
                        messages.push(Message::Assistant {
                            content: text,
                            reasoning: pending_reasoning.take(),
                            tool_calls: None,
                            prefix: false,
                        });
                    }
                    other => {
                        return Err(RequestError::invalid_param(
                            format!("{path}.role: unknown role '{other}'"),
                            &path,
                        ));
                    }
                }
            }
            "reasoning" => {
                let mut text = String::new();
                for part in field(item, "content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    text.push_str(part.get("text").and_then(Value::as_str).unwrap_or_default());
                }
                pending_reasoning
                    .get_or_insert_with(String::new)
                    .push_str(&text);
            }
            "function_call" => {
                let call = ToolCall {
                    id: str_field(item, "call_id", &path)?.to_owned(),
                    name: str_field(item, "name", &path)?.to_owned(),
                    arguments: str_field(item, "arguments", &path)?.to_owned(),
                };
                known_calls.push(call.id.clone());
                // Consecutive calls join the preceding assistant turn.
                match messages.last_mut() {
                    Some(Message::Assistant { tool_calls, .. }) => {
                        tool_calls.get_or_insert_with(Vec::new).push(call)
                    }
                    _ => messages.push(Message::Assistant {
                        content: String::new(),
                        reasoning: pending_reasoning.take(),
                        tool_calls: Some(vec![call]),
                        prefix: false,
                    }),
                }
            }
            "function_call_output" => {
                let id = str_field(item, "call_id", &path)?.to_owned();
                if !known_calls.contains(&id) {
                    return Err(RequestError::invalid_param(
                        format!("No tool call found for function call output with call_id {id}."),
                        &path,
                    ));
                }
                let output = field(item, "output")
                    .cloned()
                    .unwrap_or(Value::String(String::new()));
                messages.push(Message::Tool {
                    content: content(&output, &path, images, reject)?,
                    tool_call_id: Some(id),
                });
            }
            other => {
                return Err(RequestError::invalid_param(
                    format!("{path}.type: unsupported item type '{other}'"),
                    &path,
                ));
            }
        }
    }
    for message in &mut messages {
        if let Message::Assistant { reasoning, .. } = message {
            *reasoning = if thinking {
                Some(reasoning.take().unwrap_or_default())
            } else {
                None
            };
        }
    }

    let mut tools = Vec::new();
    for (index, tool) in field(&request, "tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("tools[{index}]");
        if field(tool, "type").and_then(Value::as_str) != Some("function") {
            return Err(RequestError::invalid_param(
                format!("{path}.type: only function tools are supported"),
                &path,
            ));
        }
        let name = str_field(tool, "name", &path)?.to_owned();
        validate_tool_name(&name, &path)?;
        if tools.iter().any(|t: &ToolDefinition| t.name == name) {
            return Err(RequestError::invalid_param(
                "Tool names must be unique.",
                "tools",
            ));
        }
        let definition = ToolDefinition {
            name,
            description: field(tool, "description")
                .and_then(Value::as_str)
                .map(str::to_owned),
            parameters: field(tool, "parameters")
                .cloned()
                .unwrap_or_else(|| json!({})),
            strict: field(tool, "strict").and_then(Value::as_bool),
            defer_loading: false,
        };
        super::check_strict_tool(&definition)?;
        tools.push(definition);
    }
    let tool_choice = match field(&request, "tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(word)) => match word.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(RequestError::invalid_param(
                    format!("tool_choice: unknown value '{other}'"),
                    "tool_choice",
                ));
            }
        },
        Some(named) => {
            let name = field(named, "name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !tools.iter().any(|t| t.name == name) {
                return Err(RequestError::invalid_param(
                    format!("tool_choice: no function named '{name}'"),
                    "tool_choice",
                ));
            }
            tools.retain(|t| t.name == name);
            ToolChoice::Required
        }
    };
    if tool_choice == ToolChoice::None {
        tools.clear();
    }
    if tool_choice == ToolChoice::Required && thinking && !tools.is_empty() {
        return Err(RequestError::invalid(
            "Thinking mode does not support this tool_choice",
        ));
    }
    let format = field(&request, "text").and_then(|t| field(t, "format"));
    let response_format = match format
        .and_then(|f| field(f, "type"))
        .and_then(Value::as_str)
    {
        None | Some("text") => ResponseFormat::Text,
        Some("json_object") => ResponseFormat::JsonObject,
        Some("json_schema") => match format.and_then(|f| field(f, "schema")) {
            Some(schema) if schema.is_object() => ResponseFormat::JsonSchema(schema.clone()),
            _ => {
                return Err(RequestError::invalid_param(
                    "text.format.schema: expected an object",
                    "text.format.schema",
                ));
            }
        },
        Some(other) => {
            return Err(RequestError::invalid_param(
                format!("text.format.type: unsupported '{other}'"),
                "text.format.type",
            ));
        }
    };
    let parse_tool_calls = !tools.is_empty() && tool_choice != ToolChoice::None;
    let number = |name: &str| {
        field(&request, name)
            .and_then(Value::as_f64)
            .map(|v| v as f32)
    };
    let top_logprobs = field(&request, "top_logprobs").and_then(Value::as_u64);
    let sampling = sampling_options(
        options,
        thinking,
        SamplingRequest {
            n: None,
            temperature: number("temperature"),
            top_p: number("top_p"),
            presence_penalty: None,
            frequency_penalty: None,
            logprobs: top_logprobs.map(|_| true),
            top_logprobs: top_logprobs.map(|v| v.min(255) as u8),
            max_tokens: field(&request, "max_output_tokens")
                .and_then(Value::as_u64)
                .map(|v| v.min(u64::from(u32::MAX)) as u32),
            seed: None,
        },
        resolve_top_p(spec.format, number("top_p"), thinking, parse_tool_calls),
    )?;
    let constraint = if parse_tool_calls {
        Some(OutputConstraint::ToolCalls {
            tools: tools.clone(),
            required: tool_choice == ToolChoice::Required,
        })
    } else {
        match &response_format {
            ResponseFormat::JsonObject => Some(OutputConstraint::Json { schema: None }),
            ResponseFormat::JsonSchema(schema) => Some(OutputConstraint::Json {
                schema: Some(schema.clone()),
            }),
            _ => None,
        }
    };
    Ok(ConvertedRequest {
        model,
        format: spec.format,
        conversation: Conversation {
            messages,
            thinking,
            tools,
            tool_choice,
            reasoning_effort: effort,
            response_format: response_format.clone(),
        },
        sampling,
        parsing: ParsingOptions {
            parse_tool_calls,
            starts_in_tool_calls: tool_choice == ToolChoice::Required && parse_tool_calls,
            parse_json_output: response_format == ResponseFormat::JsonObject,
            thinking: thinking.then_some(ThinkingStart::ReasoningStart),
            stop_sequences: Vec::new(),
        },
        constraint,
        stream: field(&request, "stream")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        include_usage: true,
    })
}

/// Turns parser events into Responses stream events and the response object.
#[derive(Debug, Clone)]
pub struct ResponsesStream {
    id: String,
    model: String,
    prompt: PromptUsage,
    parts: OutputParts,
    sequence: u64,
    finish: Option<(FinishReason, CompletionUsage)>,
}

impl ResponsesStream {
    /// A stream for response `id` of `model`.
    pub fn new(id: impl Into<String>, model: impl Into<String>, thinking: bool) -> Self {
        let id = id.into();
        Self {
            parts: OutputParts::new(&id, thinking),
            id,
            model: model.into(),
            prompt: PromptUsage::default(),
            sequence: 0,
            finish: None,
        }
    }

    fn event(&mut self, kind: &'static str, mut data: Value) -> (&'static str, Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        (kind, data)
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self, prompt: PromptUsage) -> Vec<(&'static str, Value)> {
        self.prompt = prompt;
        let response = self.response_json("in_progress");
        vec![
            self.event("response.created", json!({"response": response.clone()})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    fn item_json(&self, index: usize, done: bool) -> Value {
        let status = if done { "completed" } else { "in_progress" };
        match &self.parts.items[index] {
            OutPart::Reasoning(text) => json!({
                "type": "reasoning", "id": format!("rs_{}_{index}", self.id), "status": status,
                "content": [{"type": "reasoning_text", "text": text}], "summary": [],
            }),
            OutPart::Text(text) => json!({
                "type": "message", "id": format!("msg_{}_{index}", self.id), "status": status,
                "role": "assistant",
                "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
            }),
            OutPart::Call {
                id: call_id,
                name,
                arguments,
            } => json!({
                "type": "function_call", "id": format!("fc_{}_{index}", self.id), "status": status,
                "call_id": call_id, "name": name, "arguments": arguments,
            }),
        }
    }

    fn close(&mut self, out: &mut Vec<(&'static str, Value)>) {
        if self.parts.open {
            let index = self.parts.last_index();
            let item = self.item_json(index, true);
            let done = self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            out.push(done);
            self.parts.open = false;
        }
    }

    fn open(&mut self, part: OutPart, out: &mut Vec<(&'static str, Value)>) {
        self.close(out);
        self.parts.items.push(part);
        self.parts.open = true;
        let index = self.parts.last_index();
        let item = self.item_json(index, false);
        let added = self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        out.push(added);
    }

    /// Events for one parser event.
    pub fn on_event(&mut self, event: &Event) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        match event {
            Event::Reasoning(text) => {
                if !self.parts.continues(PartKind::Reasoning) {
                    self.open(OutPart::Reasoning(String::new()), &mut out);
                }
                self.parts.append(PartKind::Reasoning, text);
                let index = self.parts.last_index();
                let delta = self.event(
                    "response.reasoning_text.delta",
                    json!({"output_index": index, "content_index": 0, "delta": text}),
                );
                out.push(delta);
            }
            Event::Content(text) => {
                if !self.parts.continues(PartKind::Text) {
                    self.open(OutPart::Text(String::new()), &mut out);
                }
                self.parts.append(PartKind::Text, text);
                let index = self.parts.last_index();
                let delta = self.event("response.output_text.delta", json!({"output_index": index, "content_index": 0, "delta": text, "logprobs": []}));
                out.push(delta);
            }
            Event::ToolCallStart { index, name } => {
                let id = self.parts.call_id(*index);
                let call = OutPart::Call {
                    id,
                    name: name.clone(),
                    arguments: String::new(),
                };
                self.open(call, &mut out);
            }
            Event::ToolCallArgs { delta, .. } => {
                self.parts.append(PartKind::Call, delta);
                let index = self.parts.last_index();
                let delta = self.event(
                    "response.function_call_arguments.delta",
                    json!({"output_index": index, "delta": delta}),
                );
                out.push(delta);
            }
            Event::ToolCallEnd { .. } => self.close(&mut out),
            Event::Finish { reason, usage, .. } => {
                self.close(&mut out);
                self.finish = Some((*reason, *usage));
                let (kind, status) = match reason {
                    FinishReason::Length | FinishReason::ContentFilter => {
                        ("response.incomplete", "incomplete")
                    }
                    _ => ("response.completed", "completed"),
                };
                let response = self.response_json(status);
                let done = self.event(kind, json!({"response": response}));
                out.push(done);
            }
        }
        out
    }

    /// The response object with `status`.
    pub fn response_json(&self, status: &str) -> Value {
        let output: Vec<Value> = (0..self.parts.items.len())
            .map(|i| self.item_json(i, true))
            .collect();
        let usage = self.finish.map(|(_, usage)| {
            json!({
                "input_tokens": self.prompt.prompt_tokens,
                "input_tokens_details": {"cached_tokens": self.prompt.cached_tokens},
                "output_tokens": usage.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens.unwrap_or(0)},
                "total_tokens": self.prompt.prompt_tokens + usage.completion_tokens,
            })
        });
        let incomplete = match self.finish {
            Some((FinishReason::Length, _)) => json!({"reason": "max_output_tokens"}),
            Some((FinishReason::ContentFilter, _)) => json!({"reason": "content_filter"}),
            _ => Value::Null,
        };
        json!({
            "id": self.id, "object": "response", "status": status, "model": self.model,
            "output": output, "incomplete_details": incomplete, "usage": usage,
        })
    }

    /// The complete response object.
    pub fn response(&self) -> Value {
        let status = match self.finish {
            Some((FinishReason::Length | FinishReason::ContentFilter, _)) => "incomplete",
            _ => "completed",
        };
        self.response_json(status)
    }
}
