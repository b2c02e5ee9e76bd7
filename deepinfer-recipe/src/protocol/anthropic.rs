//! Anthropic Messages: requests, streamed events and complete responses.

use serde::Deserialize;
use serde_json::{Value, json};

use super::chat::{SamplingRequest, sampling_options};
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

/// A Messages request body.
#[derive(Debug, Clone, Deserialize)]
pub struct MessagesRequest {
    /// Model name.
    pub model: String,
    /// Output token limit (required by the protocol).
    pub max_tokens: u32,
    /// Conversation turns.
    pub messages: Vec<AnthropicMessage>,
    /// System prompt: a string or text blocks.
    #[serde(default)]
    pub system: Option<AnthropicContent>,
    /// Tools.
    #[serde(default)]
    pub tools: Option<Vec<AnthropicTool>>,
    /// `{"type": "auto" | "any" | "tool" | "none", "name"?}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// `{"type": "enabled" | "disabled"}`.
    #[serde(default)]
    pub thinking: Option<Value>,
    /// Stop sequences.
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    /// Stream the response.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Temperature (0..=1 in this protocol).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus mass.
    #[serde(default)]
    pub top_p: Option<f32>,
}

/// One turn.
#[derive(Debug, Clone, Deserialize)]
pub struct AnthropicMessage {
    /// `user` or `assistant`.
    pub role: AnthropicRole,
    /// Content.
    pub content: AnthropicContent,
}

/// Roles of this protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnthropicRole {
    /// The user (and tool results).
    User,
    /// The model.
    Assistant,
}

/// A string or blocks.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum AnthropicContent {
    /// Text.
    Text(String),
    /// Blocks.
    Blocks(Vec<AnthropicBlock>),
}

/// Content blocks.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AnthropicBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// An image.
    Image {
        /// `{"type": "base64", "media_type", "data"}` or `{"type": "url", "url"}`.
        source: Value,
    },
    /// A tool call (assistant).
    ToolUse {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
        /// Arguments object.
        input: Value,
    },
    /// A tool result (user).
    ToolResult {
        /// The call answered.
        tool_use_id: String,
        /// Result content.
        #[serde(default)]
        content: Option<AnthropicContent>,
    },
    /// Reasoning (assistant).
    Thinking {
        /// The reasoning text.
        thinking: String,
    },
}

/// A tool definition.
#[derive(Debug, Clone, Deserialize)]
pub struct AnthropicTool {
    /// Name.
    pub name: String,
    /// Description.
    #[serde(default)]
    pub description: Option<String>,
    /// Arguments schema.
    pub input_schema: Value,
}

fn image_ref(source: &Value) -> ImageRef {
    let url = match source.get("type").and_then(Value::as_str) {
        Some("base64") => format!(
            "data:{};base64,{}",
            source["media_type"].as_str().unwrap_or("image/png"),
            source["data"].as_str().unwrap_or_default()
        ),
        _ => source["url"].as_str().unwrap_or_default().to_owned(),
    };
    ImageRef { url, detail: None }
}

fn blocks_content(
    blocks: &[AnthropicBlock],
    supports_images: bool,
    reject_images: bool,
) -> Result<Content, RequestError> {
    let mut content = Content::default();
    for block in blocks {
        let part = match block {
            AnthropicBlock::Text { text } => Part::Text(text.clone()),
            AnthropicBlock::Image { .. } if !supports_images && reject_images => {
                return Err(RequestError::invalid("This model does not accept images."));
            }
            AnthropicBlock::Image { .. } if !supports_images => {
                Part::Text(super::chat::UNSUPPORTED_IMAGE.to_owned())
            }
            AnthropicBlock::Image { source } => Part::Image(image_ref(source)),
            _ => continue,
        };
        let separator = if content.parts.is_empty() { "" } else { "\n\n" };
        content.extend_with(separator, Content { parts: vec![part] });
    }
    Ok(content)
}

impl MessagesRequest {
    /// Parse a request body.
    pub fn from_json(body: &str) -> Result<Self, RequestError> {
        serde_json::from_str(body).map_err(|error| RequestError::Malformed(error.to_string()))
    }

