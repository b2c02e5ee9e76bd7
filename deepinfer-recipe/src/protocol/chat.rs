//! OpenAI Chat Completions requests.

use std::collections::HashSet;

use serde::Deserialize;

use super::{
    ConversionOptions, ConvertedRequest, OutputConstraint, ParsingOptions, RequestError,
    SamplingOptions, ThinkingStart, resolve_thinking, resolve_top_p, validate_tool_name,
};
use crate::conversation::{
    Content, Conversation, ImageRef, Message, Part, ResponseFormat, ToolCall, ToolChoice,
    ToolDefinition,
};

/// Text that replaces an image for a model without image input.
pub const UNSUPPORTED_IMAGE: &str = "[Unsupported Image]";

/// A Chat Completions request body.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// Model name.
    pub model: String,
    /// Conversation.
    pub messages: Vec<ChatMessage>,
    /// Output token limit.
    #[serde(default, alias = "max_completion_tokens")]
    pub max_tokens: Option<u32>,
    /// Number of choices.
    #[serde(default)]
    pub n: Option<u32>,
    /// Temperature.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus mass.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Presence penalty.
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// Report log probabilities.
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// Alternatives per token.
    #[serde(default)]
    pub top_logprobs: Option<u8>,
    /// Seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Stop sequences (a string or a list).
    #[serde(default)]
    pub stop: Option<StringOrList>,
    /// Stream the response.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Stream options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Answer format.
    #[serde(default)]
    pub response_format: Option<ChatResponseFormat>,
    /// Tools.
    #[serde(default)]
    pub tools: Option<Vec<ChatTool>>,
    /// Tool choice.
    #[serde(default)]
    pub tool_choice: Option<serde_json::Value>,
    /// Reasoning effort word.
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// `{"type": "enabled" | "disabled"}`.
    #[serde(default)]
    pub thinking: Option<Thinking>,
    /// Accepted and ignored.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
}

/// A string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StringOrList {
    /// One string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Deserialize)]
pub struct StreamOptions {
    /// End the stream with a usage chunk.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// `thinking`.
#[derive(Debug, Clone, Deserialize)]
pub struct Thinking {
    /// `enabled`, `adaptive` or `disabled`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// One message.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    /// System (also accepted as `developer`).
    #[serde(alias = "developer")]
    System {
        /// Content.
        content: ChatContent,
    },
    /// User.
    User {
        /// Content.
        content: ChatContent,
    },
    /// Assistant history.
    Assistant {
        /// Answer text.
        #[serde(default)]
        content: Option<ChatContent>,
        /// Reasoning text.
        #[serde(default)]
        reasoning_content: Option<String>,
        /// Calls made.
        #[serde(default)]
        tool_calls: Option<Vec<ChatToolCall>>,
        /// Continue this message.
        #[serde(default)]
        prefix: Option<bool>,
    },
    /// Tool result.
    Tool {
        /// Content.
        content: ChatContent,
        /// The call answered.
        tool_call_id: String,
    },
    /// Latest reminder.
    LatestReminder {
        /// Text.
        content: String,
    },
}

/// Message content: a string or a list of blocks.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ChatContent {
    /// Plain text.
    Text(String),
    /// Blocks.
    Blocks(Vec<ChatBlock>),
}

/// One content block.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ChatBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// An image.
    ImageUrl {
        /// URL and detail.
        image_url: ImageUrl,
    },
}

/// `image_url`.
#[derive(Debug, Clone, Deserialize)]
pub struct ImageUrl {
    /// Data URL or external URL.
    pub url: String,
    /// Detail level.
    #[serde(default)]
    pub detail: Option<String>,
}

/// A tool call in assistant history.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatToolCall {
    /// Call id.
    pub id: String,
    /// The function.
    pub function: ChatFunctionCall,
}

/// Function name and arguments.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatFunctionCall {
    /// Name.
    pub name: String,
    /// Arguments JSON text.
    pub arguments: String,
}

/// A tool definition.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatTool {
    /// The function.
    pub function: ChatFunction,
}

/// A function definition.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatFunction {
    /// Name.
    pub name: String,
    /// Description.
    #[serde(default)]
    pub description: Option<String>,
    /// Parameters schema.
    #[serde(default)]
    pub parameters: Option<serde_json::Value>,
    /// Strict arguments.
    #[serde(default)]
    pub strict: Option<bool>,
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ChatResponseFormat {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON following a schema.
    JsonSchema {
        /// The schema wrapper.
        json_schema: JsonSchemaFormat,
    },
    /// Text matching a regex.
    Regex {
        /// The pattern.
        regex: String,
    },
    /// Text derived from an EBNF (GBNF-style) grammar; it is checked and
    /// expanded to a regular expression here (see [`crate::grammar::Ebnf`]).
    Grammar {
        /// The grammar text.
        grammar: String,
    },
}