    /// Validate and convert.
    pub fn convert(self, options: &ConversionOptions) -> Result<ConvertedRequest, RequestError> {
        let spec = options.model(&self.model)?;
        let thinking_type = self
            .thinking
            .as_ref()
            .and_then(|t| t.get("type"))
            .and_then(Value::as_str);
        let (thinking, effort) = resolve_thinking(options.default_thinking, thinking_type, None)?;
        if self.messages.is_empty() {
            return Err(RequestError::invalid_param(
                "messages: at least one message is required",
                "messages",
            ));
        }
        let mut messages = Vec::new();
        if let Some(system) = &self.system {
            let content = match system {
                AnthropicContent::Text(text) => Content::text(text.clone()),
                AnthropicContent::Blocks(blocks) => blocks_content(
                    blocks,
                    spec.supports_images,
                    options.reject_unsupported_images,
                )?,
            };
            if !content.is_empty() {
                messages.push(Message::System {
                    content,
                    tools: None,
                });
            }
        }
        let mut open_calls: Vec<String> = Vec::new();
        for (index, message) in self.messages.iter().enumerate() {
            let blocks = match &message.content {
                AnthropicContent::Text(text) => vec![AnthropicBlock::Text { text: text.clone() }],
                AnthropicContent::Blocks(blocks) => blocks.clone(),
            };
            match message.role {
                AnthropicRole::User => {
                    let mut rest = Vec::new();
                    for block in &blocks {
                        match block {
                            AnthropicBlock::ToolResult {
                                tool_use_id,
                                content,
                            } => {
                                if !open_calls.contains(tool_use_id) {
                                    return Err(RequestError::invalid_param(
                                        format!(
                                            "messages.{index}: tool_result block(s) provided for unknown tool_use id {tool_use_id}"
                                        ),
                                        "messages",
                                    ));
                                }
                                let content = match content {
                                    None => Content::default(),
                                    Some(AnthropicContent::Text(text)) => {
                                        Content::text(text.clone())
                                    }
                                    Some(AnthropicContent::Blocks(blocks)) => blocks_content(
                                        blocks,
                                        spec.supports_images,
                                        options.reject_unsupported_images,
                                    )?,
                                };
                                messages.push(Message::Tool {
                                    content,
                                    tool_call_id: Some(tool_use_id.clone()),
                                });
                            }
                            AnthropicBlock::ToolUse { .. } | AnthropicBlock::Thinking { .. } => {
                                return Err(RequestError::invalid_param(
                                    format!(
                                        "messages.{index}: user messages cannot contain tool_use or thinking blocks"
                                    ),
                                    "messages",
                                ));
                            }
                            other => rest.push(other.clone()),
                        }
                    }
                    if !rest.is_empty() {
                        messages.push(Message::User {
                            content: blocks_content(
                                &rest,
                                spec.supports_images,
                                options.reject_unsupported_images,
                            )?,
                        });
                    }
                }
                AnthropicRole::Assistant => {
                    let mut text = String::new();
                    let mut reasoning: Option<String> = None;
                    let mut calls = Vec::new();
                    for block in &blocks {
                        match block {
                            AnthropicBlock::Text { text: t } => text.push_str(t),
                            AnthropicBlock::Thinking { thinking } => {
                                reasoning.get_or_insert_with(String::new).push_str(thinking)
                            }
                            AnthropicBlock::ToolUse { id, name, input } => calls.push(ToolCall {
                                id: id.clone(),
                                name: name.clone(),
                                arguments: input.to_string(),
                            }),
                            _ => {
                                return Err(RequestError::invalid_param(
                                    format!(
                                        "messages.{index}: assistant messages may contain text, thinking and tool_use blocks only"
                                    ),
                                    "messages",
                                ));
                            }
                        }
                    }
                    open_calls = calls.iter().map(|c| c.id.clone()).collect();
                    messages.push(Message::Assistant {
                        content: text,
                        reasoning: if thinking {
                            Some(reasoning.unwrap_or_default())
                        } else {
                            None
                        },
                        tool_calls: (!calls.is_empty()).then_some(calls),
                        prefix: false,
                    });
                }
            }
        }
        let tools = self.tools.unwrap_or_default();
        let mut definitions = Vec::new();
        for (index, tool) in tools.into_iter().enumerate() {
            validate_tool_name(&tool.name, &format!("tools.{index}"))?;
            if definitions
                .iter()
                .any(|d: &ToolDefinition| d.name == tool.name)
            {
                return Err(RequestError::invalid_param(
                    "Tool names must be unique.",
                    "tools",
                ));
            }
            definitions.push(ToolDefinition {
                name: tool.name,
                description: tool.description,
                parameters: tool.input_schema,
                strict: None,
                defer_loading: false,
            });
        }
        let choice = self.tool_choice.as_ref();
        let kind = choice
            .and_then(|c| c.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("auto");
        let tool_choice = match kind {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "any" => ToolChoice::Required,
            "tool" => {
                let name = choice
                    .and_then(|c| c.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if !definitions.iter().any(|d| d.name == name) {
                    return Err(RequestError::invalid_param(
                        format!("tool_choice: no tool named '{name}'"),
                        "tool_choice",
                    ));
                }
                definitions.retain(|d| d.name == name);
                ToolChoice::Required
            }
            other => {
                return Err(RequestError::invalid_param(
                    format!("tool_choice: unknown type '{other}'"),
                    "tool_choice",
                ));
            }
        };
        if tool_choice == ToolChoice::None {
            definitions.clear();
        }
        if tool_choice == ToolChoice::Required && thinking && !definitions.is_empty() {
            return Err(RequestError::invalid(
                "Thinking mode does not support this tool_choice",
            ));
        }
        let stop = self.stop_sequences.unwrap_or_default();
        if stop.iter().any(String::is_empty) {
            return Err(RequestError::invalid_param(
                "stop_sequences: empty string",
                "stop_sequences",
            ));
        }
        if self.temperature.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
            return Err(RequestError::invalid_param(
                "temperature: range: 0..1",
                "temperature",
            ));
        }
        let parse_tool_calls = !definitions.is_empty() && tool_choice != ToolChoice::None;
        let sampling = sampling_options(
            options,
            thinking,
            SamplingRequest {
                n: None,
                temperature: self.temperature,
                top_p: self.top_p,
                presence_penalty: None,
                frequency_penalty: None,
                logprobs: None,
                top_logprobs: None,
                max_tokens: Some(self.max_tokens),
                seed: None,
            },
            resolve_top_p(spec.format, self.top_p, thinking, parse_tool_calls),
        )?;
        let constraint = parse_tool_calls.then(|| OutputConstraint::ToolCalls {
            tools: definitions.clone(),
            required: tool_choice == ToolChoice::Required,
        });
        Ok(ConvertedRequest {
            model: self.model,
            format: spec.format,
            conversation: Conversation {
                messages,
                thinking,
                tools: definitions,
                tool_choice,
                reasoning_effort: effort,
                response_format: ResponseFormat::Text,
            },
            sampling,
            parsing: ParsingOptions {
                parse_tool_calls,
                starts_in_tool_calls: tool_choice == ToolChoice::Required && parse_tool_calls,
                parse_json_output: false,
                thinking: thinking.then_some(ThinkingStart::ReasoningStart),
                stop_sequences: stop,
            },
            constraint,
            stream: self.stream.unwrap_or(false),
            include_usage: true,
        })
    }
}

/// The Messages `stop_reason` word.
pub fn stop_reason_word(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop | FinishReason::EndOfStream | FinishReason::ContentFilter => "end_turn",
        FinishReason::ToolCalls => "tool_use",
        FinishReason::Length => "max_tokens",
        FinishReason::StopSequence => "stop_sequence",
    }
}

/// Turns parser events into Messages stream events and the complete message.
#[derive(Debug, Clone)]
pub struct MessagesStream {
    id: String,
    model: String,
    prompt: PromptUsage,
    parts: OutputParts,
    finish: Option<(FinishReason, Option<String>, CompletionUsage)>,
}

impl MessagesStream {
    /// A stream for message `id` of `model`.
    pub fn new(id: impl Into<String>, model: impl Into<String>, thinking: bool) -> Self {
        let id = id.into();
        Self {
            parts: OutputParts::new(&id, thinking),
            id,
            model: model.into(),
            prompt: PromptUsage::default(),
            finish: None,
        }
    }

    fn usage(&self, output_tokens: u32) -> Value {
        json!({
            "input_tokens": self.prompt.prompt_tokens.saturating_sub(self.prompt.cached_tokens),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.prompt.cached_tokens,
            "output_tokens": output_tokens,
            "service_tier": "standard",
        })
    }

    /// `message_start` (and `ping`): `(event name, data)` pairs.
    pub fn start(&mut self, prompt: PromptUsage) -> Vec<(&'static str, Value)> {
        self.prompt = prompt;
        vec![(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null, "usage": self.usage(0),
            }}),
        )]
    }

    fn close(&mut self, out: &mut Vec<(&'static str, Value)>) {
        if !self.parts.open {
            return;
        }
        let index = self.parts.last_index();
        if matches!(self.parts.items[index], OutPart::Reasoning(_)) {
            out.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "signature_delta", "signature": self.id}}),
            ));
        }
        out.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        self.parts.open = false;
    }

    fn open(&mut self, part: OutPart, out: &mut Vec<(&'static str, Value)>) {
        self.close(out);
        let start = match &part {
            OutPart::Reasoning(_) => json!({"type": "thinking", "thinking": "", "signature": ""}),
            OutPart::Text(_) => json!({"type": "text", "text": ""}),
            OutPart::Call { id, name, .. } => {
                json!({"type": "tool_use", "id": id, "name": name, "input": {}})
            }
        };
        self.parts.items.push(part);
        self.parts.open = true;
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": self.parts.last_index(), "content_block": start}),
        ));
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
                out.push(self.delta(json!({"type": "thinking_delta", "thinking": text})));
            }
            Event::Content(text) => {
                if !self.parts.continues(PartKind::Text) {
                    self.open(OutPart::Text(String::new()), &mut out);
                }
                self.parts.append(PartKind::Text, text);
                out.push(self.delta(json!({"type": "text_delta", "text": text})));
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
                out.push(self.delta(json!({"type": "input_json_delta", "partial_json": delta})));
            }
            Event::ToolCallEnd { .. } => {}
            Event::Finish {
                reason,
                stop_sequence,
                usage,
            } => {
                self.close(&mut out);
                self.finish = Some((*reason, stop_sequence.clone(), *usage));
                out.push((
                    "message_delta",
                    json!({"type": "message_delta",
                           "delta": {"stop_reason": stop_reason_word(*reason), "stop_sequence": stop_sequence},
                           "usage": self.usage(usage.completion_tokens)}),
                ));
                out.push(("message_stop", json!({"type": "message_stop"})));
            }
        }
        out
    }

    fn delta(&self, delta: Value) -> (&'static str, Value) {
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.parts.last_index(), "delta": delta}),
        )
    }

    /// The complete message.
    pub fn message(&self) -> Value {
        let content: Vec<Value> = self
            .parts
            .items
            .iter()
            .map(|part| match part {
                OutPart::Reasoning(text) => {
                    json!({"type": "thinking", "thinking": text, "signature": self.id})
                }
                OutPart::Text(text) => json!({"type": "text", "text": text}),
                OutPart::Call {
                    id,
                    name,
                    arguments,
                } => json!({
                    "type": "tool_use", "id": id, "name": name,
                    "input": serde_json::from_str::<Value>(arguments).unwrap_or_else(|_| json!({})),
                }),
            })
            .collect();
        let (reason, stop, usage) = self.finish.clone().unwrap_or((
            FinishReason::EndOfStream,
            None,
            CompletionUsage::default(),
        ));
        json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": content,
            "stop_reason": stop_reason_word(reason),
            "stop_sequence": stop,
            "usage": self.usage(usage.completion_tokens),
        })
    }
}