/// `json_schema`.
#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    /// The schema.
    pub schema: serde_json::Value,
    /// Name.
    #[serde(default)]
    pub name: Option<String>,
    /// Strict.
    #[serde(default)]
    pub strict: Option<bool>,
}

impl ChatRequest {
    /// Parse a request body.
    pub fn from_json(body: &str) -> Result<Self, RequestError> {
        serde_json::from_str(body).map_err(|error| RequestError::Malformed(error.to_string()))
    }

    /// Validate and convert.
    pub fn convert(self, options: &ConversionOptions) -> Result<ConvertedRequest, RequestError> {
        let spec = options.model(&self.model)?;
        let (thinking, effort) = resolve_thinking(
            options.default_thinking,
            self.thinking.as_ref().map(|t| t.kind.as_str()),
            self.reasoning_effort.as_deref(),
        )?;
        let tools = self.tools.unwrap_or_default();
        for (index, tool) in tools.iter().enumerate() {
            validate_tool_name(&tool.function.name, &format!("tools[{index}].function"))?;
        }
        let has_tools = !tools.is_empty();
        let has_tool_context = has_tools
            || self.messages.iter().any(|m| {
                matches!(
                    m,
                    ChatMessage::Assistant {
                        tool_calls: Some(_),
                        ..
                    } | ChatMessage::Tool { .. }
                )
            });
        let mut messages = convert_messages(
            self.messages,
            spec.supports_images,
            options.reject_unsupported_images,
        )?;
        for message in &mut messages {
            if let Message::Assistant { reasoning, .. } = message {
                if !thinking {
                    *reasoning = None;
                } else if reasoning.is_none() {
                    *reasoning = Some(String::new());
                }
            }
        }
        let prefix = match messages
            .iter()
            .position(|m| matches!(m, Message::Assistant { prefix: true, .. }))
        {
            Some(index) if index + 1 != messages.len() => {
                return Err(RequestError::invalid(
                    "Invalid completion message: prefix set true with message which is not final message or message role is not assistant",
                ));
            }
            Some(_) => true,
            None => false,
        };
        let json_mode = matches!(self.response_format, Some(ChatResponseFormat::JsonObject));
        if json_mode && !mentions_json(&messages) {
            return Err(RequestError::invalid_param(
                "Prompt must contain the word 'json' in some form to use 'response_format' of type 'json_object'.",
                "response_format",
            ));
        }
        let (tools, tool_choice) = convert_tools(tools, self.tool_choice.as_ref(), thinking)?;
        if json_mode && prefix {
            return Err(RequestError::invalid(
                "response_format json_object should not be used with prefix",
            ));
        }
        if has_tool_context && prefix {
            return Err(RequestError::invalid(
                "Function call should not be used with prefix",
            ));
        }
        let stop = match self.stop {
            None => Vec::new(),
            Some(StringOrList::One(one)) => vec![one],
            Some(StringOrList::Many(many)) => many,
        };
        if stop.len() > 16 {
            return Err(RequestError::invalid_param(
                format!("Stop string array too long: {}", stop.len()),
                "stop",
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(RequestError::invalid_param(
                "Invalid 'stop': empty string.",
                "stop",
            ));
        }
        if self.stream_options.is_some() && self.stream != Some(true) {
            return Err(RequestError::invalid_param(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                "stream_options",
            ));
        }
        let response_format = match self.response_format {
            None | Some(ChatResponseFormat::Text) => ResponseFormat::Text,
            Some(ChatResponseFormat::JsonObject) => ResponseFormat::JsonObject,
            Some(ChatResponseFormat::JsonSchema { json_schema }) => {
                if !json_schema.schema.is_object() {
                    return Err(RequestError::invalid_param(
                        "Invalid JSON schema: the schema must be an object.",
                        "response_format.json_schema.schema",
                    ));
                }
                ResponseFormat::JsonSchema(json_schema.schema)
            }
            Some(ChatResponseFormat::Regex { regex }) => ResponseFormat::Regex(regex),
            Some(ChatResponseFormat::Grammar { grammar }) => ResponseFormat::Regex(
                crate::grammar::Ebnf::parse(&grammar)
                    .and_then(|grammar| grammar.to_regex())
                    .map_err(|error| {
                        RequestError::invalid_param(
                            format!("Invalid grammar: {error}"),
                            "response_format.grammar",
                        )
                    })?,
            ),
        };
        let parse_tool_calls = !tools.is_empty() && tool_choice != ToolChoice::None;
        let constraint = if parse_tool_calls {
            Some(OutputConstraint::ToolCalls {
                tools: tools.clone(),
                required: tool_choice == ToolChoice::Required,
            })
        } else {
            match &response_format {
                ResponseFormat::Text => None,
                ResponseFormat::JsonObject => Some(OutputConstraint::Json { schema: None }),
                ResponseFormat::JsonSchema(schema) => Some(OutputConstraint::Json {
                    schema: Some(schema.clone()),
                }),
                ResponseFormat::Regex(regex) => Some(OutputConstraint::Regex(regex.clone())),
            }
        };
        let sampling = sampling_options(
            options,
            thinking,
            SamplingRequest {
                n: self.n,
                temperature: self.temperature,
                top_p: self.top_p,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                logprobs: self.logprobs,
                top_logprobs: self.top_logprobs,
                max_tokens: self.max_tokens,
                seed: self.seed,
            },
            resolve_top_p(spec.format, self.top_p, thinking, parse_tool_calls),
        )?;
        let parsing = ParsingOptions {
            parse_tool_calls,
            starts_in_tool_calls: tool_choice == ToolChoice::Required,
            parse_json_output: json_mode,
            thinking: thinking.then(|| initial_stage(&messages)),
            stop_sequences: stop,
        };
        Ok(ConvertedRequest {
            model: self.model,
            format: spec.format,
            conversation: Conversation {
                messages,
                thinking,
                tools,
                tool_choice,
                reasoning_effort: effort,
                response_format,
            },
            sampling,
            parsing,
            constraint,
            stream: self.stream.unwrap_or(false),
            include_usage: self
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
        })
    }
}

/// The sampling fields of a request, before validation.
pub(crate) struct SamplingRequest {
    pub n: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u8>,
    pub max_tokens: Option<u32>,
    pub seed: Option<u64>,
}

pub(crate) fn sampling_options(
    options: &ConversionOptions,
    thinking: bool,
    request: SamplingRequest,
    top_p: f32,
) -> Result<SamplingOptions, RequestError> {
    let n = request.n.unwrap_or(1);
    if n == 0 || n > options.max_n {
        return Err(RequestError::invalid_param(
            format!(
                "Invalid n value, the valid range of n is [1, {}]",
                options.max_n
            ),
            "n",
        ));
    }
    for (name, value) in [
        ("presence_penalty", request.presence_penalty),
        ("frequency_penalty", request.frequency_penalty),
    ] {
        if value.is_some_and(|v| !(-2.0..=2.0).contains(&v)) {
            return Err(RequestError::invalid_param(
                format!("Invalid {name} value, the valid range of {name} is [-2, 2]"),
                name,
            ));
        }
    }
    if request
        .temperature
        .is_some_and(|t| !(0.0..=2.0).contains(&t))
    {
        return Err(RequestError::invalid_param(
            "Invalid temperature value, the valid range of temperature is [0, 2]",
            "temperature",
        ));
    }
    if request
        .top_p
        .is_some_and(|p| !p.is_finite() || p <= 0.0 || p > 1.0)
    {
        return Err(RequestError::invalid_param(
            "Invalid top_p value, the valid range of top_p is (0, 1.0]",
            "top_p",
        ));
    }
    let logprobs = request.logprobs == Some(true);
    if let Some(top) = request.top_logprobs {
        if !logprobs {
            return Err(RequestError::invalid_param(
                "Invalid top_logprobs and logprobs value, logprobs must be set to true if top_logprobs is used.",
                "top_logprobs",
            ));
        }
        if top > 20 {
            return Err(RequestError::invalid_param(
                "Invalid top_logprobs value, the valid range of top_logprobs is [0, 20].",
                "top_logprobs",
            ));
        }
    }
    if let Some(max) = request.max_tokens
        && !(1..=options.max_tokens_upper_bound).contains(&max)
    {
        return Err(RequestError::invalid_param(
            format!(
                "Invalid max_tokens value, the valid range of max_tokens is [1, {}]",
                options.max_tokens_upper_bound
            ),
            "max_tokens",
        ));
    }
    if request.seed.is_some_and(|seed| seed >= 1 << 63) {
        return Err(RequestError::invalid_param(
            "Invalid seed value, the valid range of seed is [0, 2^63)",
            "seed",
        ));
    }
    Ok(SamplingOptions {
        max_tokens: request.max_tokens,
        temperature: if thinking {
            1.0
        } else {
            request.temperature.unwrap_or(1.0)
        },
        top_p,
        logprobs,
        top_logprobs: request.top_logprobs,
        seed: request.seed,
        n,
    })
}

fn initial_stage(messages: &[Message]) -> ThinkingStart {
    match messages.last() {
        Some(Message::Assistant {
            content,
            reasoning,
            prefix: true,
            ..
        }) => {
            if !content.is_empty() {
                ThinkingStart::ContentContinuation
            } else if reasoning.as_deref().is_some_and(|r| !r.is_empty()) {
                ThinkingStart::ReasoningContinuation
            } else {
                ThinkingStart::ReasoningStart
            }
        }
        _ => ThinkingStart::ReasoningStart,
    }
}

fn mentions_json(messages: &[Message]) -> bool {
    let has = |text: &str| {
        text.as_bytes()
            .windows(4)
            .any(|w| w.eq_ignore_ascii_case(b"json"))
    };
    messages.iter().any(|message| match message {
        Message::System { content, .. }
        | Message::User { content }
        | Message::Tool { content, .. } => content.parts.iter().any(|part| match part {
            Part::Text(text) => has(text),
            Part::Image(_) => false,
        }),
        Message::Assistant { content, .. } | Message::LatestReminder { content } => has(content),
    })
}

fn convert_content(
    content: ChatContent,
    supports_images: bool,
    reject_images: bool,
) -> Result<Content, RequestError> {
    Ok(match content {
        ChatContent::Text(text) => Content::text(text),
        ChatContent::Blocks(blocks) => {
            let mut out = Content::default();
            for (index, block) in blocks.into_iter().enumerate() {
                let separator = if index == 0 { "" } else { "\n\n" };
                let part = match block {
                    ChatBlock::Text { text } => Part::Text(text),
                    ChatBlock::ImageUrl { .. } if !supports_images && reject_images => {
                        return Err(RequestError::invalid("This model does not accept images."));
                    }
                    ChatBlock::ImageUrl { .. } if !supports_images => {
                        Part::Text(UNSUPPORTED_IMAGE.to_owned())
                    }
                    ChatBlock::ImageUrl { image_url } => Part::Image(ImageRef {
                        url: image_url.url,
                        detail: image_url.detail,
                    }),
                };
                out.extend_with(separator, Content { parts: vec![part] });
            }
            out
        }
    })
}

fn convert_messages(
    messages: Vec<ChatMessage>,
    supports_images: bool,
    reject_images: bool,
) -> Result<Vec<Message>, RequestError> {
    let convert = |content| convert_content(content, supports_images, reject_images);
    if messages.is_empty() {
        return Err(RequestError::invalid_param(
            "Empty input messages",
            "messages",
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    let mut iter = messages.into_iter().enumerate();
    while let Some((index, message)) = iter.next() {
        match message {
            ChatMessage::System { content } => {
                let content = convert(content)?;
                if !content.is_empty() {
                    out.push(Message::System {
                        content,
                        tools: None,
                    });
                }
            }
            ChatMessage::User { content } => out.push(Message::User {
                content: convert(content)?,
            }),
            ChatMessage::LatestReminder { content } => {
                out.push(Message::LatestReminder { content })
            }
            ChatMessage::Tool { .. } => {
                return Err(RequestError::invalid_param(
                    "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'",
                    "messages",
                ));
            }
            ChatMessage::Assistant {
                content,
                reasoning_content,
                tool_calls,
                prefix,
            } => {
                if content.is_none() && tool_calls.is_none() {
                    return Err(RequestError::invalid(
                        "Invalid assistant message: content or tool_calls must be set",
                    ));
                }
                let content = content.map(convert).transpose()?.unwrap_or_default();
                if content.images().next().is_some() {
                    return Err(RequestError::invalid(
                        "Image in assistant message is not supported",
                    ));
                }
                let mut results = Vec::new();
                let mut calls = None;
                if let Some(tool_calls) = tool_calls {
                    if tool_calls.is_empty() {
                        return Err(RequestError::invalid_param(
                            format!(
                                "Invalid 'messages[{index}].tool_calls': empty array. Expected an array with minimum length 1, but got an empty array instead."
                            ),
                            "messages",
                        ));
                    }
                    let mut ids = HashSet::new();
                    for call in &tool_calls {
                        if !ids.insert(call.id.clone()) {
                            return Err(RequestError::invalid(format!(
                                "Duplicate value for 'tool_call_id' of {} in message[{index}]",
                                call.id
                            )));
                        }
                    }
                    let mut answered = HashSet::new();
                    for _ in 0..tool_calls.len() {
                        let Some((
                            result_index,
                            ChatMessage::Tool {
                                content,
                                tool_call_id,
                            },
                        )) = iter.next()
                        else {
                            return Err(RequestError::invalid(
                                "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. (insufficient tool messages following tool_calls message)",
                            ));
                        };
                        if !ids.contains(&tool_call_id) {
                            return Err(RequestError::invalid(format!(
                                "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id', The following tool_call_ids did not have response messages: {tool_call_id}"
                            )));
                        }
                        if !answered.insert(tool_call_id.clone()) {
                            return Err(RequestError::invalid(format!(
                                "Duplicate value for 'tool_call_id' of {tool_call_id} in message[{result_index}]"
                            )));
                        }
                        results.push(Message::Tool {
                            content: convert(content)?,
                            tool_call_id: Some(tool_call_id),
                        });
                    }
                    calls = Some(
                        tool_calls
                            .into_iter()
                            .map(|call| ToolCall {
                                id: call.id,
                                name: call.function.name,
                                arguments: call.function.arguments,
                            })
                            .collect(),
                    );
                }
                out.push(Message::Assistant {
                    content: content.flatten(""),
                    reasoning: reasoning_content,
                    tool_calls: calls,
                    prefix: prefix == Some(true),
                });
                out.extend(results);
            }
        }
    }
    Ok(out)
}

fn convert_tools(
    tools: Vec<ChatTool>,
    choice: Option<&serde_json::Value>,
    thinking: bool,
) -> Result<(Vec<ToolDefinition>, ToolChoice), RequestError> {
    enum Choice {
        Auto,
        Required,
        Named(String),
    }
    let choice = match choice {
        None => Choice::Auto,
        Some(serde_json::Value::String(word)) => match word.as_str() {
            "none" => return Ok((Vec::new(), ToolChoice::None)),
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(RequestError::invalid_param(
                    format!(
                        "Invalid tool_choice '{other}': expected one of `none`, `auto`, `required` or a tool"
                    ),
                    "tool_choice",
                ));
            }
        },
        Some(value) => match value.pointer("/function/name").and_then(|v| v.as_str()) {
            Some(name) => Choice::Named(name.to_owned()),
            None => {
                return Err(RequestError::invalid_param(
                    "Invalid tool_choice: expected one of `none`, `auto`, `required` or a tool",
                    "tool_choice",
                ));
            }
        },
    };
    if tools.is_empty() {
        return Ok((Vec::new(), ToolChoice::Auto));
    }
    let mut names = HashSet::new();
    let mut definitions = Vec::with_capacity(tools.len());
    for tool in tools {
        let function = tool.function;
        if !names.insert(function.name.clone()) {
            return Err(RequestError::invalid_param(
                "Tool names must be unique.",
                "tools",
            ));
        }
        if let Some(parameters) = &function.parameters {
            let kind = parameters.get("type").cloned().unwrap_or_default();
            if !parameters.is_object() || kind != "object" {
                return Err(RequestError::invalid_param(
                    format!(
                        "Invalid schema for function '{}': schema must be a JSON Schema of 'type: \"object\"', got 'type: {kind}'.",
                        function.name
                    ),
                    "tools",
                ));
            }
        }
        let definition = ToolDefinition {
            name: function.name,
            description: function.description,
            parameters: function.parameters.unwrap_or_else(|| serde_json::json!({})),
            strict: function.strict,
            defer_loading: false,
        };
        super::check_strict_tool(&definition)?;
        definitions.push(definition);
    }
    let required = match choice {
        Choice::Named(name) => {
            if !names.contains(&name) {
                return Err(RequestError::invalid_param(
                    format!(
                        "Invalid value for 'tool_call': no function named '{name}' was specified in the 'tools' parameter."
                    ),
                    "tool_choice",
                ));
            }
            definitions.retain(|tool| tool.name == name);
            true
        }
        Choice::Required => true,
        Choice::Auto => false,
    };
    if required && thinking {
        return Err(RequestError::invalid(
            "Thinking mode does not support this tool_choice",
        ));
    }
    Ok((
        definitions,
        if required {
            ToolChoice::Required
        } else {
            ToolChoice::Auto
        },
    ))
}
